"""Comparing a candidate's outputs with the reference's, in a trusted process, a chunk at a time.

Tolerances per dtype (an element passes when |out - ref| <= atol + rtol * |ref|):

| dtype | atol | rtol |
|---|---|---|
| float64 | 1e-7 | 1e-7 |
| float32 | 1e-4 | 1e-4 |
| float16 | 1e-2 | 1e-2 |
| bfloat16 | 2e-2 | 2e-2 |
| integers, bool | exact | exact |

The spread trial (one-signed inputs mapped onto [-4, 4], sandbox/referee.py) is judged against the output's
scale: atol grows by rtol * max|ref|, since sums of terms of both signs cancel (a cumsum's or a sum's rounding error
follows the terms' magnitude, not the result's); a kernel that skips the op on negative inputs is off by O(1) there.

A float32 reference is itself rounded: over a long sum its error alone can exceed the tolerance, so an output
outside it is judged once more against the reference computed in float64 (sandbox/referee.py, memory permitting):
each element must be within its tolerance of that, or no further from it than twice the reference is there, or
than SENSITIVITY_FACTOR times the distance the float32 reference moves when its inputs move by one rounding step
(where a sum's terms cancel, any other summation order is that far off, and the reference is only luckily near).
Lower precision stays out: TF32 rounds 2^13 times coarser than float32, bfloat16 2^16 times.

NaN and infinity must sit at the same positions (infinities with the same sign); they are left out of the numeric
comparison. TF32 is off for reference and candidate alike (tools/numerics.py), so float32 means float32.
Work is done in slices of about CHUNK elements along the first dimension, so comparing a 6 GB output costs a few
hundred MB of temporaries, never a float64 copy of the whole thing.

Speed (every timed call is checked, so this runs dozens of times per candidate): a first pass works in the
output's own precision (float32 for half types), on device, with one host read at the end, and accepts an output
only when every element is finite and within 0.999 of its tolerance, where float32 rounding cannot change the
answer. On a GPU, for contiguous tensors, that pass is one Triton kernel reading each tensor once: 0.31 ms for a
float32 output of 2^26 elements on an H100, where torch's dozen elementwise passes took 2.96 ms (bench/check_cost.py),
and a candidate's outputs are checked about 50 times. Anything else (a NaN or infinity anywhere, an element near or over its bound) is judged by the exact
float64 pass, which finds the positions and the worst element for the reasons.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import triton
import triton.language as tl

TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
CHUNK = 1 << 24  # elements per slice: 128 MiB as float64
SENSITIVITY_FACTOR = 8.0  # against_float64: allowed distance, in units of the reference's own rounding sensitivity
FAST_MARGIN = 1 - 1e-3  # the first pass accepts |out - ref| <= 0.999 * (atol + rtol |ref|): float32 error is ~1e-7
SAME_SIZE_INTEGER = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # same_bits compares whole elements


def _slices(shape: tuple) -> list[tuple[int, int]]:
    """Row ranges [start, stop) along dim 0 holding about CHUNK elements each (the whole tensor if 0-d)."""
    if len(shape) == 0 or shape[0] == 0:
        return [(0, 1)] if len(shape) == 0 else []
    per_row = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    rows = max(1, CHUNK // max(per_row, 1))
    return [(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)]


def _rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return t.reshape(1) if t.dim() == 0 else t[start:stop].reshape(-1)


def compare(out: torch.Tensor, ref: torch.Tensor, index: int = 0, to_scale: bool = False) -> tuple[list[str], dict]:
    """Reasons the output is wrong (empty if right) and the error statistics. to_scale: atol grows by
    rtol * max|ref| (the spread trial)."""
    if out.dtype != ref.dtype:
        return [f"output {index} has dtype {out.dtype}, expected {ref.dtype}"], {}
    if tuple(out.shape) != tuple(ref.shape):
        return [f"output {index} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"], {}
    if not ref.is_floating_point():
        wrong = torch.zeros((), dtype=torch.int64, device=ref.device)
        for start, stop in _slices(tuple(ref.shape)):
            wrong += (_rows(out, start, stop) != _rows(ref, start, stop)).sum()
        wrong = int(wrong)
        stats = {"mismatches": wrong, "max_abs_err": 0.0 if wrong == 0 else None}
        return ([f"output {index}: {wrong} of {ref.numel()} elements differ (exact match required)"] if wrong
                else []), stats
    atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    if to_scale:
        atol = float(f"{atol + rtol * finite_abs_max(ref):.3g}")
    fast = _fast_pass(out, ref, atol, rtol)
    if fast is not None:
        return [], {"max_abs_err": fast[0], "max_rel_err": fast[1], "mismatches": 0, "atol": atol, "rtol": rtol}
    return _exact(out, ref, index, atol, rtol)


def finite_abs_max(t: torch.Tensor) -> float:
    """The largest finite |element| (0.0 if none), a slice at a time."""
    best = torch.zeros((), dtype=torch.float64, device=t.device)
    for start, stop in _slices(tuple(t.shape)):
        rows = _rows(t, start, stop)
        if rows.numel():
            best = torch.maximum(best, torch.nan_to_num(rows.abs().double(), nan=0.0, posinf=0.0).max())
    return float(best)


def all_finite(t: torch.Tensor) -> bool:
    """No NaN and no infinity, a slice at a time (torch.isfinite of a whole 6 GB output makes 10 GB of temporaries)."""
    bad = torch.zeros((), dtype=torch.bool, device=t.device)
    for start, stop in _slices(tuple(t.shape)):
        bad |= ~torch.isfinite(_rows(t, start, stop)).all()
    return not bool(bad)


def _fast_pass(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[float, float] | None:
    """(max abs error, max rel error) when every element is finite and clearly within tolerance, else None.
    Never writes into `out` or `ref` (the executor's memory and the reference)."""
    if ref.is_cuda and out.is_cuda and out.is_contiguous() and ref.is_contiguous() and ref.numel():
        return _fast_pass_fused(out, ref, atol, rtol)
    return _fast_pass_torch(out, ref, atol, rtol)


FUSED_BLOCK = 4096


@triton.jit
def _within_kernel(out_ptr, ref_ptr, partial_ptr, n, programs, atol, rtol, margin, WIDE: tl.constexpr,
                   BLOCK: tl.constexpr):
    """Per program: [outside (0 or 1), max |out - ref|, max relative error, max allowed] over its BLOCK elements,
    in _fast_pass_torch's arithmetic (NaN is outside; an infinite reference makes `allowed` infinite)."""
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    work = tl.float64 if WIDE else tl.float32
    o = tl.load(out_ptr + offsets, mask=mask, other=0).to(work)
    r = tl.load(ref_ptr + offsets, mask=mask, other=0).to(work)
    diff = tl.abs(o - r)
    scale = tl.abs(r)
    allowed = scale * rtol + atol
    outside = mask & ~(diff <= allowed * margin)
    rel = diff / tl.maximum(scale, atol)
    tl.store(partial_ptr + pid, tl.max(outside.to(work), axis=0))
    tl.store(partial_ptr + programs + pid, tl.max(tl.where(mask, diff, 0), axis=0))
    tl.store(partial_ptr + 2 * programs + pid, tl.max(tl.where(mask, rel, 0), axis=0))
    tl.store(partial_ptr + 3 * programs + pid, tl.max(tl.where(mask, allowed, 0), axis=0))


def _fast_pass_fused(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[float, float] | None:
    """_fast_pass_torch's answer from one kernel over contiguous tensors: each is read once."""
    wide = ref.dtype == torch.float64
    n = ref.numel()
    programs = triton.cdiv(n, FUSED_BLOCK)
    partial = torch.empty((4, programs), dtype=torch.float64 if wide else torch.float32, device=ref.device)
    _within_kernel[(programs,)](out.reshape(-1), ref.reshape(-1), partial, n, programs, atol, rtol, FAST_MARGIN,
                                WIDE=wide, BLOCK=FUSED_BLOCK)
    outside, max_abs, max_rel, max_allowed = partial.amax(dim=1).tolist()   # the one host read
    return (max_abs, max_rel) if outside == 0 and math.isfinite(max_allowed) else None


def _fast_pass_torch(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> tuple[float, float] | None:
    """The first pass with torch's elementwise ops, a slice at a time (the CPU, and strided tensors)."""
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    totals = []
    for start, stop in _slices(tuple(ref.shape)):
        o_rows, r_rows = _rows(out, start, stop), _rows(ref, start, stop)
        o, r = o_rows.to(work), r_rows.to(work)
        diff = (o - r).abs_()                             # NaN where either is NaN, inf where either is infinite
        scale = r.abs() if r is r_rows else r.abs_()      # in place only on a converted copy
        allowed = scale.mul(rtol).add_(atol)
        outside = (~(diff <= allowed * FAST_MARGIN)).sum().to(work)
        if diff.numel():
            rel = diff / scale.clamp_min_(atol)
            totals.append(torch.stack([outside, diff.max(), rel.max(), allowed.max()]))
        del o, r, diff, scale, allowed
    if not totals:
        return 0.0, 0.0
    outside, max_abs, max_rel, max_allowed = torch.stack(totals).amax(dim=0).tolist()  # the one host read
    # An infinite reference makes its bound infinite too: only the exact pass judges infinities.
    return (max_abs, max_rel) if outside == 0 and math.isfinite(max_allowed) else None


def _exact(out: torch.Tensor, ref: torch.Tensor, index: int, atol: float, rtol: float) -> tuple[list[str], dict]:
    """The float64 comparison, with NaN/infinity positions and the worst element for the reasons."""
    per_row = int(np.prod(ref.shape[1:])) if ref.dim() > 1 else 1
    nan_at = inf_at = None
    mismatches, max_abs, max_rel = 0, 0.0, 0.0
    worst = None  # (excess over the tolerance, flat index, got, expected)
    for start, stop in _slices(tuple(ref.shape)):
        o, r = _rows(out, start, stop).double(), _rows(ref, start, stop).double()
        base = start * per_row
        nan_o, nan_r = torch.isnan(o), torch.isnan(r)
        if nan_at is None and not torch.equal(nan_o, nan_r):
            nan_at = base + int(torch.argmax((nan_o != nan_r).to(torch.uint8)))
        inf_o, inf_r = torch.isinf(o), torch.isinf(r)
        bad_inf = (inf_o != inf_r) | (inf_r & (o != r))
        if inf_at is None and bool(bad_inf.any()):
            inf_at = base + int(torch.argmax(bad_inf.to(torch.uint8)))
        finite = ~(nan_r | inf_r | nan_o | inf_o)
        diff = torch.where(finite, (o - r).abs(), torch.zeros_like(o))
        allowed = atol + rtol * r.abs()
        bad = finite & (diff > allowed)
        if diff.numel():
            max_abs = max(max_abs, float(diff.max()))
            max_rel = max(max_rel, float(torch.where(finite, diff / r.abs().clamp_min(atol),
                                                     torch.zeros_like(o)).max()))
        count = int(bad.sum())
        if count:
            mismatches += count
            excess = torch.where(bad, diff - allowed, torch.full_like(diff, -1.0))
            local = int(torch.argmax(excess))
            if worst is None or float(excess[local]) > worst[0]:
                worst = (float(excess[local]), base + local, float(o[local]), float(r[local]))
        del o, r, diff, allowed, bad, finite
    reasons = []
    if nan_at is not None:
        reasons.append(f"output {index}: NaN positions differ from the reference (first at {_unravel(nan_at, ref.shape)})")
    if inf_at is not None:
        reasons.append(f"output {index}: infinities differ from the reference (first at {_unravel(inf_at, ref.shape)})")
    stats = {"max_abs_err": max_abs, "max_rel_err": max_rel, "mismatches": mismatches, "atol": atol, "rtol": rtol}
    if mismatches:
        where = _unravel(worst[1], ref.shape)
        stats["worst"] = {"index": where, "got": worst[2], "expected": worst[3]}
        reasons.append(
            f"output {index}: {mismatches} of {ref.numel()} elements outside atol={atol} rtol={rtol}; "
            f"max abs error {max_abs:.3g}, worst at {where}: got {worst[2]:.6g}, expected {worst[3]:.6g}")
    return reasons, stats


def against_float64(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor, atol: float,
                    rtol: float, moved: torch.Tensor | None = None) -> tuple[int, float, float]:
    """The output judged against the float64 truth, element by element: how many elements are further from it than
    their tolerance (atol + rtol |exact|), twice the reference's own distance there, and SENSITIVITY_FACTOR times
    |moved - ref| (moved: the float32 reference on inputs moved by one rounding step; None: not known); and, for
    the reasons, the largest distance of the output and of the reference, in tolerances. Elements not finite in
    all of them are left out (NaN and infinity positions were compared already)."""
    bad = torch.zeros((), dtype=torch.int64, device=ref.device)
    own = torch.zeros((), dtype=torch.float64, device=ref.device)
    theirs = torch.zeros((), dtype=torch.float64, device=ref.device)
    for start, stop in _slices(tuple(ref.shape)):
        o, r = _rows(out, start, stop).double(), _rows(ref, start, stop).double()
        e = _rows(exact, start, stop).to(device=ref.device, dtype=torch.float64)
        finite = torch.isfinite(o) & torch.isfinite(r) & torch.isfinite(e)
        tol = e.abs().mul_(rtol).add_(atol)
        d_own, d_ref = (o - e).abs_().masked_fill_(~finite, 0.0), (r - e).abs_().masked_fill_(~finite, 0.0)
        allowed = torch.maximum(tol, 2 * d_ref)
        if moved is not None:
            m = _rows(moved, start, stop).double()
            allowed = torch.maximum(allowed, (m - r).abs_().mul_(SENSITIVITY_FACTOR).nan_to_num_(nan=0.0, posinf=0.0))
            del m
        bad += (d_own > allowed).sum()
        own = torch.maximum(own, (d_own / tol).max()) if d_own.numel() else own
        theirs = torch.maximum(theirs, (d_ref / tol).max()) if d_ref.numel() else theirs
        del o, r, e, finite, tol, d_own, d_ref, allowed
    return int(bad), float(own), float(theirs)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs included), a slice at a time, with one host read: did forward leave this input
    unchanged?"""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    differ = torch.zeros((), dtype=torch.bool, device=b.device)
    bits = SAME_SIZE_INTEGER.get(a.element_size(), torch.uint8)
    for start, stop in _slices(tuple(a.shape)):
        x, y = _rows(a, start, stop), _rows(b, start, stop)
        if bits is torch.uint8:
            x, y = x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)
        else:   # one integer per element: a quarter of the comparisons of bytes for float32
            x, y = x.view(bits), y.view(bits)
        differ |= (x != y).any()
    return not bool(differ)


def _unravel(flat: int, shape) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, tuple(shape))] if len(shape) else []
