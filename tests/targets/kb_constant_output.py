"""KernelBench-style degenerate op (like level 2's 80): a row's maximum minus itself, zero for every input. A kernel
writing zeros computes it; kloop says the target is degenerate and reports no speedup."""
import torch
import torch.nn as nn

batch_size = 32
dim = 512


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        top = x.max(dim=1, keepdim=True).values
        return (top - top) * x


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
