"""Numerically unstable: LayerNorm with the variance as E[x^2] - E[x]^2 in float32. Right on the target's own inputs,
but where the mean dwarfs the spread (inputs near one) the subtraction loses the variance: the output is off far
beyond what float32 rounding of the inputs explains."""
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
    var = tl.sum(x * x, axis=0) / row_len - mean * mean
    w = tl.load(w_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + row * row_len + offs, (x - mean) / tl.sqrt(var + eps) * w + b, mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = torch.nn.LayerNorm(normalized_shape=normalized_shape)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        row_len = self.ln.weight.numel()
        out = torch.empty_like(x)
        layernorm_kernel[(x.numel() // row_len,)](x, self.ln.weight, self.ln.bias, out, row_len, self.ln.eps,
                                                  BLOCK=triton.next_power_of_2(row_len))
        return out
