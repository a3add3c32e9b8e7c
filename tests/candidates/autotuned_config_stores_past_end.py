"""Broken: an autotuned add whose second configuration stores 64 elements past the end of its output (its first is
honest): the executor runs every configuration, on a GPU and on the CPU, so the guards catch it whichever is chosen."""
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"SPILL": 0}, num_warps=4), triton.Config({"SPILL": 64}, num_warps=4)],
                 key=["n"])
@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n, SPILL: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n + SPILL
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=offs < n) + tl.load(b_ptr + offs, mask=offs < n), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel() + 64, 1024),)](a, b, out, a.numel(), BLOCK=1024)
        return out
