"""KernelBench level 2's 14 in small: a GEMM summed over its columns, (x @ W.T / 2).sum(1) * 1.5. The sum's terms
cancel, so another summation order (x @ W.sum(0)) can sit beyond the tolerance of the reference and only luckily
less near the float64 truth; lower precision sits far beyond both."""
import torch
import torch.nn as nn

batch_size = 64
input_size = 512
hidden_size = 1024
scaling_factor = 1.5


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, scaling_factor):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(hidden_size, input_size))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = torch.matmul(x, self.weight.T) / 2
        return torch.sum(x, dim=1, keepdim=True) * self.scaling_factor


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, scaling_factor]
