"""Every problem of a KernelBench-style folder, at full size, judged against one candidate (not a test).

    python bench/kernelbench_sweep.py kernelbench/level1 tests/candidates/copy_input.py --out sweep.jsonl \
        [--problems '19_*,33_*'] [--seconds 300]

What it shows: that each problem gets a verdict (never a traceback or an out-of-memory crash of kloop), how long
the evaluation took, and the peak GPU memory over all processes (NVML, sampled every 20 ms, above what was in use
before). A copy candidate is wrong for nearly every problem: a `correct` is an evaluator hole worth a look.
One JSON line per problem; a summary last.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import threading
import time
from pathlib import Path

from sandbox.evaluate import EvalSettings, Session, evaluate
from tools.target import TargetError, load_target


class PeakMemory:
    """The most GPU memory in use (all processes) while the block runs, less what was in use when it began."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.peak = self.base = 0

    def used(self) -> int:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder", type=Path)
    parser.add_argument("candidate", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", default="", help="comma-separated globs of file names")
    parser.add_argument("--seconds", type=float, default=1e9, help="stop starting new problems after this long")
    args = parser.parse_args()
    source = args.candidate.read_text()
    started = time.perf_counter()
    verdicts: dict[str, int] = {}
    with Session(spares=2) as session, args.out.open("a") as out:
        for path in problems(args.folder, [p for p in args.problems.split(",") if p]):
            if time.perf_counter() - started > args.seconds:
                break
            began = time.perf_counter()
            with PeakMemory() as memory:
                try:
                    r = evaluate(load_target(str(path)), source, EvalSettings(baselines=()), session)
                    verdict, reason = r.verdict, (r.reasons or [""])[0]
                    trials = r.correctness.trials if r.correctness else 0
                except TargetError as e:
                    verdict, reason, trials = "target_error", str(e), 0
            row = {"problem": path.stem, "verdict": verdict, "first_reason": reason[:160], "trials": trials,
                   "wall_s": round(time.perf_counter() - began, 1), "peak_gpu_mib_all_processes": memory.mib}
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{row['problem']:<45} {verdict:<14} {row['wall_s']:>6.1f} s {memory.mib:>7} MiB  {reason[:70]}",
                  flush=True)
    print(json.dumps({"verdicts": verdicts, "seconds": round(time.perf_counter() - started)}))


if __name__ == "__main__":
    main()
