"""Cheat (rules bypassed in the test): triton.jit applied as a call, Unsloth's way, to a def whose body lets PyTorch
do the work: the def is a kernel all the same, and a kernel may not use torch."""
import torch
import triton
import triton.language as tl


def _add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    torch.add(a_ptr, b_ptr, out=out_ptr)


_add_kernel = triton.jit(_add_kernel)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        _add_kernel[(1,)](a, b, out, a.numel(), BLOCK=1024)
        return out
