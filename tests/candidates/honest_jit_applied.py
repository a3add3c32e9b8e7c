"""Honest: triton.jit and triton.heuristics applied as calls to a def, rebinding its name, as Unsloth writes its
kernels; the def is checked as a kernel all the same."""
import torch
import triton
import triton.language as tl


def _add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(a_ptr + offs) + tl.load(b_ptr + offs))
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


_add_kernel = triton.jit(_add_kernel)
_add_kernel = triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})(_add_kernel)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        _add_kernel[(triton.cdiv(a.numel(), 256),)](a, b, out, a.numel(), BLOCK=256)
        return out
