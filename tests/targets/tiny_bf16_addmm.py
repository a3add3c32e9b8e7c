"""A KernelBench-style target in bf16: out = a @ b + c (the product rounded to bf16, then the sum), small enough for
the interpreter."""
import torch
import torch.nn as nn

M = 32
K = 64
N = 48


class Model(nn.Module):
    def forward(self, a, b, c):
        return a @ b + c


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16),
            torch.randn(M, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
