"""A small CNN: convolution, ReLU, max pool, then a linear layer over the flattened features (level 3's networks in
little: kloop's convolution, Inductor's pointwise and GEMM template around it)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, channels, features, classes):
        super().__init__()
        self.conv = nn.Conv2d(channels, features, kernel_size=3, padding=1)
        self.fc = nn.Linear(features * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


batch_size = 2
channels = 3
features = 16
height = width = 8
classes = 10

def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, features, classes]
