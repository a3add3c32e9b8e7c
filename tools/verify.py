"""Comparing a candidate's outputs with the reference's, in a trusted process, a chunk at a time.

Two rules, both must hold for every output.

**Each element** passes when |out - ref| <= atol + rtol * |ref|, where atol is the dtype's (table) but never more than
SCALE_ATOL x the output's RMS (an output whose every element lies below the dtype's atol, like a softmax over 2^17
columns, is still judged element by element), nor less than ATOL_FLOOR (rounding of subnormals):

| dtype | atol | rtol | SCALE_ATOL (x RMS) | NORM_FLOOR |
|---|---|---|---|---|
| float64 | 1e-7 | 1e-7 | 1e-6 | 2^-40 |
| float32 | 1e-4 | 1e-4 | 1e-3 | 2^-14 (6.1e-5) |
| float16 | 1e-2 | 1e-2 | 1e-2 | 2^-9 (2.0e-3) |
| bfloat16 | 2e-2 | 2e-2 | 2e-2 | 2^-7 (7.8e-3) |
| integers, bool | exact | exact | | |

**The output as a whole** passes when its relative L2 error ||out - ref|| / ||ref|| is at most NORM_FLOOR: what
arithmetic in the target's dtype allows (float32 rounding, honest reorderings, Welford, online softmax, 3xTF32 or
bf16x3 land near 1e-6; a blocked sum over a million terms reached 2.9e-5 on an H200, KernelBench level 1's matrix-
vector product), and well below what coarser arithmetic makes (fp16 or TF32 operands for a float32 target: ~3e-4;
bf16: ~3e-3). An output within every element's tolerance can fail here: a GEMM that reads float32 operands as
float16 stays under atol where the outputs are small, but not under the norm.

Input families other than the target's own (tools/inputs.py) are judged against the output's scale: atol grows by
rtol * max|ref|, since sums of terms of both signs cancel (a cumsum's or a sum's rounding error follows the terms'
magnitude, not the result's); a kernel that skips the op on negative inputs is off by O(1) there. Where such a family
leaves the reference non-finite (log of negative inputs) those elements are masked, not compared; where the
reference overflows or comes within 2^10 of the dtype's largest value anywhere in a row (the last dimension), that
whole row is (a cumprod of large inputs: another order of the same products overflows a step apart).

A float32 reference is itself rounded: over a long sum its error alone can exceed either rule, so an output outside
them is judged once more against the reference computed in float64 (sandbox/referee.py, memory permitting): each
element must be within its tolerance of that, or no further from it than twice the reference is there, or than
SENSITIVITY_FACTOR times the distance the float32 reference moves when its inputs move by one rounding step (where a
sum's terms cancel, any other summation order is that far off, and the reference is only luckily near), or than twice
the largest of either among its LOCAL_BLOCK neighbours in memory order (each of those is one draw of rounding noise,
and one draw can be near 0 by luck: an honest float32 LayerNorm of rows of tiny spread had about 4 of every 100
elements further than all three from the truth, yet its worst was half the reference's; a wrong element among well-
conditioned ones still stands out, as its neighbours' rounding is small); and the output's relative L2 distance from
the float64 truth must be within NORM_FLOOR, or NORM_REFERENCE_FACTOR times the reference's own. Lower precision stays
out: TF32 rounds 2^13 times coarser than float32, bfloat16 2^16 times.

Where elements still fall outside all of that, the output is judged as the reference's peer (`exchanged`): the same
rule both ways, the output against the reference's distances and the reference against the output's. An honest
kernel in another float32 order and the reference are two draws of the same rounding noise, so each is as often
beyond the other's; where lucky draws make a whole region of the reference's noise small (InstanceNorm of a
convolution on small inputs: each channel's mean rounds once, and its bias dwarfs its product), elements of an
honest kernel are beyond it, and as many of the reference's are beyond the kernel's. So the output passes when it has
at most EXCHANGE_FACTOR times as many such elements as the reference, plus EXCHANGE_SLACK of its elements (one in a
million), and its worst is at most WORST_FACTOR times the worst of the reference's two float32 draws (itself and its
rerun on inputs moved by a rounding step), in tolerances: near chaos one draw's worst is a poor estimate of another's
(a 512-step GRU's hidden state on large inputs: the reference 257 tolerances off, an honest kernel 576). Where
either draw is CHAOTIC tolerances off the truth somewhere, the op is chaotic on these inputs (a rounding error flips
a saturated gate, and the flip carries to every later step: two float32 runs diverge in different places), so the
counts are waived; the worst and the norm still bound the output. Coarser arithmetic is
beyond the reference at most of its elements and the reference beyond it at almost none; a sparse wrong element is
further off than the reference anywhere.

NaN and infinity must sit at the same positions (infinities with the same sign); they are left out of the numeric
comparison. TF32 is off for reference and candidate alike (tools/numerics.py), so float32 means float32.
Work is done in slices of about CHUNK elements along the first dimension, so comparing a 6 GB output costs a few
hundred MB of temporaries, never a float64 copy of the whole thing.

Speed (every timed call is checked, so this runs dozens of times per candidate): a first pass works in the
output's own precision (float32 for half types; its sums of squares in float64), on device, with one host read at
the end, and accepts an output only when every element is finite and within 0.999 of its tolerance, where float32
rounding cannot change the answer, and its norm is within the floor. On a GPU, for contiguous tensors, that pass is
one Triton kernel reading each tensor once: 0.31 ms for a float32 output of 2^26 elements on an H100, where torch's
dozen elementwise passes took 2.96 ms (tests/experiments/check_cost.py), and a candidate's outputs are checked about
50 times. Anything else (a NaN or infinity anywhere, an element near or over its bound, the norm over its floor) is
judged by the exact float64 pass, which finds the positions and the worst element for the reasons.
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
SCALE_ATOL = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 2e-2}
# The smallest atol: rounding near 0 (float16's subnormal spacing is 2^-24; Triton flushes float32 subnormals).
ATOL_FLOOR = {torch.float64: 2.0 ** -1022, torch.float32: 2.0 ** -126, torch.float16: 2.0 ** -23,
              torch.bfloat16: 2.0 ** -126}
NORM_FLOOR = {torch.float64: 2.0 ** -40, torch.float32: 2.0 ** -14, torch.float16: 2.0 ** -9,
              torch.bfloat16: 2.0 ** -7}
NORM_REFERENCE_FACTOR = 8.0  # against float64: an output may be this many times further off than the reference is
CHUNK = 1 << 24  # elements per slice: 128 MiB as float64
SENSITIVITY_FACTOR = 8.0  # against_float64: allowed distance, in units of the reference's own rounding sensitivity
LOCAL_BLOCK = 1024  # against_float64: elements (in memory order) whose rounding noise an element may share
EXCHANGE_FACTOR = 2.0  # exchanged: an output may be beyond the reference this many times as often as the reverse,
EXCHANGE_SLACK = 1e-6  # plus this fraction of its elements (EXCHANGE_MIN_SLACK at least),
EXCHANGE_MIN_SLACK = 16
WORST_FACTOR = 2.0     # and its worst this many times as far off as the reference's worst
# a_peer_of_the_reference: a float32 reference this many tolerances off the float64 truth (10% of a value, where the
# rounding of one step is 1e-7) is on another trajectory: a GRU of 512 steps on large inputs, whose saturated gates
# flip on a rounding error and carry the flip to every later step (the reference 4330 tolerances off; an honest
# float32 GRU was refused by the counts on 1 of 50 such checks, a 3xTF32 one on the GPU likewise)
CHAOTIC = 1000.0
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


def compare(out: torch.Tensor, ref: torch.Tensor, index: int = 0, to_scale: bool = False,
            masked: bool = False) -> tuple[list[str], dict]:
    """Reasons the output is wrong (empty if right) and the error statistics. to_scale: atol grows by
    rtol * max|ref| (input families other than the target's own); masked: elements where the reference is not
    finite are not compared (such a family left the op's domain there). stats["norm_off"] says the output failed
    the norm rule (and how far), "mismatches" counts the elements that failed theirs."""
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
    base_atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    fast = _fast_pass(out, ref, masked)
    atol = effective_atol(ref.dtype, fast.rms, fast.ref_max if to_scale else 0.0)
    floor = NORM_FLOOR.get(ref.dtype, 2.0 ** -14)
    stats = {"atol": atol, "rtol": rtol, "norm_err": fast.norm_err, "norm_floor": floor, "rms": fast.rms,
             "compared": fast.count}
    if fast.finite and fast.excess <= FAST_MARGIN * atol and fast.norm_err <= floor * FAST_MARGIN:
        return [], {**stats, "max_abs_err": fast.max_abs, "max_rel_err": fast.max_rel, "mismatches": 0}
    reasons, exact_stats = _exact(out, ref, index, atol, rtol, masked)
    stats.update(exact_stats)
    norm_reason = [] if fast.norm_err <= floor else [
        f"output {index}: off by {fast.norm_err:.3g} of its norm (relative L2 error), over the {floor:.3g} that "
        f"{str(ref.dtype).removeprefix('torch.')} arithmetic allows (coarser arithmetic: lower-precision operands, "
        "an approximate function, a skipped term)"]
    if norm_reason:
        stats["norm_off"] = fast.norm_err
    return reasons + norm_reason, stats


def _outside_overflowing_rows(r: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Of a slice of whole rows (the last dimension) of the reference, as float64: the elements of rows in which the
    reference nowhere overflows or nears it. Where a product or scan overflows, another order of the same products
    overflows at other elements of that row (a cumprod of negative inputs: +-inf a step apart, inf * 0 = NaN)."""
    big = (r.isinf() | (r.abs() > _near_overflow(ref.dtype)))
    width = ref.shape[-1] if ref.dim() and ref.shape[-1] else 1
    if r.numel() % width:
        return ~big
    return ~big.view(-1, width).any(dim=1, keepdim=True).expand(-1, width).reshape(-1)


def _near_overflow(dtype: torch.dtype) -> float:
    """Masked comparisons leave out reference elements this large too: another order of the same products
    overflows a step earlier or later (a cumprod of large inputs)."""
    return torch.finfo(dtype).max * 2.0 ** -10


def effective_atol(dtype: torch.dtype, rms: float, ref_max: float = 0.0) -> float:
    """The dtype's atol, at most SCALE_ATOL x the output's RMS and at least ATOL_FLOOR; plus rtol x ref_max (the
    output's scale, for input families other than the target's own). Three significant digits (it is printed)."""
    atol, rtol = TOLERANCES.get(dtype, (1e-4, 1e-4))
    atol = max(min(atol, SCALE_ATOL.get(dtype, 1e-3) * rms), ATOL_FLOOR.get(dtype, 2.0 ** -126))
    return float(f"{atol + rtol * ref_max:.3g}")


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


class FastPass:
    """What the first pass found over the compared elements: whether every one is finite (out and ref), the largest
    |out - ref| - FAST_MARGIN x rtol |ref| (`excess`: an element is clearly inside atol when this is below
    FAST_MARGIN x atol), the largest absolute and relative errors, the reference's RMS and largest |element|, and the
    relative L2 error ||out - ref|| / ||ref||."""

    def __init__(self, finite: bool, excess: float, max_abs: float, max_rel: float, ref_sq: float, diff_sq: float,
                 ref_max: float, count: float, dtype: torch.dtype) -> None:
        self.finite, self.excess, self.max_abs, self.max_rel = finite, excess, max_abs, max_rel
        self.ref_max, self.count = ref_max, int(count)
        self.rms = math.sqrt(ref_sq / count) if count and math.isfinite(ref_sq) else 0.0
        # An all-zero reference: any error beyond rounding near 0 is all of its norm.
        slack = math.sqrt(count) * ATOL_FLOOR.get(dtype, 2.0 ** -126)
        self.norm_err = math.sqrt(diff_sq) / math.sqrt(ref_sq) if ref_sq > 0 else \
            (0.0 if math.sqrt(diff_sq) <= slack else math.inf)
        if not (math.isfinite(ref_sq) and math.isfinite(diff_sq)):
            self.finite = False


def _fast_pass(out: torch.Tensor, ref: torch.Tensor, masked: bool) -> FastPass:
    """The first pass's statistics. Never writes into `out` or `ref` (the executor's memory and the reference)."""
    rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))[1]
    if ref.is_cuda and out.is_cuda and out.is_contiguous() and ref.is_contiguous() and ref.numel():
        return _fast_pass_fused(out, ref, rtol, masked)
    return _fast_pass_torch(out, ref, rtol, masked)


