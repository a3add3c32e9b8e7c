"""A KernelBench-style target: softmax over rows, small enough for the interpreter."""
import torch
import torch.nn as nn

batch_size = 24
dim = 200


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
