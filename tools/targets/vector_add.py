"""Elementwise sum of two fp32 vectors."""
import torch
import torch.nn as nn

KLOOP_DESCRIPTION = "out = a + b for two fp32 vectors of N elements (memory bound: 12 bytes per element)."

N = 2**26

KLOOP_SMALL = {"N": 4096}
# A length with a ragged tail (not a multiple of 4 or of any block) and a short one.
KLOOP_VARIANTS = [{"N": 2**20 + 3}, {"N": 1000}]
# The same kinds of awkward shapes at interpreter size (merged over KLOOP_SMALL).
KLOOP_SMALL_VARIANTS = [{"N": 5003}, {"N": 3}]


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
