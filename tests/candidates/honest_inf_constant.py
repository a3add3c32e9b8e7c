"""Honest: module constants computed where they are defined, one of them not finite (float("-inf"), as a softmax's
masked lanes take), and a parameter named like a builtin."""
import math

import torch
import triton
import triton.language as tl

NEG_INF = tl.constexpr(float("-inf"))
ONE = tl.constexpr(math.exp(0.0))


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=NEG_INF)
    tl.store(out_ptr + offs, a * ONE + tl.load(b_ptr + offs, mask=mask, other=0.0), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, input, other):
        out = torch.empty_like(input)
        add_kernel[(triton.cdiv(input.numel(), 1024),)](input, other, out, input.numel(), BLOCK=1024)
        return out
