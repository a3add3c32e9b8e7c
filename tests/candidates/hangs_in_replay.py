"""Breakage: the kernel never ends. Its plan records fine (launches are recorded, not run); the replay hangs, and
must cost the replay's limit, not the limit on making a shape's inputs. It spins on a volatile load of a flag that
stays 0: a loop on a register alone (`while i >= 0: i += 1`) ends on a GPU, where int32 wraps or LLVM drops it."""
import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    while tl.load(flag_ptr, volatile=True) == 0:
        pass
    tl.store(out_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        flag = torch.zeros(1, dtype=torch.int32, device=a.device)
        n = a.numel()
        add_kernel[(triton.cdiv(n, 1024),)](a, b, out, flag, n, BLOCK=1024)
        return out
