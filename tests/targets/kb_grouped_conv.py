"""KernelBench-style grouped, strided conv2d: in_channels is read by both get_inputs and Model, out_channels only by
Model; channels must stay divisible by groups and the input larger than the kernel."""
import torch
import torch.nn as nn

batch_size = 16
in_channels = 32
out_channels = 96
height = 64
width = 48
kernel_size = 3
stride = 2
padding = 1
groups = 4


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=padding, groups=groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, padding, groups]
