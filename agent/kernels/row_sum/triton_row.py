"""row_sum in Triton: each program loads a ROWS_PER_PROGRAM x BLOCK_COLS tile (whole rows) at once and reduces it.

Few warps per row: each thread keeps many 16-byte loads in flight and the cross-warp part of the reduction (shared
memory and a barrier) stays small; the output write is tiny."""
import torch
import triton
import triton.language as tl

NUM_WARPS = 4           # 8192 fp32 columns over 128 threads: 64 values (16 vector loads) per thread
ROWS_PER_PROGRAM = 1    # a power of two; >1 keeps more bytes in flight per program when rows are short
# Masked against n_cols: PTX compiled with a larger BLOCK_COLS computes the same (see ptx_edits).
MASKED_CONSTEXPRS = ("BLOCK_COLS",)


@triton.jit
def row_sum_row_kernel(x_ptr, out_ptr, n_rows, n_cols,
                       BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    rows = tl.program_id(0) * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    # Read once, never reused: evict_first keeps it from displacing other lines in L2.
    x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=0.0, eviction_policy="evict_first")
    tl.store(out_ptr + rows, tl.sum(x, axis=1), mask=rows < n_rows)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty(n_rows, dtype=x.dtype, device=x.device)
        block_cols = 1 << max(n_cols - 1, 0).bit_length()
        grid = ((n_rows + ROWS_PER_PROGRAM - 1) // ROWS_PER_PROGRAM,)
        self.launch(grid, [x, out, n_rows, n_cols],
                    {"BLOCK_COLS": block_cols, "ROWS_PER_PROGRAM": ROWS_PER_PROGRAM})
        return out

    def launch(self, grid, args, constexprs):
        row_sum_row_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