FUSED_BLOCK = 4096
FUSED_STATS = 8   # bad, excess, max abs, max rel, sum ref^2, sum diff^2, max |ref|, count


@triton.jit
def _within_kernel(out_ptr, ref_ptr, partial_ptr, n, programs, rtol_margin, tiny, big, WIDE: tl.constexpr,
                   MASKED: tl.constexpr, BLOCK: tl.constexpr):
    """Per program, over its BLOCK elements, FUSED_STATS values in _fast_pass_torch's arithmetic (sums in float64):
    whether any compared element is not finite, the largest excess over the relative tolerance, the largest
    absolute and relative errors, the sums of squares of ref and of out - ref, the largest |ref|, the elements
    compared. MASKED: elements whose reference is not finite are not compared."""
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    work = tl.float64 if WIDE else tl.float32
    o = tl.load(out_ptr + offsets, mask=mask, other=0).to(work)
    r = tl.load(ref_ptr + offsets, mask=mask, other=0).to(work)
    r_finite = tl.abs(r) < float("inf")
    o_finite = tl.abs(o) < float("inf")
    if MASKED:
        mask = mask & r_finite & (tl.abs(r) <= big)
    bad = mask & ~(r_finite & o_finite)
    keep = mask & r_finite & o_finite
    o = tl.where(keep, o, 0)
    r = tl.where(keep, r, 0)
    diff = tl.abs(o - r)
    scale = tl.abs(r)
    excess = diff - scale * rtol_margin
    rel = diff / tl.maximum(scale, tiny)
    d64 = diff.to(tl.float64)
    r64 = r.to(tl.float64)
    tl.store(partial_ptr + pid, tl.max(bad.to(work), axis=0))
    tl.store(partial_ptr + programs + pid, tl.max(tl.where(keep, excess, -float("inf")), axis=0))
    tl.store(partial_ptr + 2 * programs + pid, tl.max(diff, axis=0))
    tl.store(partial_ptr + 3 * programs + pid, tl.max(rel, axis=0))
    tl.store(partial_ptr + 4 * programs + pid, tl.sum(r64 * r64, axis=0))
    tl.store(partial_ptr + 5 * programs + pid, tl.sum(d64 * d64, axis=0))
    tl.store(partial_ptr + 6 * programs + pid, tl.max(scale, axis=0))
    tl.store(partial_ptr + 7 * programs + pid, tl.sum(keep.to(tl.float64), axis=0))


