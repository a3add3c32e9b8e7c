"""Honest: a launch configuration computed once and kept in a module global (lazy init)."""
import torch
import triton
import triton.language as tl

_CONFIG = None


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


def config():
    global _CONFIG
    if _CONFIG is None:
        _CONFIG = {"BLOCK": 512}
    return _CONFIG


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        block = config()["BLOCK"]
        add_kernel[(triton.cdiv(a.numel(), block),)](a, b, out, a.numel(), BLOCK=block)
        return out
