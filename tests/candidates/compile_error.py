"""Broken: the Triton kernel does not compile (undefined name inside the kernel)."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(a_ptr + offs) + undefined_name, mask=offs < n)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, out, a.numel(), BLOCK=1024)
        return out
