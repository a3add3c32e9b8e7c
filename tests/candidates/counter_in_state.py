"""Cheat attempt: a call counter in a registered buffer; the kernel adds on its first 3 calls (the checked ones, it
hopes) and writes zeros after. kloop restores the module's state before every call, so every call is a first call."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, calls_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    calls = tl.load(calls_ptr)
    keep = (calls < 3).to(tl.float32)
    tl.store(out_ptr + offs, (tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask)) * keep, mask=mask)
    if pid == 0:
        tl.store(calls_ptr, calls + 1)


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1, dtype=torch.int32))

    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, self.calls, a.numel(), BLOCK=1024)
        return out
