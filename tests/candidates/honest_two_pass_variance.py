"""Honest: row variance in two passes (the mean, then the squared deviations), closer to the exact variance than the
reference's E[x^2] - E[x]^2."""
import torch
import triton
import triton.language as tl


@triton.jit
def variance_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = x_ptr + tl.program_id(0) * n
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        total += tl.load(row + offs, mask=offs < n, other=0.0)
    mean = tl.sum(total, axis=0) / n
    squares = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        d = tl.where(offs < n, tl.load(row + offs, mask=offs < n, other=0.0) - mean, 0.0)
        squares += d * d
    tl.store(out_ptr + tl.program_id(0), tl.sum(squares, axis=0) / n)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
        variance_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=1024)
        return out
