"""layernorm in Triton for long rows: pass 1 accumulates sum and sum of squares per lane, pass 2 normalizes
(its re-read of the row mostly hits L2). E[x^2] - mean^2 is accurate enough for activations whose mean is not
far larger than their spread."""
import torch
import triton
import triton.language as tl

BLOCK_COLS = 2048
NUM_WARPS = 8


@triton.jit
def layernorm_looped_kernel(x_ptr, weight_ptr, bias_ptr, out_ptr, n_cols, eps, BLOCK_COLS: tl.constexpr):
    row_ptr = x_ptr + tl.program_id(0) * n_cols
    out_row_ptr = out_ptr + tl.program_id(0) * n_cols
    cols = tl.arange(0, BLOCK_COLS)
    acc_sum = tl.zeros([BLOCK_COLS], tl.float32)
    acc_sq = tl.zeros([BLOCK_COLS], tl.float32)
    for start in range(0, n_cols, BLOCK_COLS):
        x = tl.load(row_ptr + start + cols, mask=start + cols < n_cols, other=0.0)
        acc_sum += x
        acc_sq += x * x
    mean = tl.sum(acc_sum, axis=0) / n_cols
    var = tl.maximum(tl.sum(acc_sq, axis=0) / n_cols - mean * mean, 0.0)
    rstd = 1.0 / tl.sqrt(var + eps)
    for start in range(0, n_cols, BLOCK_COLS):
        mask = start + cols < n_cols
        x = tl.load(row_ptr + start + cols, mask=mask, other=0.0)
        weight = tl.load(weight_ptr + start + cols, mask=mask, other=0.0)
        bias = tl.load(bias_ptr + start + cols, mask=mask, other=0.0)
        tl.store(out_row_ptr + start + cols, (x - mean) * rstd * weight + bias, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, normalized_shape, eps):
        super().__init__()
        self.norm = torch.nn.LayerNorm(normalized_shape, eps=eps)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        n_rows, n_cols = x.shape
        out = torch.empty_like(x)
        self.launch((n_rows,), [x, self.norm.weight, self.norm.bias, out, n_cols, self.norm.eps],
                    {"BLOCK_COLS": BLOCK_COLS})
        return out

    def launch(self, grid, args, constexprs):
        layernorm_looped_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)
