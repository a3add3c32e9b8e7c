"""Honest: a one-row-per-program LayerNorm as public kernels write it: a float eps argument converted with
`eps.to(tl.float32)` (compiled Triton passes an fp32), and a load mask that combines the scalar test of the row with
the block test of the columns."""
import torch
import triton
import triton.language as tl


@triton.jit
def layernorm_rows(x_ptr, w_ptr, b_ptr, out_ptr, n_rows, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = (row < n_rows) & (cols < n_cols)
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    centered = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps.to(tl.float32))
    w = tl.load(w_ptr + cols, mask=cols < n_cols)
    b = tl.load(b_ptr + cols, mask=cols < n_cols)
    tl.store(out_ptr + row * n_cols + cols, centered * rstd * w + b, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = torch.nn.LayerNorm(normalized_shape=normalized_shape)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        n_cols = self.ln.weight.numel()
        n_rows = x.numel() // n_cols
        out = torch.empty_like(x)
        layernorm_rows[(n_rows,)](x, self.ln.weight, self.ln.bias, out, n_rows, n_cols, self.ln.eps,
                                  BLOCK=triton.next_power_of_2(n_cols))
        return out
