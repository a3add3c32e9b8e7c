"""LayerNorm over the last dimension of an fp32 matrix, with learnable weight and bias."""
import torch
import torch.nn as nn

KLOOP_DESCRIPTION = "out = nn.LayerNorm(COLS, eps=1e-5)(x) for an fp32 ROWS x COLS matrix (weight and bias learnable)."

ROWS = 8192
COLS = 8192
EPS = 1e-5

KLOOP_SMALL = {"ROWS": 64, "COLS": 1000}
KLOOP_VARIANTS = [{"ROWS": 37, "COLS": 3001}, {"ROWS": 130, "COLS": 200}, {"ROWS": 3, "COLS": 8192}]
# The same kinds of awkward shapes at interpreter size (merged over KLOOP_SMALL).
KLOOP_SMALL_VARIANTS = [{"ROWS": 5, "COLS": 301}, {"ROWS": 3, "COLS": 4099}]


class Model(nn.Module):
    def __init__(self, normalized_shape: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape, eps=eps)
        # Non-trivial affine parameters, so a kernel that ignores them cannot pass.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(ROWS, COLS) * 2.0 + 0.5]


def get_init_inputs():
    return [COLS, EPS]
