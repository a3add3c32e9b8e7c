"""KernelBench-style BatchNorm2d. KernelBench runs the reference in training mode (it never calls .eval()), so the
output is normalized with the batch's own statistics; with rand inputs in [0, 1) an identity would pass in eval mode."""
import torch
import torch.nn as nn

batch_size = 8
features = 16
dim1 = 32
dim2 = 32


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def get_inputs():
    return [torch.rand(batch_size, features, dim1, dim2)]


def get_init_inputs():
    return [features]