def _fast_pass_fused(out: torch.Tensor, ref: torch.Tensor, rtol: float, masked: bool = False) -> FastPass:
    """_fast_pass_torch's answer from one kernel over contiguous tensors: each is read once."""
    n = ref.numel()
    programs = triton.cdiv(n, FUSED_BLOCK)
    partial = torch.empty((FUSED_STATS, programs), dtype=torch.float64, device=ref.device)
    _within_kernel[(programs,)](out.reshape(-1), ref.reshape(-1), partial, n, programs, rtol * FAST_MARGIN,
                                ATOL_FLOOR.get(ref.dtype, 2.0 ** -126), _near_overflow(ref.dtype),
                                WIDE=ref.dtype == torch.float64,
                                MASKED=masked, BLOCK=FUSED_BLOCK)
    maxima = partial.amax(dim=1)
    sums = partial.sum(dim=1)
    bad, excess, max_abs, max_rel, _, _, ref_max, _ = maxima.tolist()   # one host read each
    _, _, _, _, ref_sq, diff_sq, _, count = sums.tolist()
    return FastPass(bad == 0, excess, max_abs, max_rel, ref_sq, diff_sq, ref_max, count, ref.dtype)


def _fast_pass_torch(out: torch.Tensor, ref: torch.Tensor, rtol: float, masked: bool = False) -> FastPass:
    """The first pass with torch's elementwise ops, a slice at a time (the CPU, and strided tensors)."""
    work = torch.float64 if ref.dtype == torch.float64 else torch.float32
    tiny = ATOL_FLOOR.get(ref.dtype, 2.0 ** -126)
    totals = []
    for start, stop in _slices(tuple(ref.shape)):
        o, r = _rows(out, start, stop).to(work), _rows(ref, start, stop).to(work)
        if not r.numel():
            continue
        r_finite, o_finite = torch.isfinite(r), torch.isfinite(o)
        compared = (r_finite & (r.abs() <= _near_overflow(ref.dtype))) if masked else torch.ones_like(r_finite)
        bad = (compared & ~(r_finite & o_finite)).any()
        keep = compared & r_finite & o_finite
        o = torch.where(keep, o, torch.zeros((), dtype=work, device=o.device))
        r = torch.where(keep, r, torch.zeros((), dtype=work, device=r.device))
        diff = (o - r).abs_()
        scale = r.abs()
        excess = torch.where(keep, diff - scale * (rtol * FAST_MARGIN),
                             torch.full((), -math.inf, dtype=work, device=r.device))
        rel = diff / scale.clamp_min(tiny)
        d64, r64 = diff.double(), r.double()
        totals.append(torch.stack([bad.double(), excess.max().double(), diff.max().double(), rel.max().double(),
                                   (r64 * r64).sum(), (d64 * d64).sum(), scale.max().double(),
                                   keep.sum().double()]))
        del o, r, diff, scale, excess, rel, d64, r64, keep, compared
    if not totals:
        return FastPass(True, -math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, ref.dtype)
    stacked = torch.stack(totals)
    maxima, sums = stacked.amax(dim=0).tolist(), stacked.sum(dim=0).tolist()   # the one host read
    return FastPass(maxima[0] == 0, maxima[1], maxima[2], maxima[3], sums[4], sums[5], maxima[6], sums[7], ref.dtype)


