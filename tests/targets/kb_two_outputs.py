"""KernelBench-style, two outputs: x + 1 and 2x (256 MiB each at full size)."""
import torch
import torch.nn as nn

batch_size = 4096
dim = 16384


class Model(nn.Module):
    def forward(self, x: torch.Tensor):
        return x + 1, x * 2


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
