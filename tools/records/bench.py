"""The numbers behind `kloop bench`: device ceilings (copy bandwidth, cuBLAS), per-target rows, geomeans, goals.

GPU measurements use tools.profile.time_interleaved in this process, so the ceilings are measured the same way and
in the same session as the kernels they are compared with. Everything else works on evaluator results and the
run database's Attempts, and runs anywhere.
"""
from __future__ import annotations

import statistics

from tools.result import EvalResult
from tools.records.store import Attempt, fastest_key
from tools.records.suite_report import geomean

MEMORY_BOUND = ("vector_add", "gelu", "softmax", "layernorm", "rmsnorm", "row_sum")
MATMUL = ("matmul_bf16", "matmul_bias_relu")
COPY_BYTES = 2**30          # the copy ceiling depends on size (128 MiB reaches less than 1 GiB): use a large one
GOAL_COPY_FRACTION = 0.9
GOAL_CUBLAS_FRACTION = 0.95
GOAL_GEOMEAN_EAGER = 1.2
GOAL_CANDIDATES_PER_MINUTE = 30.0
GOAL_FUSED_OVER_COMPILE = 1.1   # matmul_bias_relu: the fused epilogue saves a pass over the output
GOAL_MATMUL_CANDIDATES = 20     # evaluated candidates per matmul target in the bench's budget


def copy_bandwidth(nbytes: int = COPY_BYTES, calls: int = 30) -> dict | None:
    """Device-to-device copy of `nbytes`, counted as bytes read + written; None without a CUDA GPU."""
    import torch

    from tools.profile import time_interleaved

    if not torch.cuda.is_available():
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    timing = time_interleaved({"copy": lambda: dst.copy_(src)}, calls=calls)["copy"]
    del src, dst
    torch.cuda.empty_cache()   # give the 2 GiB back before candidates run
    return {"bytes_per_copy": nbytes, "bytes_moved": 2 * nbytes, "time_us": timing,
            "gbps": 2 * nbytes / (timing["median"] * 1e3)}


def cublas_matmul(m: int, n: int, k: int, dtype=None, calls: int = 30) -> dict | None:
    """torch.matmul (cuBLAS) of an m x k by k x n product in `dtype` (bf16 by default); None without a CUDA GPU."""
    import torch

    from tools.profile import time_interleaved

    if not torch.cuda.is_available():
        return None
    dtype = dtype or torch.bfloat16
    a = torch.randn(m, k, dtype=dtype, device="cuda")
    b = torch.randn(k, n, dtype=dtype, device="cuda")
    out = torch.empty(m, n, dtype=dtype, device="cuda")
    timing = time_interleaved({"cublas": lambda: torch.matmul(a, b, out=out)}, calls=calls)["cublas"]
    del a, b, out
    torch.cuda.empty_cache()
    return {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "time_us": timing,
            "tflops": 2 * m * n * k / (timing["median"] * 1e6)}


def matmul_shape(target, small: bool) -> tuple[int, int, int]:
    """(M, N, K) of a matmul target's main shape, read from its module at that shape."""
    module = target.module_for(target.shapes(small)[0])
    return module.M, module.N, module.K


def kind_of(target_name: str) -> str:
    return "memory" if target_name in MEMORY_BOUND else "matmul" if target_name in MATMUL else "other"


def fastest_by_language(attempts: list[Attempt]) -> dict[str, dict | None]:
    """The fastest correct Triton and PTX attempts of a run (tools.records.store.fastest_key), or None: the table's
    best_triton / best_ptx columns, which need not hold the run's best."""
    fastest = {}
    for language in ("triton", "ptx"):
        correct = [a for a in attempts if a.verdict == "correct" and a.language == language]
        top = min(correct, key=fastest_key, default=None)
        fastest[language] = {"attempt": top.number, "time_us": top.median_us,
                             "speedup_eager": top.speedup_eager} if top else None
    return fastest


def evaluation_seconds(attempts: list[Attempt]) -> dict[str, float | None]:
    """Medians over evaluated attempts, in seconds, from the evaluator's own durations: `beyond_compile` (its busy
    time less the planner's compile and the kernel's timed calls), `device` (load + verify + profile: the GPU's time
    per candidate, which bounds a pipelined run's rate) and `compile` (the planner's builds)."""
    found: dict[str, list[float]] = {"beyond_compile": [], "device": [], "compile": []}
    for a in attempts:
        d = a.durations or {}
        if d.get("busy") is None:
            continue
        build = (d.get("waited") or {}).get("planner:build", 0.0)
        kernel_s = ((a.time_us.events_total_ms if a.time_us else None) or 0.0) / 1000
        found["beyond_compile"].append(d["busy"] - build - kernel_s)
        found["compile"].append(build)
        if d.get("load") is not None:
            found["device"].append(sum(d.get(k, 0.0) for k in ("load", "verify", "profile")))
    return {k: statistics.median(v) if v else None for k, v in found.items()}


def evaluator_overhead_s(attempts: list[Attempt]) -> float | None:
    """Median over attempts of (attempt wall time - the candidate's own kernel time in its timed calls), seconds."""
    overheads = []
    for a in attempts:
        wall = (a.durations or {}).get("attempt")
        if wall is not None:
            kernel_ms = (a.time_us.events_total_ms if a.time_us else None) or 0.0
            overheads.append(wall - kernel_ms / 1000)
    return statistics.median(overheads) if overheads else None


