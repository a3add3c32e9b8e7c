"""Honest: host-side TMA tensor descriptors (triton.tools.tensor_descriptor) carry the tiles in and out."""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

BLOCK_R = 16
BLOCK_C = 32


@triton.jit
def scale_kernel(x_desc, out_desc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r, c = tl.program_id(0) * BLOCK_R, tl.program_id(1) * BLOCK_C
    out_desc.store([r, c], x_desc.load([r, c]) * 2)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        rows, cols = x.shape
        scale_kernel[(triton.cdiv(rows, BLOCK_R), triton.cdiv(cols, BLOCK_C))](
            TensorDescriptor.from_tensor(x, [BLOCK_R, BLOCK_C]), TensorDescriptor.from_tensor(out, [BLOCK_R, BLOCK_C]),
            BLOCK_R=BLOCK_R, BLOCK_C=BLOCK_C)
        return out
