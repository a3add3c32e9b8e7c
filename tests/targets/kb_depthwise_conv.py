"""KernelBench-style depthwise conv2d: groups is the channel count, so the hidden variants change it too."""
import torch
import torch.nn as nn

batch_size = 4
in_channels = 24
height = 20
width = 18
kernel_size = 3


class Model(nn.Module):
    def __init__(self, in_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, in_channels, kernel_size, padding=1, groups=in_channels, bias=False)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, kernel_size]
