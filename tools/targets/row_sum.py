"""Sum of each row of an fp32 matrix."""
import torch
import torch.nn as nn

KLOOP_DESCRIPTION = "out = x.sum(dim=-1) for an fp32 ROWS x COLS matrix (ROWS outputs)."

ROWS = 8192
COLS = 8192

KLOOP_SMALL = {"ROWS": 64, "COLS": 1000}
# COLS 3001 makes rows start off 16-byte alignment, which vectorized kernels must handle.
KLOOP_VARIANTS = [{"ROWS": 37, "COLS": 3001}, {"ROWS": 130, "COLS": 200}, {"ROWS": 3, "COLS": 8192}]
# The same kinds of awkward shapes at interpreter size (merged over KLOOP_SMALL).
KLOOP_SMALL_VARIANTS = [{"ROWS": 5, "COLS": 301}, {"ROWS": 3, "COLS": 4099}]


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
