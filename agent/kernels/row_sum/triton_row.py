"""row_sum in Triton: each program loads whole rows into registers and reduces them."""
import torch
import triton
import triton.language as tl

NUM_WARPS = 16
ROWS_PER_PROGRAM = 1


@triton.jit
def row_sum_row_kernel(x_ptr, out_ptr, n_rows, n_cols,
                       BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    cols = tl.arange(0, BLOCK_COLS)
    for i in tl.static_range(ROWS_PER_PROGRAM):
        # The last program may run past the end: it redoes the last row, storing the same values again.
        row = tl.minimum(tl.program_id(0) * ROWS_PER_PROGRAM + i, n_rows - 1)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        tl.store(out_ptr + row, tl.sum(x, axis=0))


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
