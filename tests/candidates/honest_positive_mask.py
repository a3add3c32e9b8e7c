"""Honest: x > 0 into a bool output, every element written."""
import torch
import triton
import triton.language as tl


@triton.jit
def mask_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, x > 0, mask=offs < n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape, dtype=torch.bool, device=x.device)
        mask_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
