"""Evaluator results for tests, made by the code that makes them: timings by `profile.summarize` from samples,
rooflines by `profile.roofline`, Nsight Compute counters by `profile.parse_ncu_csv` from the CSV ncu writes,
speedups by the evaluator's own `_speedups`, resources and correctness as their typed records, and attempt columns
by `tools.records.store.attempt_columns`. A fixture written by hand can say what no producer says: a counter key that the
prompts read and the profiler never wrote (`achieved_occupancy` for `achieved_occupancy_pct`) passed its test that
way. Only the GPU facts are written out here: their producer (`profile.gpu_info`) needs a GPU.

    r = result("correct", 15.0, eager_us=30.0, gpu=H100, nbytes=3 * 4 << 20, flops=1 << 20,
               ncu=counters("add_kernel", dram_pct=88.0))
    columns = {"source": src, **tools.records.store.attempt_columns(r)}
"""
from __future__ import annotations

import dataclasses

from sandbox.evaluate import NO_GPU_NOTE
from sandbox.stages.profiling import _speedups
from tools import profile
from tools.result import Correctness, Counters, EvalResult, Resources, Roofline, Timing

H100 = {"name": "NVIDIA H100 80GB HBM3", "sms": 132, "l2_bytes": 52428800, "cc": "9.0", "total_memory_bytes": 85 << 30,
        "driver": "580.95", "cuda": "13.0", "peak_gbps": 3352.0, "peak_tflops_bf16": 989.0, "peak_tflops_fp16": 989.0,
        "peak_tflops_tf32": 494.0, "peak_tflops_fp32": 67.0}
H200 = {**H100, "name": "NVIDIA H200", "l2_bytes": 60 * 2**20, "total_memory_bytes": 141 << 30, "peak_gbps": 4800.0}


def timing(median_us: float, wall_over_events: float = 1.2) -> Timing:
    """The Timing of five timed calls around `median_us` (q1/q3 at -2%/+2%, min -5%, max +10%), as the evaluator
    summarizes its CUDA-event samples."""
    samples_ms = [median_us * f / 1000 for f in (0.95, 0.98, 1.0, 1.02, 1.1)]
    return Timing(**profile.summarize(samples_ms), events_total_ms=sum(samples_ms),
                  wall_total_ms=sum(samples_ms) * wall_over_events)


def ncu_csv(kernels: dict[str, dict[str, float]]) -> str:
    """What `ncu --csv --page raw --print-units base` writes for one launch of each kernel; values by the names
    profile.parse_ncu_csv gives them (gpu_time in ns, dram_pct, ..., stall:<reason>)."""
    metrics = list(profile.NCU_METRICS)
    header = ["ID", "Kernel Name", *metrics]
    units = ["", "", *("nsecond" if m == "gpu__time_duration.sum" else "" for m in metrics)]
    rows = [[str(i), name, *(str(values.get(profile.NCU_METRICS[m], "n/a")) for m in metrics)]
            for i, (name, values) in enumerate(kernels.items())]
    return "\n".join(",".join(f'"{cell}"' for cell in row) for row in [header, units, *rows])


def counters(kernel: str = "add_kernel", *, gpu_time_us: float = 12.5, dram_pct: float = 88.0,
             sm_pct: float = 20.0, achieved_occupancy_pct: float = 90.0, l2_hit_pct: float | None = 30.0,
             stalls: dict[str, float] | None = None) -> dict[str, Counters]:
    """One kernel's Nsight Compute counters, read from ncu's CSV by the profiler's parser."""
    values = {"gpu_time": gpu_time_us * 1000, "dram_pct": dram_pct, "sm_pct": sm_pct,
              "achieved_occupancy_pct": achieved_occupancy_pct,
              **({"l2_hit_pct": l2_hit_pct} if l2_hit_pct is not None else {}),
              **{f"stall:{reason}": v for reason, v in (stalls or {"long_scoreboard": 0.7}).items()}}
    return {name: Counters(**c) for name, c in profile.parse_ncu_csv(ncu_csv({kernel: values})).items()}


def resources(kernel: str = "add_kernel", registers: int = 32, **more) -> list[Resources]:
    """A Triton kernel's resources as the evaluator records them after its compile."""
    return [Resources(**{"kernel": kernel, "source": "triton", "registers": registers, "spills": 0,
                         "shared_bytes": 0, "num_warps": 4, "num_stages": 3, "threads": 128, "occupancy": 1.0,
                         **more})]


def result(verdict: str = "correct", median_us: float | None = None, *, eager_us: float | None = None,
           compile_us: float | None = None, compile_from_eager: float | None = None, gpu: dict | None = None, nbytes: int = 0, flops: int = 0,
           dtype: str = "fp32", ncu: dict[str, Counters] | None = None, language: str = "triton",
           reasons: list[str] | None = None, **fields) -> EvalResult:
    """What the evaluator returns. A correct kernel with `median_us` was timed on `gpu` beside its baselines: its
    timings, speedups and roofline are computed as the evaluator computes them, with the given counters (torch.compile's
    time derived from eager's by `compile_from_eager`, as a later candidate of a session reuses the ratio). A correct
    one without is the CPU interpreter's (untimed, with the bytes and FLOPs counted); any other verdict stops before
    profiling (and only an incorrect one ran). `fields` set any other EvalResult field (resources, flags, nvml,
    vs_best, ...)."""
    ran = verdict in ("correct", "incorrect")   # failures of the other kinds stop before a replay ran
    r = EvalResult(verdict=verdict, language=language, gpu=gpu,
                   executed_on=("cuda" if gpu else "cpu-interpreter") if ran else None,
                   reasons=list(reasons if reasons is not None else ([] if verdict == "correct" else
                                                                       [f"{verdict}: see the log"])))
    if verdict == "correct":
        r.correctness = Correctness(trials=9, shapes=3)
        if median_us is None:
            r.timing_note, r.roofline = NO_GPU_NOTE, Roofline(bytes=nbytes, flops=flops)
        else:
            timings = {"candidate": timing(median_us)}
            timings.update({name: timing(us) for name, us in (("eager", eager_us), ("compile", compile_us)) if us})
            if compile_from_eager:
                timings["compile"] = Timing(median=timings["eager"].median * compile_from_eager,
                                            derived_from_eager=True, compile_to_eager=compile_from_eager)
            r.speedup = _speedups(timings)
            r.time_us = timings.pop("candidate")
            r.baselines = timings or None
            r.roofline = Roofline(**profile.roofline(nbytes, flops, gpu, r.time_us.median, dtype))
            r.nvml = {"before": {"sm_clock": 1980}, "after": {"sm_clock": 1980}, "throttled": False, "reasons": []}
            r.ncu = ncu
    return dataclasses.replace(r, **fields)   # a TypeError for a field EvalResult does not have
