"""Cheat: a torch.autograd.Function, as Liger-Kernel launches its kernels, whose forward lets PyTorch do the work
and launches a kernel that does nothing useful."""
import torch
import triton
import triton.language as tl


@triton.jit
def touch_kernel(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(out_ptr + offs, mask=offs < n), mask=offs < n)


class AddFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        out = a + b
        touch_kernel[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)
        return out

    @staticmethod
    def backward(ctx, dy):
        return dy, dy


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return AddFunction.apply(a, b)
