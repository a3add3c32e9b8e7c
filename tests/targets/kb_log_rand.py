"""KernelBench-style op whose domain is positive: log of torch.rand inputs (negative inputs make the reference NaN:
those elements are masked, and the all-negative family is skipped)."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1536


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x + 1e-3) * 0.5


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
