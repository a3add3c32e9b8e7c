"""KernelBench-style ReLU on rand() - 1 inputs: all non-positive, so a kernel writing zeros passes every trial on the
target's own inputs."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1536


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.rand(batch_size, dim) - 1]


def get_init_inputs():
    return []
