"""KernelBench-style comparison with a bool output: x > 0."""
import torch
import torch.nn as nn

N = 8192


class Model(nn.Module):
    def forward(self, x):
        return x > 0


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
