"""A KernelBench-style target: a linear layer (weights made in __init__ from the seeded generator)."""
import torch
import torch.nn as nn

batch_size = 8
in_features = 48
out_features = 40


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
