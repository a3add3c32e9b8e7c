"""Honest: LayerNorm over each row, two-pass statistics, with its weight and bias."""
import torch
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, row_len, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < row_len
    x = tl.load(x_ptr + row * row_len + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / row_len
    centered = tl.where(mask, x - mean, 0.0)
    y = centered / tl.sqrt(tl.sum(centered * centered, axis=0) / row_len + eps)
    y = y * tl.load(w_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + row * row_len + offs, y, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = torch.nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x):
        row_len = self.ln.weight.numel()
        out = torch.empty_like(x)
        layernorm_kernel[(x.numel() // row_len,)](x, self.ln.weight, self.ln.bias, out, row_len, self.ln.eps,
                                                  BLOCK=triton.next_power_of_2(row_len))
        return out
