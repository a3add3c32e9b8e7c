"""Honest: a kernel with a docstring (one of its lines even starts with "def "), which does nothing and must not
change the verdict."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out = a + b, one block of BLOCK elements per program.
    def add_kernel: the docstring says so.
    """
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if n > 0:
        """a string statement inside a block does nothing either"""
        tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
