"""Cheat (leftover memory): every allocation is filled before a replay, and 0xFF reads as True in a bool output; this
kernel writes only the False elements and leaves the rest to the fill."""
import torch
import triton
import triton.language as tl


@triton.jit
def mask_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=1.0)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], dtype=tl.int1), mask=(offs < n) & (x <= 0))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape, dtype=torch.bool, device=x.device)
        mask_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
