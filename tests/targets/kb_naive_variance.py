"""KernelBench-style row variance, written the way that loses precision: E[x^2] - E[x]^2 in float32 on inputs far from
0. The reference itself is a few tolerances off the exact variance; an accurate kernel must not be refused for that."""
import torch
import torch.nn as nn

batch_size = 64
dim = 4096


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * x).mean(dim=1) - x.mean(dim=1) ** 2


def get_inputs():
    return [30 + torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
