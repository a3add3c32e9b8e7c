"""Dense matrix product in bf16 (fp32 accumulation expected)."""
import torch
import torch.nn as nn

KLOOP_DESCRIPTION = "out = A @ B with A: M x K and B: K x N in bf16 (compute bound; tensor cores)."

M = 8192
N = 8192
K = 8192
DTYPE = torch.bfloat16

# The Triton interpreter has no bf16: the CPU-sized problem runs in fp16.
KLOOP_SMALL = {"M": 64, "N": 48, "K": 80, "DTYPE": torch.float16}
# Edges that do not fill a tile in any of M, N or K: K odd (rows TMA cannot describe), M and N odd, and a tall-skinny
# product whose rows TMA can describe but whose every edge is ragged (M odd, N below one tile, K not a tile multiple).
KLOOP_VARIANTS = [{"M": 1000, "N": 520, "K": 777}, {"M": 129, "N": 257, "K": 4160}, {"M": 8191, "N": 40, "K": 1032}]
# The same kinds of awkward shapes at interpreter size (merged over KLOOP_SMALL).
KLOOP_SMALL_VARIANTS = [{"M": 33, "N": 71, "K": 101}, {"M": 97, "N": 24, "K": 40}]


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def get_inputs():
    return [torch.randn(M, K, dtype=DTYPE), torch.randn(K, N, dtype=DTYPE)]


def get_init_inputs():
    return []
