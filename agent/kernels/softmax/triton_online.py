"""softmax in Triton for rows too long for registers: one online pass (running max and rescaled sum), then a
second pass that recomputes exp and writes (its reads of the row mostly hit L2)."""
import torch
import triton
import triton.language as tl

BLOCK_COLS = 2048
NUM_WARPS = 8


@triton.jit
def softmax_online_kernel(x_ptr, out_ptr, n_cols, BLOCK_COLS: tl.constexpr):
    row_ptr = x_ptr + tl.program_id(0) * n_cols
    cols = tl.arange(0, BLOCK_COLS)
    # Per-lane running max starts finite so lanes that only ever see masked (-inf) values never compute inf - inf.
    running_max = tl.full([BLOCK_COLS], -3.0e38, tl.float32)
    running_sum = tl.zeros([BLOCK_COLS], tl.float32)
    for start in range(0, n_cols, BLOCK_COLS):
        x = tl.load(row_ptr + start + cols, mask=start + cols < n_cols, other=-float("inf"))
        new_max = tl.maximum(running_max, x)
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.exp(x - new_max)
        running_max = new_max
    row_max = tl.max(running_max, axis=0)
    inv_sum = 1.0 / tl.sum(running_sum * tl.exp(running_max - row_max), axis=0)
    out_row_ptr = out_ptr + tl.program_id(0) * n_cols
    for start in range(0, n_cols, BLOCK_COLS):
        mask = start + cols < n_cols
        x = tl.load(row_ptr + start + cols, mask=mask, other=-float("inf"))
        tl.store(out_row_ptr + start + cols, tl.exp(x - row_max) * inv_sum, mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        self.launch((n_rows,), [x, out, n_cols], {"BLOCK_COLS": BLOCK_COLS})
        return out

    def launch(self, grid, args, constexprs):
        softmax_online_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
