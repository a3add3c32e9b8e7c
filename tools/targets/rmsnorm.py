"""RMSNorm over the last dimension of an fp32 matrix, with a learnable weight."""
import torch
import torch.nn as nn

KLOOP_DESCRIPTION = "out = x * rsqrt(mean(x**2, -1) + 1e-6) * weight for an fp32 ROWS x COLS matrix."

ROWS = 8192
COLS = 8192
EPS = 1e-6

KLOOP_SMALL = {"ROWS": 64, "COLS": 1000}
KLOOP_VARIANTS = [{"ROWS": 37, "COLS": 3001}, {"ROWS": 130, "COLS": 200}, {"ROWS": 3, "COLS": 8192}]
# The same kinds of awkward shapes at interpreter size (merged over KLOOP_SMALL).
KLOOP_SMALL_VARIANTS = [{"ROWS": 5, "COLS": 301}, {"ROWS": 3, "COLS": 4099}]


class Model(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        # Non-trivial weight, so a kernel that ignores it cannot pass.
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [COLS, EPS]
