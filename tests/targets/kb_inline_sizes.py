"""KernelBench-style op whose sizes are written inline in get_inputs: nothing to derive shapes from."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x)


def get_inputs():
    return [torch.randn(64, 1000)]


def get_init_inputs():
    return []
