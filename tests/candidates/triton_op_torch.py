"""Cheat: a torch.library.triton_op, as PyTorch documents Triton custom ops, whose body lets PyTorch do the work."""
import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton


@triton.jit
def touch_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=offs < n), mask=offs < n)


@triton_op("kloop_cheat::add", mutates_args={})
def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.add(a, b)
    wrap_triton(touch_kernel)[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)
    return out


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return add(a, b)
