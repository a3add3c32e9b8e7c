"""KernelBench-style 3-D average pooling with a 27-element window and stride 2 (Inductor leaves that to ATen)."""
import torch
import torch.nn as nn

batch_size = 2
channels = 8
depth = 12
height = 10
width = 14
kernel_size = 3
stride = 2
padding = 1


class Model(nn.Module):
    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.AvgPool3d(kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch_size, channels, depth, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]
