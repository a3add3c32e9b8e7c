"""Coarser than fp32: libdevice.fast_tanhf is tanh.approx.f32 on a GPU (relative error up to 2^-11). The CPU
interpreter computed it exactly and credited it; the GPU's error must show on the CPU too."""
import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, libdevice.fast_tanhf(tl.load(x_ptr + offs, mask=mask)), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        tanh_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        return out
