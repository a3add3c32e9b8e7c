"""KernelBench-style in-place ReLU (as many level-3 networks write it): the reference changes its own input."""
import torch
import torch.nn as nn

N = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(x)


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