def _exact(out: torch.Tensor, ref: torch.Tensor, index: int, atol: float, rtol: float,
           masked: bool = False) -> tuple[list[str], dict]:
    """The float64 comparison, with NaN/infinity positions and the worst element for the reasons. masked: elements
    whose reference is not finite are not compared."""
    per_row = int(np.prod(ref.shape[1:])) if ref.dim() > 1 else 1
    nan_at = inf_at = None
    mismatches, max_abs, max_rel = 0, 0.0, 0.0
    worst = None  # (excess over the tolerance, flat index, got, expected)
    for start, stop in _slices(tuple(ref.shape)):
        o, r = _rows(out, start, stop).double(), _rows(ref, start, stop).double()
        base = start * per_row
        nan_o, nan_r = torch.isnan(o), torch.isnan(r)
        inf_o, inf_r = torch.isinf(o), torch.isinf(r)
        compared = ~(nan_r | inf_r) & _outside_overflowing_rows(r, ref) if masked else torch.ones_like(nan_r)
        if nan_at is None and not torch.equal(nan_o & compared, nan_r & compared):
            nan_at = base + int(torch.argmax(((nan_o != nan_r) & compared).to(torch.uint8)))
        bad_inf = ((inf_o != inf_r) | (inf_r & (o != r))) & compared
        if inf_at is None and bool(bad_inf.any()):
            inf_at = base + int(torch.argmax(bad_inf.to(torch.uint8)))
        finite = ~(nan_r | inf_r | nan_o | inf_o) & compared
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
        del o, r, diff, allowed, bad, finite, compared
    reasons = []
    if nan_at is not None:
        reasons.append(f"output {index}: NaN positions differ from the reference (first at {_unravel(nan_at, ref.shape)})")
    if inf_at is not None:
        reasons.append(f"output {index}: infinities differ from the reference (first at {_unravel(inf_at, ref.shape)})")
    stats = {"max_abs_err": max_abs, "max_rel_err": max_rel, "mismatches": mismatches, "atol": atol, "rtol": rtol}
    if nan_at is not None or inf_at is not None:
        stats["nonfinite_off"] = True
    if mismatches:
        where = _unravel(worst[1], ref.shape)
        stats["worst"] = {"index": where, "got": worst[2], "expected": worst[3]}
        reasons.append(
            f"output {index}: {mismatches} of {ref.numel()} elements outside atol={atol} rtol={rtol}; "
            f"max abs error {max_abs:.3g}, worst at {where}: got {worst[2]:.6g}, expected {worst[3]:.6g}")
    return reasons, stats


