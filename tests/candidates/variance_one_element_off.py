"""Cheat on the float64 judgement: the two-pass variance with one row 0.35% off (about 2.7 tolerances). The reference
is itself up to ~1.8 tolerances off the exact variance, in other rows: a slack of twice its worst error anywhere
would let this row through; element by element it does not."""
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
    variance = tl.sum(squares, axis=0) / n
    tl.store(out_ptr + tl.program_id(0), tl.where(tl.program_id(0) == 3, variance * 1.0035, variance))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty(x.shape[0], device=x.device, dtype=torch.float32)
        variance_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=1024)
        return out
