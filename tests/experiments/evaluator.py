"""Benchmark of the evaluator itself (not a test): per-candidate overhead and where it goes, timing repeatability,
agreement with ncu.

    python tests/experiments/evaluator.py --out results/evaluator-GPU.json [--repeats 10] [--no-ncu]

One candidate at a time (Session.evaluation, staged), with a warm pool of planners and a warm executor and
referee. Overhead is the wall time of one whole evaluation (rules, planner, executor loads, trials, timing) minus the
candidate's own kernel time in it; `beyond compile` also leaves out the planner's build (Triton compiling the main and
hidden shapes in the candidate's own cache). The breakdown gives each stage's median (plan, load, verify, profile) and
each wait on another process (`waited`: planner:build, executor:round, referee:check, ...). Repeatability is the
coefficient of variation of the median over repeated evaluations of one kernel. Agreement compares our median with
Nsight Compute's gpu__time_duration. Without a GPU (Triton's interpreter) only the breakdown is real.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from sandbox.evaluate import EvalSettings, Session, evaluate
from tools.target import load_target

ROOT = Path(__file__).resolve().parents[2]


def spread(values: list[float]) -> dict:
    """Median and quartiles (the quartiles equal the median for one value)."""
    if len(values) < 2:
        return {"median": values[0] if values else None, "q1": values[0] if values else None,
                "q3": values[0] if values else None, "n": len(values)}
    q1, _, q3 = statistics.quantiles(values, n=4)
    return {"median": statistics.median(values), "q1": q1, "q3": q3, "n": len(values)}


def measure(session: Session, target, source: str, repeats: int, baselines: tuple = ()) -> dict:
    """`repeats` evaluations of one candidate, one at a time, after a first one that warms Triton and CUDA."""
    evaluate(target, source, EvalSettings(baselines=baselines), session)
    walls, overheads, beyond, medians, stages = [], [], [], [], []
    for _ in range(repeats):
        settings = EvalSettings(baselines=baselines)
        start = time.perf_counter()
        r = evaluate(target, source, settings, session)
        wall = time.perf_counter() - start
        assert r.correct, r.reasons
        calls = settings.timed_calls + settings.warmup_calls + r.correctness.trials
        kernel_s = (r.time_us.median * 1e-6 * calls) if r.time_us else 0.0
        build = r.durations_s.get("waited", {}).get("planner:build", 0.0)
        walls.append(wall)
        overheads.append(wall - kernel_s)
        beyond.append(wall - kernel_s - build)
        if r.time_us:
            medians.append(r.time_us.median)
        stages.append(r.durations_s)
    keys = sorted({k for d in stages for k, v in d.items() if isinstance(v, (int, float))})
    waited = sorted({k for d in stages for k in d.get("waited", {})})
    return {
        "wall_s": spread(walls), "overhead_s": spread(overheads), "overhead_beyond_compile_s": spread(beyond),
        "stages_s": {k: spread([d.get(k, 0.0) for d in stages]) for k in keys},
        "waited_s": {k: spread([d.get("waited", {}).get(k, 0.0) for d in stages]) for k in waited},
        "median_us": {"values": medians,
                      "cv": statistics.stdev(medians) / statistics.fmean(medians) if len(medians) > 1 else None},
        "evaluations": stages,
    }


def breakdown_table(report: dict) -> str:
    """The breakdown as aligned text lines: stage or wait, median and IQR in milliseconds."""
    lines = [f"{'where':<28} {'median ms':>10} {'q1':>9} {'q3':>9}"]
    rows = [("wall", report["wall_s"]), ("overhead (wall - kernel)", report["overhead_s"]),
            ("overhead beyond compile", report["overhead_beyond_compile_s"])]
    rows += [(f"stage {k}", v) for k, v in report["stages_s"].items() if k not in ("busy",)]
    rows += [(f"  waited {k}", v) for k, v in sorted(report["waited_s"].items(), key=lambda kv: -kv[1]["median"])]
    for name, s in rows:
        lines.append(f"{name:<28} {s['median'] * 1e3:>10.1f} {s['q1'] * 1e3:>9.1f} {s['q3'] * 1e3:>9.1f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-ncu", action="store_true", help="skip the Nsight Compute comparison")
    args = parser.parse_args()
    target = load_target("vector_add")
    source = (ROOT / "agent/kernels/vector_add/triton_block.py").read_text()
    report = {"target": "vector_add", "candidate": "agent/kernels/vector_add/triton_block.py"}
    with Session(spares=4) as session:  # enough started ahead that every evaluation finds a warm planner
        session.start()
        report["gpu"] = session.gpu()
        report.update(measure(session, target, source, args.repeats))
        ncu = None if args.no_ncu or not session.cuda else \
            evaluate(target, source, EvalSettings(baselines=(), ncu=True), session)
    if ncu is not None:
        ncu_us = next(iter((ncu.ncu or {}).values()), None)
        ncu_us = ncu_us.gpu_time_us if ncu_us else None
        report["ncu"] = {"kloop_median_us": ncu.median_us, "ncu_gpu_time_us": ncu_us,
                         "ratio": (ncu.median_us / ncu_us) if ncu_us and ncu.median_us else None, "flags": ncu.flags}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(breakdown_table(report))
    print(json.dumps({k: report.get(k) for k in ("overhead_s", "overhead_beyond_compile_s", "median_us", "ncu")},
                     indent=1, default=str)[:3000])


if __name__ == "__main__":
    main()
