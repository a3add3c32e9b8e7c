"""Honest: libdevice reached as tl.extra.cuda.libdevice (no import of its own), as Triton's tutorials write it."""
import torch
import triton
import triton.language as tl


@triton.jit
def erfinv_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.extra.cuda.libdevice.erfinv(tl.load(x_ptr + offs, mask=mask)), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        erfinv_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
