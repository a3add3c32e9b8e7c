"""rmsnorm in Triton: the whole row lives in registers, so x is read once."""
import torch
import triton
import triton.language as tl

NUM_WARPS = 16          # 32 registers at 8192 columns: 4 programs (128 KiB of loads) in flight per SM
ROWS_PER_PROGRAM = 1
# Masked against n_cols: PTX compiled with a larger BLOCK_COLS computes the same (see ptx_edits).
MASKED_CONSTEXPRS = ("BLOCK_COLS",)


@triton.jit
def rmsnorm_row_kernel(x_ptr, weight_ptr, out_ptr, n_rows, n_cols, eps,
                       BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    cols = tl.arange(0, BLOCK_COLS)
    mask = cols < n_cols
    for i in tl.static_range(ROWS_PER_PROGRAM):
        # The last program may run past the end: it redoes the last row, storing the same values again.
        row = tl.minimum(tl.program_id(0) * ROWS_PER_PROGRAM + i, n_rows - 1)
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        # weight is loaded only now (an L2 hit after the first rows), so it holds no registers during the reduction.
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        tl.store(out_ptr + row * n_cols + cols, x * rstd * weight, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)  # same init as the target's Model

    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        block_cols = 1 << max(n_cols - 1, 0).bit_length()
        grid = ((n_rows + ROWS_PER_PROGRAM - 1) // ROWS_PER_PROGRAM,)
        self.launch(grid, [x, self.weight, out, n_rows, n_cols, self.eps],
                    {"BLOCK_COLS": block_cols, "ROWS_PER_PROGRAM": ROWS_PER_PROGRAM})
        return out

    def launch(self, grid, args, constexprs):
        rmsnorm_row_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
