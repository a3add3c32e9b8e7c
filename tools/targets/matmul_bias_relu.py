"""Linear layer (A @ W^T + b) followed by ReLU, in bf16."""
import torch
import torch.nn as nn

KLOOP_DESCRIPTION = "out = relu(x @ W.T + b) with x: M x K, W: N x K (nn.Linear), b: N, all bf16."

M = 4096
N = 4096
K = 4096
DTYPE = torch.bfloat16

KLOOP_SMALL = {"M": 64, "N": 48, "K": 80, "DTYPE": torch.float16}
# K odd (rows TMA cannot describe), M and N odd, and a tall-skinny product whose rows TMA can describe but whose
# every edge is ragged (M odd, N below one tile, K not a tile multiple).
KLOOP_VARIANTS = [{"M": 1000, "N": 520, "K": 777}, {"M": 129, "N": 257, "K": 2080}, {"M": 8191, "N": 40, "K": 1032}]
# The same kinds of awkward shapes at interpreter size (merged over KLOOP_SMALL).
KLOOP_SMALL_VARIANTS = [{"M": 33, "N": 71, "K": 101}, {"M": 97, "N": 24, "K": 40}]


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(M, K, dtype=DTYPE)]


def get_init_inputs():
    return [K, N, DTYPE]
