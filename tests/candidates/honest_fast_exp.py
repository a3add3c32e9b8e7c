"""Honest: tanh from libdevice's fast exponential (__expf: ex2.approx, a few ulp), as fused activation kernels
write it."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 1.0 - 2.0 / (libdevice.fast_expf(2.0 * x) + 1.0), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        tanh_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        return out
