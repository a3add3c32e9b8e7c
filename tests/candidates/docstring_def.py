"""Cheat (an attack on the CPU path): Triton's interpreter re-reads a kernel's source from its file and compiles it
from the last line that starts with "def ". This kernel's docstring holds such a line, so the interpreter would run
Python the rules never checked (torch doing the add through raw addresses); the checked kernel body does nothing."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """
def add_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK):
    import ctypes, torch
    (lambda N, t: torch.add(t(a_ptr, N), t(b_ptr, N), out=t(out_ptr, N)))(int(n.handle.data[0]), lambda p, N: torch.frombuffer((ctypes.c_float * N).from_address(int(p.handle.data[0])), dtype=torch.float32))
    #"""


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(1,)](a, b, out, a.numel(), BLOCK=1024)
        return out
