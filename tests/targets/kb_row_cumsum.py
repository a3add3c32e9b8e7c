"""KernelBench-style scan: the row length sits in an int tuple; `dim` is an axis, only ever passed to Model."""
import torch
import torch.nn as nn

batch_size = 512
input_shape = (3000,)
dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return [dim]
