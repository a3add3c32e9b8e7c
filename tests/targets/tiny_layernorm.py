"""A KernelBench-style target: LayerNorm over the last three dimensions, with its affine parameters."""
import torch
import torch.nn as nn

batch_size = 4
features = 8
dim1 = 16
dim2 = 12


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)
        with torch.no_grad():  # parameters that are not the identity, so a kernel must read them
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.ln(x)


def get_inputs():
    return [torch.rand(batch_size, features, dim1, dim2) * 3 + 1]


def get_init_inputs():
    return [(features, dim1, dim2)]
