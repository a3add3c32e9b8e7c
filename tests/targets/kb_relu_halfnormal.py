"""KernelBench-style ReLU on |randn| inputs: non-negative but not in [0, 1), so a copy passes every trial on the
target's own inputs."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1536


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.randn(batch_size, dim).abs()]


def get_init_inputs():
    return []
