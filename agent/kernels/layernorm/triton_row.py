"""layernorm in Triton: the whole row lives in registers, so x is read once; mean and variance are exact two-step."""
import torch
import triton
import triton.language as tl

NUM_WARPS = 8           # ~80 registers at 8192 columns: 3 programs (96 KiB of loads) in flight per SM
ROWS_PER_PROGRAM = 1
# Masked against n_cols: PTX compiled with a larger BLOCK_COLS computes the same (see ptx_edits).
MASKED_CONSTEXPRS = ("BLOCK_COLS",)


@triton.jit
def layernorm_row_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, n_rows, n_cols, eps,
                         BLOCK_COLS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    cols = tl.arange(0, BLOCK_COLS)
    mask = cols < n_cols
    for i in tl.static_range(ROWS_PER_PROGRAM):
        # The last program may run past the end: it redoes the last row, storing the same values again.
        row = tl.minimum(tl.program_id(0) * ROWS_PER_PROGRAM + i, n_rows - 1)
        x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        mean = tl.sum(x, axis=0) / n_cols
        centered = tl.where(mask, x - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
        # weight and bias are loaded only now (L2 hits after the first rows), so they hold no registers during the
        # reductions: fewer registers, more programs per SM.
        weight = tl.load(weight_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        bias = tl.load(bias_ptr + cols, mask=mask, other=0.0, eviction_policy="evict_last")
        tl.store(out_ptr + row * n_cols + cols, centered * rstd * weight + bias, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, normalized_shape, eps):
        super().__init__()
        # Same module layout and init order as the target's Model, so its parameters load (or re-seed) identically.
        self.norm = torch.nn.LayerNorm(normalized_shape, eps=eps)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        block_cols = 1 << max(n_cols - 1, 0).bit_length()
        grid = ((n_rows + ROWS_PER_PROGRAM - 1) // ROWS_PER_PROGRAM,)
        self.launch(grid, [x, self.norm.weight, self.norm.bias, out, n_rows, n_cols, self.norm.eps],
                    {"BLOCK_COLS": block_cols, "ROWS_PER_PROGRAM": ROWS_PER_PROGRAM})
        return out

    def launch(self, grid, args, constexprs):
        layernorm_row_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
