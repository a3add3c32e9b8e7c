"""The evaluator's verdict on one candidate, as one typed record.

    result = EvalResult(verdict="correct", language="triton", time_us=Timing(median=136.6, ...), ...)
    result.to_dict()                  # plain JSON (kloop eval --json, the attempts.result column)
    EvalResult.from_dict(row)         # back from JSON; unknown keys are ignored, missing ones take defaults

Every module that reads a result reads these attributes, never string keys, so a renamed field is a type error
instead of a silently missing fact. docs/design.md lists the fields; tests/test_docs.py checks that list.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

VERDICTS = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected")
# The version of the evaluator's checks (what `correct` means). A verdict records the version that gave it; `kloop
# reverify` re-judges logged kernels under today's and reports every flip. 5: the peer rule's worst against the worst
# of the reference's two float32 draws, itself and the moved one (an honest GRU of 512 steps was refused on a timed
# call, 576 tolerances off where the reference was 257; an H200, 2026-11-28), and a trial passed only as a chaotic
# op's peer drawn again, up to 3 times, until the counts judge one; 4: a reference itself verify.CHAOTIC
# tolerances off the float64 truth waives the peer rule's counts (an honest float32 GRU of 512 steps was refused on
# 1 of 50 large-input checks under 3; 2026-11-28); 3: the float64 judgement's neighbours,
# the weights in the moved reference, an output as the reference's peer (tools/verify.py; level 2's honest 3, 11, 17
# and 34 were refused under 2); 2: input families, the norm rule, scale-aware atol, guard regions, state restored
# before every call (2026-11-27); 1: before (not recorded, read as 0).
CHECKS_VERSION = 5
FAILED = frozenset(VERDICTS) - {"correct"}


@dataclass
class Timing:
    """Kernel time statistics in microseconds over `n` timed calls (cv is unitless)."""
    median: float
    q1: float | None = None
    q3: float | None = None
    iqr: float | None = None
    min: float | None = None
    max: float | None = None
    n: int | None = None
    mean: float | None = None
    cv: float | None = None
    events_total_ms: float | None = None   # sum of the CUDA-event times
    wall_total_ms: float | None = None     # host wall clock around the same calls: must bound the events
    derived_from_eager: bool = False       # torch.compile's time derived from eager's, measured beside it earlier
    compile_to_eager: float | None = None
    mode: str | None = None                # a torch.compile baseline's mode (sandbox.evaluate.COMPILE_MODES)


@dataclass
class Roofline:
    """Speed of light: the fewest bytes and FLOPs the op needs against the GPU's peaks."""
    bytes: int = 0
    flops: int = 0
    dtype: str | None = None
    bound: str | None = None               # memory or compute; None without a GPU
    memory_us: float | None = None
    compute_us: float | None = None
    sol_us: float | None = None
    sol_fraction: float | None = None      # sol_us / measured time
    peak_gbps: float | None = None
    peak_tflops: float | None = None


@dataclass
class Resources:
    """What one kernel costs the SM: from Triton's compile, ptxas -v, or the loaded function."""
    kernel: str
    source: str                            # triton, ptxas, or triton-interpreter (no resources known)
    registers: int | None = None
    spills: int | None = None              # 4-byte words, as Triton counts them
    shared_bytes: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    threads: int | None = None
    occupancy: float | None = None         # theoretical, 0..1
    launches: int | None = None            # launches of this kernel per forward


@dataclass
class Counters:
    """Nsight Compute counters of one kernel, averaged over its profiled launches."""
    launches: int = 0
    gpu_time_us: float | None = None
    dram_pct: float | None = None
    sm_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    l2_hit_pct: float | None = None
    tensor_pct: float | None = None         # tensor-pipe (wgmma/mma) cycles active, percent of peak while active
    stalls: dict[str, float] = field(default_factory=dict)
    top_stalls: list = field(default_factory=list)


@dataclass
class Correctness:
    """The main shape's checks (a hidden variant's numbers are withheld: a policy must not learn its shape)."""
    trials: int = 0                        # judged trials over all shapes (skipped ones not counted)
    shapes: int = 0
    families: list[str] = field(default_factory=list)   # input families judged at the main shape (tools/inputs.py)
    skipped: list[str] = field(default_factory=list)    # "family: why" where the reference had no answer
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    norm_err: float = 0.0                  # the largest relative L2 error of an output (tools/verify.py)
    worst: dict | None = None


