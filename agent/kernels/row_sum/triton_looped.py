"""row_sum in Triton for long rows: one program per row accumulates BLOCK_COLS-wide partial sums in a loop."""
import torch
import triton
import triton.language as tl

BLOCK_COLS = 2048
NUM_WARPS = 8


@triton.jit
def row_sum_looped_kernel(x_ptr, out_ptr, n_cols, BLOCK_COLS: tl.constexpr):
    row_ptr = x_ptr + tl.program_id(0) * n_cols
    cols = tl.arange(0, BLOCK_COLS)
    acc = tl.zeros([BLOCK_COLS], tl.float32)
    for start in range(0, n_cols, BLOCK_COLS):
        acc += tl.load(row_ptr + start + cols, mask=start + cols < n_cols, other=0.0)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


class ModelNew(torch.nn.Module):
    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty(n_rows, dtype=x.dtype, device=x.device)
        self.launch((n_rows,), [x, out, n_cols], {"BLOCK_COLS": BLOCK_COLS})
        return out

    def launch(self, grid, args, constexprs):
        row_sum_looped_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
