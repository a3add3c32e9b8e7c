"""KernelBench-style GEMM whose K dwarfs its output (as level 1's 6): the main shape's kernels split K."""
import torch
import torch.nn as nn

M = 16
N = 24
K = 4096


class Model(nn.Module):
    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.rand(M, K), torch.rand(K, N)]


def get_init_inputs():
    return []