@dataclass
class VsBest:
    """The paired re-measurement of a would-be new best against the standing best, interleaved in one run."""
    best_attempt: int | None               # the standing best's attempt number (None: its source was given)
    ratio: float                           # best time / this time: above 1 means this one is faster
    ci_low: float
    ci_high: float
    n: int
    outcome: str                           # faster, tie or slower


@dataclass
class EvalResult:
    verdict: str | None = None
    reasons: list[str] = field(default_factory=list)
    language: str = "triton"
    executed_on: str | None = None         # "cuda", "cpu-interpreter", or None (not run)
    time_us: Timing | None = None
    baselines: dict[str, Timing] | None = None
    speedup: dict[str, float] | None = None
    roofline: Roofline | None = None
    resources: list[Resources] = field(default_factory=list)
    ptx: dict[str, str] = field(default_factory=dict)
    sass: dict[str, str] = field(default_factory=dict)
    compile_log: str = ""
    correctness: Correctness | None = None
    nvml: dict | None = None
    ncu: dict[str, Counters] | None = None
    vs_best: VsBest | None = None
    flags: list[str] = field(default_factory=list)
    numeric_flags: dict = field(default_factory=dict)
    timing_note: str | None = None
    gpu: dict | None = None
    versions: dict = field(default_factory=dict)
    isolation: str | None = None           # how the candidate's processes were isolated (sandbox/jail.py)
    stdout: str = ""
    stderr: str = ""
    durations_s: dict = field(default_factory=dict)
    # Why a hidden variant failed, in full: for the operator (the attempts table's `withheld` column, `kloop show`,
    # `kloop eval`), never for a policy, an export or the service. `reasons` says only "hidden variant k: <verdict>",
    # so that no policy learns the hidden shapes. Not in to_dict() unless asked.
    withheld: list[str] = field(default_factory=list)
    # Why the target cannot tell a kernel from a constant (its reference's output is constant, or does not depend on
    # its inputs): such a result is still judged, but reports no speedup.
    degenerate: str | None = None
    checks: int = 0                        # CHECKS_VERSION of the checks that gave the verdict (0: before versions)

    @property
    def correct(self) -> bool:
        return self.verdict == "correct"

    @property
    def median_us(self) -> float | None:
        return self.time_us.median if self.time_us else None

    @property
    def sol_fraction(self) -> float | None:
        return self.roofline.sol_fraction if self.roofline else None

    def speedup_over(self, baseline: str) -> float | None:
        return (self.speedup or {}).get(baseline)

    def to_dict(self, withheld: bool = False) -> dict:
        """As JSON. withheld: with the operator's reasons too, between kloop's own trusted processes (a Ray run's);
        from_dict reads them back."""
        d = dataclasses.asdict(self)
        if not withheld:
            del d["withheld"]
        return d

    @classmethod
    def from_dict(cls, data: dict | None) -> "EvalResult":
        """A result read back from JSON (a database row, kloop eval --json); tolerant of older rows."""
        data = dict(data or {})
        out = _build(cls, data)
        out.time_us = _build(Timing, data.get("time_us"))
        out.baselines = {k: _build(Timing, v) for k, v in (data.get("baselines") or {}).items()
                         if isinstance(v, dict)} or None
        out.roofline = _build(Roofline, data.get("roofline"))
        out.resources = [r for r in (_build(Resources, r) for r in data.get("resources") or []) if r is not None]
        out.correctness = _build(Correctness, data.get("correctness"))
        out.ncu = {k: _build(Counters, v) for k, v in (data.get("ncu") or {}).items() if isinstance(v, dict)} or None
        out.vs_best = _build(VsBest, data.get("vs_best"))
        return out


def _build(cls, data: Any):
    """An instance of dataclass `cls` from a dict, keeping only its fields; None when `data` is not a dict or
    lacks a required field (an older row may have an empty timing)."""
    if not isinstance(data, dict):
        return None
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError:
        return None
