"""KernelBench-style matrix-vector product (as level 1's 4), written with the @ operator."""
import torch
import torch.nn as nn

M = 96
K = 8192


class Model(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return A @ B


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, 1)]


def get_init_inputs():
    return []
