"""Exact (erf) GELU of an fp32 vector."""
import torch
import torch.nn as nn
import torch.nn.functional as F

KLOOP_DESCRIPTION = "out = gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2))) (torch's default, exact erf form) on N fp32 elements."

N = 2**26

KLOOP_SMALL = {"N": 4096}
KLOOP_VARIANTS = [{"N": 2**20 + 3}, {"N": 1001}]
# The same kinds of awkward shapes at interpreter size (merged over KLOOP_SMALL).
KLOOP_SMALL_VARIANTS = [{"N": 5003}, {"N": 3}]


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)


def get_inputs():
    # Scaled so the inputs also reach the tails of erf, where approximations go wrong.
    return [torch.randn(N) * 3.0]


def get_init_inputs():
    return []
