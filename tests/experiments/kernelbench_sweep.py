"""Every problem of a KernelBench-style folder, at full size, judged against one candidate (not a test).

    python tests/experiments/kernelbench_sweep.py kernelbench/level1 tests/candidates/copy_input.py --out sweep.jsonl \
        [--problems '19_*,33_*'] [--seconds 300] [--starters [--jobs 8]] [--baselines eager,compile]

What it shows: that each problem gets a verdict (never a traceback or an out-of-memory crash of kloop), how long the
evaluation took, the speedup over each baseline asked for (and the median and interquartile range of each timed
party), and the peak GPU memory over all processes (NVML, sampled every 20 ms, above what was in use before; 0
without NVML) against the bytes of one set of inputs and outputs. A copy candidate is wrong for nearly every problem
(a `correct` is an evaluator hole worth a look), so it is refused at its first trial; --starters judges each
problem's Inductor starter instead, which is right for most and so goes through every stage (all trials, the timing,
the baselines asked for): the evaluator's whole path at full size. One JSON line per problem, appended to --out;
problems already there are skipped, so a stopped sweep goes on where it stopped. A summary last.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sandbox.evaluate import EvalSettings, Session, evaluate
from tools.target import TargetError, check_reference, load_target


class PeakMemory:
    """The most GPU memory in use (all processes) while the block runs, less what was in use when it began."""

    def __init__(self) -> None:
        import pynvml

        try:
            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except pynvml.NVMLError:   # no GPU: nothing to measure
            self.nvml = None
        self.peak = self.base = 0

    def used(self) -> int:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used if self.nvml else 0

    def __enter__(self) -> "PeakMemory":
        self.base = self.peak = self.used()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.used())

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    @property
    def mib(self) -> int:
        return (self.peak - self.base) >> 20


def problems(folder: Path, patterns: list[str]) -> list[Path]:
    files = sorted(folder.glob("*.py"), key=lambda p: (int(m.group()) if (m := re.match(r"\d+", p.name)) else 0,
                                                       p.name))
    return [p for p in files if not patterns or any(fnmatch.fnmatch(p.name, pat) for pat in patterns)]


def done_problems(out: Path) -> set[str]:
    """Problems already in the output file (a sweep stopped by its budget goes on where it stopped)."""
    if not out.exists():
        return set()
    return {json.loads(line)["problem"] for line in out.read_text().splitlines() if line.startswith("{")}


def starters(paths: list[Path], jobs: int, timeout_s: float) -> dict[Path, tuple[str | None, str]]:
    """Inductor's starter for each problem (agent.kernels.inductor), `jobs` generated side by side: (source, "") or
    (None, why there is none)."""
    from agent.kernels import inductor

    def one(path: Path) -> tuple[str | None, str]:
        try:
            return inductor.generate(str(path), small=False, timeout_s=timeout_s).source, ""
        except inductor.NoStarter as e:
            return None, str(e)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        made = dict(zip(paths, pool.map(one, paths)))
    for path, (source, why) in made.items():   # full-size generations side by side can fill the GPU: alone again
        if source is None and "out of memory" in why.lower() and jobs > 1:
            made[path] = one(path)
    return made


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("candidate", type=Path, help="a candidate file, judged against every problem; with "
                        "--starters, the one judged where a problem has no Inductor starter")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", default="", help="comma-separated globs of file names")
    parser.add_argument("--seconds", type=float, default=1e9, help="stop starting new problems after this long")
    parser.add_argument("--starters", action="store_true", help="judge each problem's Inductor starter")
    parser.add_argument("--jobs", type=int, default=8, help="starters generated side by side (before, not while, "
                        "problems are judged, so that the peak memory is the evaluation's own)")
    parser.add_argument("--generate-timeout", type=float, default=180.0)
    parser.add_argument("--baselines", default="", help="comma-separated: eager, compile (default none)")
    args = parser.parse_args()
    fallback = args.candidate.read_text()
    settings = dict(baselines=tuple(b for b in args.baselines.split(",") if b))
    started = time.perf_counter()
    skip = done_problems(args.out)
    todo = [p for p in problems(args.folder, [p for p in args.problems.split(",") if p]) if p.stem not in skip]
    verdicts: dict[str, int] = {}
    with Session(spares=2) as session, args.out.open("a") as out:
        step = args.jobs if args.starters else max(len(todo), 1)   # starters: generated a chunk at a time
        for first in range(0, len(todo), step):
            if time.perf_counter() - started > args.seconds:
                break
            chunk = todo[first:first + step]
            generated = starters(chunk, args.jobs, args.generate_timeout) if args.starters else {}
            for path in chunk:
                if time.perf_counter() - started > args.seconds:
                    break
                source, no_starter = generated.get(path, (None, "not asked for"))
                row = judge(path, source or fallback, settings, session)
                row["candidate"] = "starter" if source else args.candidate.name
                if args.starters and not source:
                    row["no_starter"] = no_starter[:160]
                verdicts[row["verdict"]] = verdicts.get(row["verdict"], 0) + 1
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{row['problem']:<45} {row['candidate'][:8]:<8} {row['verdict']:<14} {row['wall_s']:>6.1f} s "
                      f"{row['peak_gpu_mib_all_processes']:>7} MiB {row['peak_over_io'] or 0:>5.2f}x io  "
                      f"{_speedups(row)} {row['first_reason'][:60]}", flush=True)
    print(json.dumps({"verdicts": verdicts, "seconds": round(time.perf_counter() - started)}))


def _speedups(row: dict) -> str:
    return " ".join(f"{name} {x:.2f}x" for name, x in (row.get("speedup") or {}).items())


def judge(path: Path, source: str, settings: dict, session: Session) -> dict:
    """One evaluation at full size: its verdict, wall time, and the peak GPU memory over all processes against the
    bytes of one set of inputs and outputs (the evaluator promises at most 3x, plus the candidate's scratch). The
    reference is checked first, as kloop's commands do (a broken one is a target_error); that check is not timed."""
    row = {"problem": path.stem, "verdict": "target_error", "trials": 0, "wall_s": 0.0,
           "peak_gpu_mib_all_processes": 0, "io_mib": 0, "peak_over_io": None}
    try:
        target = load_target(str(path))
        check_reference(target)
    except TargetError as e:
        return {**row, "first_reason": str(e)[:160]}
    io_bytes = target.io_bytes(small=False)
    began = time.perf_counter()
    with PeakMemory() as memory:
        r = evaluate(target, source, EvalSettings(**settings), session)
    return {**row, "verdict": r.verdict, "first_reason": (r.reasons or [""])[0][:160],
            "trials": r.correctness.trials if r.correctness else 0, "wall_s": round(time.perf_counter() - began, 1),
            "median_us": r.median_us, "speedup": r.speedup or {}, "timings_us": _timings(r),
            "peak_gpu_mib_all_processes": memory.mib, "io_mib": io_bytes >> 20,
            "peak_over_io": round((memory.mib << 20) / io_bytes, 2) if io_bytes else None}


def _timings(r) -> dict:
    """Median and interquartile range of the candidate's and each baseline's timed calls, in us."""
    named = {"candidate": r.time_us, **(r.baselines or {})}
    return {name: {"median": round(t.median, 1), "iqr": round(t.iqr, 1) if t.iqr is not None else None}
            for name, t in named.items() if t is not None}


if __name__ == "__main__":
    main()
