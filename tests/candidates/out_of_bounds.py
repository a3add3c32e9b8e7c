"""Broken: reads and writes far past the end of its buffers (an illegal address on the GPU)."""
import torch
import triton
import triton.language as tl


@triton.jit
def bad_kernel(a_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK) + n.to(tl.int64) * 100_000_000  # ~400 GB past the end
    tl.store(out_ptr + offs, tl.load(a_ptr + offs))


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        bad_kernel[(triton.cdiv(a.numel(), 1024),)](a, out, a.numel(), BLOCK=1024)
        return out
