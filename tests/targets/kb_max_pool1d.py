"""KernelBench-style 1-D max pooling with padding and dilation (ATen's max_pool1d reads the length as an int)."""
import torch
import torch.nn as nn

batch_size = 8
features = 12
sequence_length = 200
kernel_size = 4
stride = 2
padding = 2
dilation = 3


class Model(nn.Module):
    def __init__(self, kernel_size, stride, padding, dilation):
        super().__init__()
        self.pool = nn.MaxPool1d(kernel_size, stride=stride, padding=padding, dilation=dilation)

    def forward(self, x):
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch_size, features, sequence_length)]


def get_init_inputs():
    return [kernel_size, stride, padding, dilation]
