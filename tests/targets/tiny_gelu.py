"""A KernelBench-style target: exact GELU (with erf), small enough for the interpreter."""
import torch
import torch.nn as nn

batch_size = 16
dim = 96


class Model(nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
