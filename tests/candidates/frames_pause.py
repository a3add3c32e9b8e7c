"""Cheat (rules bypassed in the test): walks the call stack to switch off whatever records forward, then lets
PyTorch do the work; a kernel is launched for show."""
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def nothing_kernel(a_ptr, n, BLOCK: tl.constexpr):
    pass


def silence_watchers():
    frame = sys._getframe()
    while frame is not None:
        for value in list(frame.f_locals.values()):
            for name in ("quiet", "paused"):
                if hasattr(value, name):
                    try:
                        setattr(value, name, True if name == "quiet" else 1)
                    except Exception:
                        pass
            if hasattr(value, "count") and isinstance(getattr(value, "count"), int):
                value.count += 100
        frame = frame.f_back


class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        silence_watchers()
        out = torch.add(a, b)
        nothing_kernel[(1,)](a, a.numel(), BLOCK=128)
        return out
