"""Honest: an autotuned add whose first configuration rereads its input 512 times (a max of equal values, the same
answer) and whose second reads it once: the executor, timing both, runs the second."""
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"REREADS": 512}, num_warps=4), triton.Config({"REREADS": 1}, num_warps=4)],
                 key=["n"])
@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, REREADS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.full([BLOCK], float("-inf"), tl.float32)
    for _ in range(REREADS):
        a = tl.maximum(a, tl.load(a_ptr + offs, mask=mask, volatile=True))
    tl.store(out_ptr + offs, a + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
