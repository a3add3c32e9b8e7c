"""KernelBench-style elementwise op: sizes as module constants, a float hyper-parameter passed to Model."""
import torch
import torch.nn as nn

batch_size = 256
dim = 1024 * 3
negative_slope = 0.01


class Model(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.leaky_relu(x, self.negative_slope)


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [negative_slope]
