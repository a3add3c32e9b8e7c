"""State in a module-level list that the kernel mutates: compiled Triton refuses to read a global that is not
constexpr; the interpreter would let the kernel count its calls (and change its output after the checked ones)."""
import torch
import triton
import triton.language as tl

CALLS = [0]


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    CALLS[0] = CALLS[0] + 1
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
