"""KernelBench-style InstanceNorm2d: the module is built for `features` channels, which the hidden variants change."""
import torch
import torch.nn as nn

batch_size = 4
features = 12
dim1 = 16
dim2 = 20


class Model(nn.Module):
    def __init__(self, num_features):
        super().__init__()
        self.norm = nn.InstanceNorm2d(num_features=num_features)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.rand(batch_size, features, dim1, dim2) * 2 + 1]


def get_init_inputs():
    return [features]
