"""One timed GPU call: how kloop times every kernel it reports.

A speedup is a ratio, so the candidate (sandbox/executor.py), its eager and torch.compile baselines
(sandbox/referee.py) and the interleaved timings and ceilings (tools/profile.py) are all timed by `timed_call`.
Its steps, in order, and why:

1. Persisting-L2 reset (`reset_persisting_l2`): a kernel can mark lines persisting (PTX `L2::evict_last` cache
   hints, which Triton's `eviction_policy="evict_last"` emits and Inductor's kernels use, or an access-policy
   window); while persisting they may hold the L2's set-aside part, which the flush's ordinary writes cannot evict.
   Both sides' kernels can do it, so both get the reset: a reset for one side only would time the other warmer.
2. L2 flush: writing a buffer twice the L2's size evicts what the last call and the inputs' making left there, so
   every call starts from cold memory (a model's kernel rarely finds its inputs in L2), then the GPU is waited for.
3. Spin: `LAUNCH_COVER_CYCLES` of GPU sleep keep the GPU busy while the host runs the launch path (Triton's and
   CuPy's take tens of us), so the events time the kernels, not Python; a launch slower than the spin shows in full.
4. Events: CUDA events around the call on the current stream, waited for device-wide: the GPU time of the call's
   kernels, as Nsight Compute would measure it. The host's wall time around it comes back too: much smaller events
   than wall time mean work ran outside the current stream.

Imports of torch happen inside the functions so this module loads anywhere.
"""
from __future__ import annotations

import ctypes
import time
from collections.abc import Callable

LAUNCH_COVER_CYCLES = 1_000_000  # about 0.5 ms at Hopper's ~2 GHz SM clock
FLUSH_L2_MULTIPLE = 2            # the flush buffer's size in L2 sizes

_cuda_driver = None   # libcuda, loaded on the first reset (False where it cannot be)


def flush_buffer(device, nbytes: int | None = None):
    """The buffer `timed_call` writes to flush the L2: FLUSH_L2_MULTIPLE x the device's L2 size unless `nbytes`."""
    import torch

    if nbytes is None:
        nbytes = FLUSH_L2_MULTIPLE * torch.cuda.get_device_properties(device).L2_cache_size
    return torch.empty(max(nbytes, 0), dtype=torch.uint8, device=device)


def reset_persisting_l2() -> None:
    """Return lines marked persisting to normal (cuCtxResetPersistingL2Cache), so the flush can evict them."""
    global _cuda_driver
    if _cuda_driver is None:
        try:
            _cuda_driver = ctypes.CDLL("libcuda.so.1")
        except OSError:
            _cuda_driver = False
    if _cuda_driver:
        _cuda_driver.cuCtxResetPersistingL2Cache()


def timed_call(fn: Callable[[], object], flush=None) -> tuple[object, float, float]:
    """(fn's output, event ms, wall ms) of one call of `fn` on the current CUDA stream, after the steps above.

    `flush` None or empty: no reset and no flush (a call timed only to watch it, behind whatever the L2 holds)."""
    import torch

    if flush is not None and flush.numel():
        reset_persisting_l2()
        flush.zero_()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    began = time.perf_counter()
    torch.cuda._sleep(LAUNCH_COVER_CYCLES)
    start.record()
    out = fn()
    end.record()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - began) * 1e3
    return out, start.elapsed_time(end), wall_ms
