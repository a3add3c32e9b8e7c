"""Benchmark of the evaluator itself (not a test): per-candidate overhead, timing repeatability, agreement with ncu.

    python bench/evaluator.py --out results/evaluator-GPU.json

Overhead is the wall time of one whole evaluation (rules, planner, executor loads, trials, timing) minus the
candidate's own kernel time in it, with a warm pool of planners and a warm executor and referee. Repeatability is the coefficient of variation of the median over
repeated evaluations of one kernel. Agreement compares our median with Nsight Compute's gpu__time_duration.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from sandbox.evaluate import EvalSettings, Session, evaluate
from tools.target import load_target

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    target = load_target("vector_add")
    source = (ROOT / "agent/kernels/vector_add/triton_block.py").read_text()
    report = {"target": "vector_add", "candidate": "agent/kernels/vector_add/triton_block.py"}
    with Session(spares=4) as session:  # enough started ahead that every evaluation finds a warm planner
        report["gpu"] = session.gpu()
        evaluate(target, source, EvalSettings(baselines=()), session)  # first compile, Triton and CUDA start-up
        walls, overheads, medians = [], [], []
        for _ in range(args.repeats):
            settings = EvalSettings(baselines=())
            start = time.perf_counter()
            r = evaluate(target, source, settings, session)
            wall = time.perf_counter() - start
            assert r.correct, r.reasons
            calls = settings.timed_calls + settings.warmup_calls + r.correctness.trials
            kernel_s = r.time_us.median * 1e-6 * calls
            walls.append(wall)
            overheads.append(wall - kernel_s)
            medians.append(r.time_us.median)
            report.setdefault("stages_s", []).append(r.durations_s)
        ncu = evaluate(target, source, EvalSettings(baselines=(), ncu=True), session)
    q = statistics.quantiles
    ncu_us = next(iter((ncu.ncu or {}).values()), None)
    ncu_us = ncu_us.gpu_time_us if ncu_us else None
    report.update(
        overhead_s={"median": statistics.median(overheads), "q1": q(overheads, n=4)[0], "q3": q(overheads, n=4)[2]},
        wall_s={"median": statistics.median(walls)},
        median_us={"values": medians, "cv": statistics.stdev(medians) / statistics.fmean(medians)},
        ncu={"kloop_median_us": ncu.median_us, "ncu_gpu_time_us": ncu_us,
             "ratio": (ncu.median_us / ncu_us) if ncu_us and ncu.median_us else None, "flags": ncu.flags},
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("overhead_s", "wall_s", "median_us", "ncu")}, indent=1))


if __name__ == "__main__":
    main()
