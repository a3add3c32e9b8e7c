"""Inaccurate: tanh as 1 - 2 / (exp(2x) + 1) with libdevice's fast exponential, as some fused activation kernels
write it. Right to a few ulp where |x| is near 1, but for small x the subtraction from 1 cancels: relative error
~1e-7 / |x|, far beyond float32's on small inputs (both devices say incorrect there)."""
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
