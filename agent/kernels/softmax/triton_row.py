"""softmax in Triton: the whole row lives in registers, so x is read once and out written once."""
import torch
import triton
import triton.language as tl

NUM_WARPS = 16          # 8192 fp32 columns over 512 threads: 16 values per thread
ROWS_PER_PROGRAM = 1    # >1 amortizes launch/scheduling cost when rows are short
# Masked against n_cols: PTX compiled with a larger BLOCK_COLS computes the same (see ptx_edits).
MASKED_CONSTEXPRS = ("BLOCK_COLS",)


@triton.jit
def softmax_row_kernel(x_ptr, out_ptr, n_rows, n_cols,
                       BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    cols = tl.arange(0, BLOCK_COLS)
    for i in tl.static_range(ROWS_PER_PROGRAM):
        # The last program may run past the end: it redoes the last row, storing the same values again.
        row = tl.minimum(tl.program_id(0) * ROWS_PER_PROGRAM + i, n_rows - 1)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
        e = tl.exp(x - tl.max(x, axis=0))
        y = e * (1.0 / tl.sum(e, axis=0))
        tl.store(out_ptr + row * n_cols + cols, y, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        block_cols = 1 << max(n_cols - 1, 0).bit_length()  # next power of two holding the whole row
        grid = ((n_rows + ROWS_PER_PROGRAM - 1) // ROWS_PER_PROGRAM,)
        self.launch(grid, [x, out, n_rows, n_cols],
                    {"BLOCK_COLS": block_cols, "ROWS_PER_PROGRAM": ROWS_PER_PROGRAM})
        return out

    def launch(self, grid, args, constexprs):
        softmax_row_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
