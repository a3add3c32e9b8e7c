"""Honest: the activation is a @triton.jit function passed to the kernel as a constexpr argument (Triton specializes
on it), exact GELU through libdevice."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def gelu(x):
    return 0.5 * x * (1.0 + libdevice.erf(x * 0.7071067811865476))


@triton.jit
def act_kernel(x_ptr, out_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, ACT(tl.load(x_ptr + offs, mask=mask)), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        act_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), ACT=gelu, BLOCK=256)
        return out
