"""Honest: Triton functions under module-level names of the candidate's own (`triton_cast = tl.cast`), called inside
the kernel, as Unsloth writes them."""
import torch
import triton
import triton.language as tl

triton_cast = tl.cast
triton_where = tl.where


@triton.jit
def leaky_relu_kernel(x_ptr, out_ptr, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = triton_cast(tl.load(x_ptr + offs, mask=mask), tl.float32)
    tl.store(out_ptr + offs, triton_where(x > 0, x, x * slope), mask=mask)


class ModelNew(torch.nn.Module):
    def __init__(self, negative_slope):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        out = torch.empty_like(x)
        leaky_relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), self.negative_slope, BLOCK=1024)
        return out
