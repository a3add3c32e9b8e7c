"""KernelBench-style ReLU on torch.rand inputs: on [0, 1) ReLU is the identity, so only inputs spread below 0
tell a ReLU from a copy."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1536


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
