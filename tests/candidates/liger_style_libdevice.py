"""Honest: libdevice's erf imported by name, as Liger-Kernel and Unsloth write it (Triton's compiler reads it; the
interpreter executor gets it written out from triton). Named apart from honest_*: the static rules refuse the import
until they accept the idiom, so its test bypasses them."""
import torch
import triton
import triton.language as tl
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
        gelu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        return out
