"""Honest: one kernel writes both outputs into halves of one allocation (two views of one buffer)."""
import torch
import triton
import triton.language as tl


@triton.jit
def both_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + 1, mask=mask)
    tl.store(out_ptr + n + offs, x * 2, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        n = x.numel()
        both = torch.empty(2 * n, device=x.device, dtype=x.dtype)
        both_kernel[(triton.cdiv(n, 1024),)](x, both, n, BLOCK=1024)
        return both[:n].view(x.shape), both[n:].view(x.shape)