def target_row(name: str, run_id: str, attempts: list[Attempt], best: Attempt | None, final: EvalResult | None,
               loop_seconds: float, copy: dict | None, cublas: dict | None) -> dict:
    """One table row: the final interleaved measurement of the best attempt (`final`: its evaluator result, timed
    together with eager and compile), the run's attempt statistics, and the achieved rate against the device ceiling
    that fits the target (copy bandwidth or cuBLAS)."""
    final = final or EvalResult()
    baselines = {k: v.__dict__ for k, v in (final.baselines or {}).items()}
    roof = final.roofline
    best_us = final.median_us
    kind = kind_of(name)
    gbps = roof.bytes / (best_us * 1e3) if best_us and roof and roof.bytes else None
    tflops = roof.flops / (best_us * 1e6) if best_us and roof and roof.flops else None
    copy_gbps = (copy or {}).get("gbps")
    cublas_tflops = (cublas or {}).get("tflops")
    per_language = fastest_by_language(attempts)
    return {
        "target": name, "kind": kind, "run_id": run_id,
        "best_attempt": best.number if best else None, "best_language": best.language if best else None,
        "final_verdict": final.verdict, "final_reasons": final.reasons,
        "eager_us": (baselines.get("eager") or {}).get("median"),
        "compile_us": (baselines.get("compile") or {}).get("median"),
        "best_us": best_us,
        "timings_us": {"best": final.time_us.__dict__ if final.time_us else None, "eager": baselines.get("eager"),
                       "compile": baselines.get("compile")},
        "speedup_eager": final.speedup_over("eager"), "speedup_compile": final.speedup_over("compile"),
        "sol_fraction": final.sol_fraction,
        "achieved_gbps": gbps, "achieved_tflops": tflops,
        "copy_gbps": copy_gbps if kind == "memory" else None,
        "copy_fraction": gbps / copy_gbps if kind == "memory" and gbps and copy_gbps else None,
        "cublas": cublas, "cublas_tflops": cublas_tflops,
        "cublas_fraction": tflops / cublas_tflops if tflops and cublas_tflops else None,
        "attempts": len(attempts),
        "loop_seconds": loop_seconds,
        "attempts_per_minute": len(attempts) / (loop_seconds / 60) if loop_seconds > 0 else None,
        "overhead_s_median": evaluator_overhead_s(attempts),
        **{f"{k}_s_median": v for k, v in evaluation_seconds(attempts).items()},
        "best_triton": per_language["triton"], "best_ptx": per_language["ptx"],
        "flags": final.flags,
    }


def goals(rows: list[dict], minutes_per_target: float, timing_is_real: bool) -> list[dict]:
    """The bench's pass/fail list: {goal, passed (True/False, None = not measurable here), detail}."""
    def check(goal: str, subjects: list[dict], value_of, ok, fmt, measurable: bool = True) -> dict:
        if not subjects:
            return {"goal": goal, "passed": None, "detail": "no such target in this bench"}
        if not measurable:
            return {"goal": goal, "passed": None, "detail": "not measured: no CUDA GPU, so no timing is real"}
        values = {r["target"]: value_of(r) for r in subjects}
        missing = [t for t, v in values.items() if v is None]
        failing = [t for t, v in values.items() if v is not None and not ok(v)]
        parts = [f"{t} {fmt(v) if v is not None else 'no result'}" for t, v in values.items()]
        return {"goal": goal, "passed": not missing and not failing, "detail": ", ".join(parts)}

    memory = [r for r in rows if r["kind"] == "memory"]
    matmul = [r for r in rows if r["kind"] == "matmul"]
    eager_geomean = geomean([r["speedup_eager"] for r in rows])
    return [
        check(f"memory-bound targets >= {GOAL_COPY_FRACTION:.0%} of measured copy bandwidth", memory,
              lambda r: r["copy_fraction"], lambda v: v >= GOAL_COPY_FRACTION, "{:.0%}".format, timing_is_real),
        check("every target >= 1.0x torch.compile", rows, lambda r: r["speedup_compile"], lambda v: v >= 1.0,
              "{:.2f}x".format, timing_is_real),
        {"goal": f"geomean >= {GOAL_GEOMEAN_EAGER:g}x eager",
         "passed": (eager_geomean is not None and eager_geomean >= GOAL_GEOMEAN_EAGER) if timing_is_real else None,
         "detail": (f"{eager_geomean:.2f}x" if eager_geomean else "no speedups") if timing_is_real
         else "not measured: no CUDA GPU, so no timing is real"},
        check(f"bf16 matmul >= {GOAL_CUBLAS_FRACTION:.0%} of cuBLAS", matmul, lambda r: r["cublas_fraction"],
              lambda v: v >= GOAL_CUBLAS_FRACTION, "{:.0%}".format, timing_is_real),
        check(f"each target's loop within {minutes_per_target:g} min", rows, lambda r: r["loop_seconds"],
              lambda v: v <= minutes_per_target * 60, "{:.0f} s".format),
        check(f">= {GOAL_CANDIDATES_PER_MINUTE:g} evaluated candidates per minute (small targets)", memory,
              lambda r: r["attempts_per_minute"], lambda v: v >= GOAL_CANDIDATES_PER_MINUTE, "{:.1f}/min".format,
              timing_is_real),
        check(f"matmul_bias_relu >= {GOAL_FUSED_OVER_COMPILE:g}x torch.compile (fused epilogue)",
              [r for r in rows if r["target"] == "matmul_bias_relu"], lambda r: r["speedup_compile"],
              lambda v: v >= GOAL_FUSED_OVER_COMPILE, "{:.2f}x".format, timing_is_real),
        check(f">= {GOAL_MATMUL_CANDIDATES} evaluated candidates per matmul target", matmul, lambda r: r["attempts"],
              lambda v: v >= GOAL_MATMUL_CANDIDATES, "{:d}".format, timing_is_real),
    ]
