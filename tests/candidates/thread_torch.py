"""Cheat: a thread joined inside forward computes the answer with PyTorch, out of the recorder's sight."""
import threading

import torch
import triton
import triton.language as tl


@triton.jit
def nothing_kernel(a_ptr, n, BLOCK: tl.constexpr):
    pass


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        worker = threading.Thread(target=lambda: torch.add(a, b, out=out))
        worker.start()
        worker.join()
        nothing_kernel[(1,)](a, a.numel(), BLOCK=128)
        return out
