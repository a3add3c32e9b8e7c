"""KernelBench-style fused op: a strided, padded 2-D transposed convolution (output padding, bias), then GELU and a
scale. Channels are read by get_inputs and Model alike, so the hidden variants change the weights' shape too."""
import torch
import torch.nn as nn

batch_size = 4
in_channels = 16
out_channels = 24
height = 12
width = 10
kernel_size = 3
scale = 0.5


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, scale):
        super().__init__()
        self.conv = nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=2, padding=1, output_padding=1)
        self.scale = scale

    def forward(self, x):
        return torch.nn.functional.gelu(self.conv(x)) * self.scale


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, scale]
