"""Honest: libdevice's erf imported by name through a fallback chain of imports (the libdevice Triton dispatches,
else the CUDA one), called as erf(x), as Liger-Kernel writes its tanh and rsqrt."""
import torch
import triton
import triton.language as tl

try:
    from triton.language.extra.libdevice import erf
except ModuleNotFoundError:
    from triton.language.extra.cuda.libdevice import erf


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, 0.5 * x * (1.0 + erf(x * 0.7071067811865476)), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        gelu_kernel[(triton.cdiv(x.numel(), 512),)](x, out, x.numel(), BLOCK=512)
        return out
