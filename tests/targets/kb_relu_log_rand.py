"""KernelBench-style op whose output is 0 on the target's own inputs: relu(log(x)) of torch.rand draws (log < 0 on
[0, 1)). Only inputs above 1 (the positive input family) tell the op from a kernel that writes zeros."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1536


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.log(x))


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
