"""KernelBench-style HardTanh on torch.rand inputs: the identity on [-1, 1), so inputs spread only to [-1, 1) would
not tell it from a copy."""
import torch
import torch.nn as nn

batch_size = 64
dim = 1536


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.hardtanh(x, min_val=-1.0, max_val=1.0)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
