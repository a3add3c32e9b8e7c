"""Re-judge the verified best kernel of every run of a suite database under today's checks, and list every flip.

A dataset made before a check existed is relabelled, not thrown away: each run's best (verified when logged) is
assembled and verified again at its problem's full size (no timing: the verdict is what can flip), in one evaluator
session, a problem at a time, and written as one JSON line per problem as it finishes, so a deadline or a crash
loses nothing. Lanes split the problems over GPUs (run one process per GPU, CUDA_VISIBLE_DEVICES set).

    python tests/experiments/rejudge_suite.py results/suite-kernelbench-h100x4/level1/suite.db \
        --out OUT/rejudge-0.jsonl --lane 0 --lanes 4 --deadline-s 500

Each line: problem, run, the logged verdict and checks version, the new verdict and its first reason, whether the
target is degenerate (tools/target.py), the input families judged, seconds.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sandbox.evaluate import EvalSettings, Session  # noqa: E402
from tools.result import CHECKS_VERSION  # noqa: E402
from tools.records.store import Attempt, open_db  # noqa: E402
from tools.target import TargetError, check_reference, load_target  # noqa: E402


def verified_bests(db: str) -> list[tuple[dict, Attempt]]:
    """(run, best attempt) for every run whose best is verified, by problem name."""
    store = open_db(db, create=False, readonly=True)
    pairs = []
    for run in store.list_runs():
        best = store.best_attempt(run["id"])
        if best is not None and best.verdict == "correct":
            pairs.append((run, best))
    return sorted(pairs, key=lambda pair: pair[0].get("target_name") or "")


def rejudge(session: Session, run: dict, best: Attempt, directory: Path) -> dict:
    began = time.perf_counter()
    row = {"problem": run.get("target_name"), "run": run["id"], "attempt": best.number, "old": best.verdict,
           "old_checks": best.result.checks, "checks": CHECKS_VERSION}
    path = directory / f"{run.get('target_name') or 'target'}.py"
    path.write_text(run["target_source"])
    try:
        target = load_target(str(path))
        check_reference(target)
    except TargetError as e:
        return {**row, "new": "target_refused", "reason": str(e)[:500], "seconds": time.perf_counter() - began}
    with session.evaluation(target, best.source) as ev:
        ev.assemble()
        ev.verify()
    result = ev.result
    return {**row, "new": result.verdict, "reason": (result.reasons or [""])[0][:1000],
            "withheld": (result.withheld or [""])[0][:1000], "degenerate": target.degenerate,
            "families": result.correctness.families if result.correctness else [],
            "skipped": result.correctness.skipped if result.correctness else [],
            "seconds": round(time.perf_counter() - began, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("--out", required=True)
    parser.add_argument("--lane", type=int, default=0)
    parser.add_argument("--lanes", type=int, default=1)
    parser.add_argument("--deadline-s", type=float, default=float("inf"))
    parser.add_argument("--problems", default="", help="comma-separated problem names (default: all)")
    args = parser.parse_args()
    wanted = set(filter(None, args.problems.split(",")))
    pairs = [p for p in verified_bests(args.db) if not wanted or p[0].get("target_name") in wanted]
    mine = pairs[args.lane::args.lanes]
    began = time.perf_counter()
    settings = EvalSettings(baselines=("eager",))
    with Session(spares=2, settings=settings) as session, tempfile.TemporaryDirectory() as tmp, \
            open(args.out, "a") as out:
        for n, (run, best) in enumerate(mine):
            if time.perf_counter() - began > args.deadline_s:
                print(f"lane {args.lane}: deadline after {n} of {len(mine)} problems", flush=True)
                break
            try:
                row = rejudge(session, run, best, Path(tmp))
            except Exception as e:  # noqa: BLE001  one problem's failure is a row, not the end of the lane
                row = {"problem": run.get("target_name"), "run": run["id"], "new": "error",
                       "reason": f"{type(e).__name__}: {e}"[:500]}
            out.write(json.dumps(row) + "\n")
            out.flush()
            flip = "" if row["new"] == row.get("old") else "  FLIP"
            print(f"{row['problem']}: {row.get('old')} -> {row['new']}{flip} {row.get('reason', '')[:160]}",
                  flush=True)


if __name__ == "__main__":
    main()
