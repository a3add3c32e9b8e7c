"""Hostile: a tensor descriptor whose base is a raw address (an object with data_ptr()), not a tensor."""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


class Address:
    dtype = torch.float32

    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address


@triton.jit
def scale_kernel(x_desc, out_desc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r, c = tl.program_id(0) * BLOCK_R, tl.program_id(1) * BLOCK_C
    out_desc.store([r, c], x_desc.load([r, c]) * 2)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        rows, cols = x.shape
        x_desc = TensorDescriptor(Address(x.data_ptr() + 4096 * 1024), [rows, cols], list(x.stride()), [16, 32])
        scale_kernel[(triton.cdiv(rows, 16), triton.cdiv(cols, 32))](
            x_desc, TensorDescriptor.from_tensor(out, [16, 32]), BLOCK_R=16, BLOCK_C=32)
        return out
