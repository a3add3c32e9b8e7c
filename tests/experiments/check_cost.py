"""What one output check costs the referee on a GPU (not a test): tools/verify.py's first pass, fused (one Triton
kernel) against torch's elementwise ops, and same_bits, at vector_add's full size and others, side by side.

    python tests/experiments/check_cost.py            # a few seconds on an H100

Every timed call of a candidate is checked (about 50 checks per candidate), so these milliseconds are a share of
each candidate's time on its device. Medians and quartiles of --repeats wall-clock timings (each ends with the one
host read the check makes).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from tools import verify


def wall_ms(fn, repeats: int) -> dict:
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - began) * 1e3)
    q = statistics.quantiles(samples, n=4)
    return {"median": statistics.median(samples), "q1": q[0], "q3": q[2]}


def bytes_compared(a: torch.Tensor, b: torch.Tensor) -> bool:
    """same_bits as it was: a byte at a time."""
    return not bool((a.contiguous().view(torch.uint8) != b.contiguous().view(torch.uint8)).any())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}; ms per call, median (q1-q3) of {args.repeats}")
    for n, dtype in ((1 << 26, torch.float32), (1 << 24, torch.float32), (1 << 26, torch.float16),
                     (1 << 22, torch.float64)):
        ref = torch.randn(n, device="cuda", dtype=dtype)
        atol, rtol = verify.TOLERANCES[dtype]
        out = ref + atol / 10   # right: both passes accept it
        fused, plain = verify._fast_pass_fused(out, ref, atol, rtol), verify._fast_pass_torch(out, ref, atol, rtol)
        assert fused and plain and all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(fused, plain)), (fused, plain)
        rows = {"first pass, torch ops": lambda: verify._fast_pass_torch(out, ref, atol, rtol),
                "first pass, fused": lambda: verify._fast_pass_fused(out, ref, atol, rtol),
                "same_bits, bytes": lambda: bytes_compared(ref, out),
                "same_bits, elements": lambda: verify.same_bits(ref, out)}
        for name, fn in rows.items():
            found = wall_ms(fn, args.repeats)
            print(f"{str(dtype).removeprefix('torch.'):>8} n=2^{n.bit_length() - 1}  {name:<24} "
                  f"{found['median']:7.3f} ({found['q1']:.3f}-{found['q3']:.3f})", flush=True)


if __name__ == "__main__":
    main()
