"""Honest: (x @ W.T).sum(1) as x @ W.sum(0), as Inductor rewrites it: W's column sums first, then one dot product per
row. The same sum in another order; where its terms cancel it can be further from the reference than the tolerance.

With TRUNCATE = 1 it cheats on the float64 judgement (c86fcb5): its operands cut to TF32's mantissa, as a tensor
core would read them. Where the sum cancels the judgement allows 8 times the reference's own move under a rounding
step of its inputs; TF32 rounds 2^13 times coarser than float32 and stays far outside (tests/test_evaluator.py)."""
import torch
import triton
import triton.language as tl

TRUNCATE = 0   # 1: each operand cut to TF32's 10-bit mantissa before it is multiplied


@triton.jit
def column_sums(w_ptr, out_ptr, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    cs = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for r0 in range(0, rows, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        mask = (rs[:, None] < rows) & (cs[None, :] < cols)
        acc += tl.sum(tl.load(w_ptr + rs[:, None] * cols + cs[None, :], mask=mask, other=0.0), axis=0)
    tl.store(out_ptr + cs, acc, mask=cs < cols)


@triton.jit
def row_dots(x_ptr, s_ptr, out_ptr, cols, scale, BLOCK_C: tl.constexpr, TRUNCATE: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for c0 in range(0, cols, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        x = tl.load(x_ptr + row * cols + cs, mask=cs < cols, other=0.0)
        s = tl.load(s_ptr + cs, mask=cs < cols, other=0.0)
        if TRUNCATE:
            x = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
            s = (s.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        acc += x * s
    tl.store(out_ptr + row, tl.sum(acc, axis=0) * scale)


class ModelNew(torch.nn.Module):
    def __init__(self, input_size, hidden_size, scaling_factor):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(hidden_size, input_size))
        self.scaling_factor = scaling_factor

    def forward(self, x):
        hidden, cols = self.weight.shape
        sums = torch.empty(cols, device=x.device, dtype=torch.float32)
        column_sums[(triton.cdiv(cols, 128),)](self.weight, sums, hidden, cols, BLOCK_R=64, BLOCK_C=128)
        out = torch.empty(x.shape[0], 1, device=x.device, dtype=torch.float32)
        row_dots[(x.shape[0],)](x, sums, out, cols, self.scaling_factor / 2, BLOCK_C=256, TRUNCATE=TRUNCATE)
        return out
