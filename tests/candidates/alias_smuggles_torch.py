"""Cheat (rules bypassed in the test): a module-level alias, written like Unsloth's `triton_tanh = tl.math.tanh`,
that is really a PyTorch function, called inside the kernel: under the CPU interpreter it would run as Python on
the kernel's tensors."""
import torch
import triton
import triton.language as tl

triton_add = torch.add


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, triton_add(tl.load(a_ptr + offs, mask=mask), tl.load(b_ptr + offs, mask=mask)),
             mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