def norm_against_float64(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """The relative L2 distances of the output and of the reference from the float64 truth, over the elements
    finite in all three."""
    sums = torch.zeros(3, dtype=torch.float64, device=ref.device)
    for start, stop in _slices(tuple(ref.shape)):
        o, r = _rows(out, start, stop).double(), _rows(ref, start, stop).double()
        e = _rows(exact, start, stop).to(device=ref.device, dtype=torch.float64)
        finite = torch.isfinite(o) & torch.isfinite(r) & torch.isfinite(e)
        e = e.masked_fill(~finite, 0.0)
        sums += torch.stack([e.square().sum(), (o - e).masked_fill_(~finite, 0.0).square().sum(),
                             (r - e).masked_fill_(~finite, 0.0).square().sum()])
        del o, r, e, finite
    truth, own, theirs = sums.sqrt().tolist()
    if truth == 0:
        return (0.0 if own == 0 else math.inf), (0.0 if theirs == 0 else math.inf)
    return own / truth, theirs / truth


def against_float64(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor, atol: float,
                    rtol: float, moved: torch.Tensor | None = None) -> tuple[int, float, float]:
    """The output judged against the float64 truth, element by element: how many elements are further from it than
    their tolerance (atol + rtol |exact|), twice the reference's own distance there, SENSITIVITY_FACTOR times
    |moved - ref| (moved: the float32 reference on inputs moved by one rounding step; None: not known), and twice
    the largest of those two distances in the element's block of LOCAL_BLOCK; and, for the reasons, the largest
    distance of the output and of the reference's two float32 draws (the reference, and the moved one), in
    tolerances. Elements not finite in all of them are left out (NaN and infinity positions were compared
    already)."""
    bad = torch.zeros((), dtype=torch.int64, device=ref.device)
    own = torch.zeros((), dtype=torch.float64, device=ref.device)
    theirs = torch.zeros((), dtype=torch.float64, device=ref.device)
    for (start, stop), r, tol, d_own, d_ref, e in _float64_distances(out, ref, exact, atol, rtol):
        allowed = torch.maximum(tol, 2 * d_ref)
        noise = d_ref   # the reference's rounding noise at each element: its error and its move
        if moved is not None:
            m = _rows(moved, start, stop).double()
            move = (m - r).abs_().nan_to_num_(nan=0.0, posinf=0.0)
            allowed = torch.maximum(allowed, move * SENSITIVITY_FACTOR)
            noise = torch.maximum(d_ref, move)
            d_moved = (m - e).abs_().nan_to_num_(nan=0.0, posinf=0.0)
            theirs = torch.maximum(theirs, (d_moved / tol).max()) if d_moved.numel() else theirs
            del m, move, d_moved
        bad += _beyond_local(d_own, allowed, noise)
        own = torch.maximum(own, (d_own / tol).max()) if d_own.numel() else own
        theirs = torch.maximum(theirs, (d_ref / tol).max()) if d_ref.numel() else theirs
        del r, tol, d_own, d_ref, allowed, noise, e
    return int(bad), float(own), float(theirs)


def exchanged(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor, atol: float,
              rtol: float) -> tuple[int, int]:
    """against_float64's rule without the move, both ways: how many elements of the output are further from the
    float64 truth than their tolerance, twice the reference there and twice the reference's largest distance among
    their LOCAL_BLOCK neighbours; and how many of the reference's are so beyond the output."""
    beyond_out = torch.zeros((), dtype=torch.int64, device=ref.device)
    beyond_ref = torch.zeros((), dtype=torch.int64, device=ref.device)
    for _, _, tol, d_out, d_ref, _ in _float64_distances(out, ref, exact, atol, rtol):
        beyond_out += _beyond_local(d_out, torch.maximum(tol, 2 * d_ref), d_ref)
        beyond_ref += _beyond_local(d_ref, torch.maximum(tol, 2 * d_out), d_out)
        del tol, d_out, d_ref
    return int(beyond_out), int(beyond_ref)


def _float64_distances(out: torch.Tensor, ref: torch.Tensor, exact: torch.Tensor, atol: float, rtol: float):
    """Per slice of rows: ((start, stop), the reference in float64, each element's tolerance, the output's and the
    reference's distances from the float64 truth (0 where any of the three is not finite), the truth)."""
    for start, stop in _slices(tuple(ref.shape)):
        o, r = _rows(out, start, stop).double(), _rows(ref, start, stop).double()
        e = _rows(exact, start, stop).to(device=ref.device, dtype=torch.float64)
        finite = torch.isfinite(o) & torch.isfinite(r) & torch.isfinite(e)
        tol = e.abs().mul_(rtol).add_(atol)
        d_out, d_ref = (o - e).abs_().masked_fill_(~finite, 0.0), (r - e).abs_().masked_fill_(~finite, 0.0)
        del o, finite
        yield (start, stop), r, tol, d_out, d_ref, e


def a_peer_of_the_reference(beyond_out: int, beyond_ref: int, own: float, theirs: float, elements: int) -> bool:
    """Whether an output of `elements` elements, some beyond against_float64's rule, is still as near the float64
    truth as the reference (exchanged's counts; own and theirs: the worst distances of the output and of the
    reference's draws, in tolerances). The slack grows
    with the output: tail events of two draws of noise come in proportion to its size (level 2's 34, 268M elements:
    35 of an honest kernel's beyond the reference, 4 the other way, its worst 8.51 tolerances, the reference's 8.66).
    A reference CHAOTIC tolerances off somewhere has itself left the truth's trajectory: the counts are then the
    sizes of two draws' diverged regions, and only the worst distance (and the norm rule) compare."""
    if own > WORST_FACTOR * theirs:
        return False
    return theirs >= CHAOTIC or counts_within(beyond_out, beyond_ref, elements)


def counts_within(beyond_out: int, beyond_ref: int, elements: int) -> bool:
    """The peer rule's counts: the output beyond the reference at most EXCHANGE_FACTOR times as often as the
    reverse, plus EXCHANGE_SLACK of its elements."""
    return beyond_out <= EXCHANGE_FACTOR * beyond_ref + max(EXCHANGE_MIN_SLACK, EXCHANGE_SLACK * elements)


def _beyond_local(d_own: torch.Tensor, allowed: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """How many elements of the flat d_own are beyond both `allowed` and twice the largest `noise` in their block
    of LOCAL_BLOCK (the last block padded with zeros, which are never beyond)."""
    pad = -d_own.numel() % LOCAL_BLOCK
    d_own, allowed, noise = ((torch.nn.functional.pad(t, (0, pad)) if pad else t).view(-1, LOCAL_BLOCK)
                             for t in (d_own, allowed, noise))
    local = noise.amax(dim=1, keepdim=True).mul_(2)
    return ((d_own > allowed) & (d_own > local)).sum()


def fingerprint(t: torch.Tensor) -> list[float]:
    """Two numbers that change when the output does: the sums of its finite elements and of their squares."""
    if t.numel() == 0:
        return [0.0, 0.0]
    total = torch.zeros(2, dtype=torch.float64, device=t.device)
    for part in t.reshape(-1).split(CHUNK):
        part = part.double()
        part = part.masked_fill(~torch.isfinite(part), 0.0)
        total += torch.stack([part.sum(), part.square().sum()])
    return [round(v, 9) for v in total.tolist()]


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
