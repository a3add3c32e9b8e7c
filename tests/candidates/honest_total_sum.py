"""Honest: a whole-tensor sum in one program, its tail masked."""
import torch
import triton
import triton.language as tl


@triton.jit
def sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr, tl.sum(acc, axis=0))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(1, device=x.device, dtype=x.dtype)
        sum_kernel[(1,)](x, out, x.numel(), BLOCK=512)
        return out
