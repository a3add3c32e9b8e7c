"""Every problem of a KernelBench level folder: is an offline starter made at CPU size, and does the evaluator
verify it (not a test; no GPU needed: TRITON_INTERPRET=1).

    python tests/experiments/level3_starters.py kernelbench/level3 --out level3.jsonl [--problems '35_*,37_*']
        [--generate-s 300] [--evaluate-s 600] [--no-evaluate]

Per problem: the starter's generation (agent/kernels/inductor.py, at the target's CPU size) gives `made` or the class
of its failure (NoStarter's short class name and message); a made starter is judged by kloop's evaluator at CPU size
(main shape and hidden variants) in a child process of its own, so that a problem slow under the interpreter is cut
off at --evaluate-s (verdict `slow`). One JSON line per problem, appended to --out (problems already there are
skipped: a stopped run goes on); a markdown table last.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def generate(path: Path, timeout_s: float) -> dict:
    from agent.kernels import inductor

    began = time.monotonic()
    try:
        generated = inductor.generate(str(path), small=True, timeout_s=timeout_s)
    except inductor.NoStarter as e:
        return {"starter": None, "class": e.kind, "reason": e.reason, "generate_s": round(time.monotonic() - began)}
    return {"starter": generated.source, "class": "made", "reason": generated.notes[:200],
            "generate_s": round(time.monotonic() - began)}


def judge(path: Path, source_file: Path) -> dict:
    """The child's work: the evaluator's verdict on the starter in source_file."""
    from sandbox.evaluate import evaluate
    from tools.target import load_target

    result = evaluate(load_target(str(path)), source_file.read_text())
    return {"verdict": result.verdict, "why": "; ".join(result.reasons)[:300]}


def evaluate_in_child(path: Path, source: str, timeout_s: float, scratch: Path) -> dict:
    source_file = scratch / f"{path.stem}.starter.py"
    source_file.write_text(source)
    began = time.monotonic()
    command = [sys.executable, str(Path(__file__).resolve()), "--judge", str(path), str(source_file)]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=str(ROOT), env=env)
    except subprocess.TimeoutExpired:
        return {"verdict": "slow", "why": f"not judged within {timeout_s:.0f} s under the interpreter",
                "evaluate_s": round(time.monotonic() - began)}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    reply = json.loads(lines[-1]) if lines else \
        {"verdict": "crashed", "why": " ".join(done.stderr.strip().splitlines()[-1:])[:300]}
    return {**reply, "evaluate_s": round(time.monotonic() - began)}


def table(rows: list[dict]) -> str:
    lines = ["| problem | starter | class / notes | verdict (CPU) | gen s | eval s |", "|---|---|---|---|---|---|"]
    for r in rows:
        made = r["class"] == "made"
        what = "" if made else f"{r['class']}: {r['reason'][:120]}"
        verdict = r.get("verdict", "") + (f" ({r['why'][:100]})" if r.get("verdict") not in (None, "correct") else "")
        lines.append(f"| {r['problem']} | {'made' if made else 'no'} | {what} | {verdict} | {r['generate_s']} | "
                     f"{r.get('evaluate_s', '')} |")
    made = [r for r in rows if r["class"] == "made"]
    correct = [r for r in made if r.get("verdict") == "correct"]
    lines.append(f"\n{len(made)} of {len(rows)} problems got a starter; {len(correct)} verified correct on the CPU.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--judge"]:
        print(json.dumps(judge(Path(argv[1]), Path(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--problems", default="*", help="comma-separated file name patterns")
    parser.add_argument("--generate-s", type=float, default=300)
    parser.add_argument("--evaluate-s", type=float, default=600)
    parser.add_argument("--no-evaluate", action="store_true")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"error: {args.folder} is not a folder of problems", file=sys.stderr)
        return 2
    patterns = args.problems.split(",")
    paths = sorted((p for p in args.folder.glob("*.py") if any(fnmatch.fnmatch(p.name, pat) for pat in patterns)),
                   key=lambda p: (int(p.name.split("_")[0]) if p.name.split("_")[0].isdigit() else 0, p.name))
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            row = json.loads(line)
            done[row["problem"]] = row
    scratch = args.out.parent / f"{args.out.stem}.starters"
    scratch.mkdir(parents=True, exist_ok=True)
    for path in paths:
        if path.stem in done:
            continue
        row = {"problem": path.stem, **generate(path, args.generate_s)}
        source = row.pop("starter")
        if source is not None and not args.no_evaluate:
            row.update(evaluate_in_child(path, source, args.evaluate_s, scratch))
        done[path.stem] = row
        with args.out.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    print(table([done[p.stem] for p in paths if p.stem in done]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
