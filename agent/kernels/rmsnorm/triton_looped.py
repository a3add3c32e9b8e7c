"""rmsnorm in Triton for long rows: pass 1 accumulates the sum of squares, pass 2 scales (re-read mostly from L2)."""
import torch
import triton
import triton.language as tl

BLOCK_COLS = 2048
NUM_WARPS = 8


@triton.jit
def rmsnorm_looped_kernel(x_ptr, weight_ptr, out_ptr, n_cols, eps, BLOCK_COLS: tl.constexpr):
    row_ptr = x_ptr + tl.program_id(0) * n_cols
    out_row_ptr = out_ptr + tl.program_id(0) * n_cols
    cols = tl.arange(0, BLOCK_COLS)
    acc_sq = tl.zeros([BLOCK_COLS], tl.float32)
    for start in range(0, n_cols, BLOCK_COLS):
        x = tl.load(row_ptr + start + cols, mask=start + cols < n_cols, other=0.0)
        acc_sq += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc_sq, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_COLS):
        mask = start + cols < n_cols
        x = tl.load(row_ptr + start + cols, mask=mask, other=0.0)
        weight = tl.load(weight_ptr + start + cols, mask=mask, other=0.0)
        tl.store(out_row_ptr + start + cols, x * rstd * weight, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        self.launch((n_rows,), [x, self.weight, out, n_cols, self.eps], {"BLOCK_COLS": BLOCK_COLS})
        return out

    def launch(self, grid, args, constexprs):
        rmsnorm_looped_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
