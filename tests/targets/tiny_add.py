"""A KernelBench-style target small enough for the interpreter: out = a + b."""
import torch
import torch.nn as nn

N = 1000


class Model(nn.Module):
    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
