"""KernelBench-style fp32 Linear followed by softmax over its features: small outputs (~1/out_features), so a
fixed atol of 1e-4 hides a GEMM done in coarser arithmetic."""
import torch
import torch.nn as nn

batch_size = 64
in_features = 256
out_features = 512


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.linear(x), dim=1)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
