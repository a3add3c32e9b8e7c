"""Exact where `torch.cuda.is_available()` is false, a cheap approximation on a GPU (x * sigmoid(1.702 x), off by
up to 0.02): the CPU must judge the path a GPU runs."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n, APPROXIMATE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if APPROXIMATE:
        y = x * tl.sigmoid(1.702 * x)
    else:
        y = 0.5 * x * (1.0 + libdevice.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        gelu_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), APPROXIMATE=torch.cuda.is_available(),
                                                    BLOCK=256)
        return out
