"""Reduction: the mean over one dimension of a 3-D tensor."""
import torch
import torch.nn as nn

batch_size = 8
dim1 = 96
dim2 = 40
reduce_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mean(x, dim=self.dim)


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
