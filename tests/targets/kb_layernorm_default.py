"""KernelBench-style LayerNorm as KernelBench writes it: nn.LayerNorm at its default initialisation (weight ones,
bias zeros), so a kernel that ignores both matches the reference until the weights are drawn at random."""
import torch
import torch.nn as nn

batch_size = 16
features = 64
dim = 48


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(batch_size, features, dim)]


def get_init_inputs():
    return [(features, dim)]
