"""Where a starter's generation spends its time: each phase of agent/kernels/inductor.py's generate_here, timed in
this process by wrapping the functions it calls, and the whole generation as a suite runs it (a child process).

    python tests/experiments/starter_phases.py kernelbench/level1/19_ReLU.py kernelbench/level2/12_Gemm_Multiply_LeakyReLU.py

Phases: load (the target and its shapes), reference (the model built and run once), trace (Dynamo, both captures),
codegen (Inductor's lowering and code generation, both captures; on a GPU with its template benchmarks), build
(the candidate made standalone, Inductor's heuristics per kernel, the rules), tune (on a GPU: the defaults timed,
agent/kernels/starter_tune.py), and child (the child process's start and imports: the whole generation minus the
phases); then warm: each problem again, one after another in one warm child (agent/kernels/warm_generator.py, as a
suite generates them; the first pays the child's start). At the CPU size without a GPU (TRITON_INTERPRET=1), at
full size on one. One JSON line per problem, then one for the warm child.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


@contextlib.contextmanager
def timed(spent: dict, phase: str, owner, name: str):
    """owner.name wrapped: its time added to spent[phase] (nested calls of a timed phase count once)."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[phase] = spent.get(phase, 0.0) + time.perf_counter() - began

    with mock.patch.object(owner, name, wrapper):
        yield


def phases(spec: str, small: bool) -> dict:
    import torch._inductor.compile_fx as compile_fx

    import tools.target
    from agent.kernels import inductor

    spent: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        for phase, owner, name in (("load", tools.target, "load_target"), ("capture", inductor, "capture"),
                                   ("codegen", compile_fx, "compile_fx"), ("build", inductor, "_checked"),
                                   ("build", inductor, "build_candidate"), ("tune", inductor, "_timed")):
            stack.enter_context(timed(spent, phase, owner, name))
        began = time.perf_counter()
        try:
            generated = inductor.generate_here(spec, small)
            outcome = f"{len(generated.kernels)} kernel(s)"
        except inductor.NoStarter as e:
            outcome = f"no starter: {e}"
        total = time.perf_counter() - began
    # build_candidate calls _checked's checks after it: both are "build"; capture holds trace and codegen
    spent["trace"] = spent.pop("capture", 0.0) - spent.get("codegen", 0.0)
    spent["reference"] = total - sum(spent.values())
    return {"total": total, **spent, "outcome": outcome}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("problems", nargs="+", help="KernelBench-style files or built-in target names")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")
    from agent.kernels import inductor
    from tools.inputs import DEVICE

    small = DEVICE.type != "cuda"
    for spec in args.problems:
        if not Path(spec).is_file() and "/" in spec:
            print(f"error: no such problem file: {spec}", file=sys.stderr)
            return 2
        began = time.perf_counter()
        try:
            inductor.generate(spec, small=small)
        except inductor.NoStarter:
            pass
        whole = time.perf_counter() - began
        row = phases(spec, small)
        row = {"problem": Path(spec).stem, "device": str(DEVICE), "whole": round(whole, 2),
               "child": round(whole - row["total"], 2), **{k: round(v, 2) if isinstance(v, float) else v
                                                           for k, v in row.items()}}
        print(json.dumps(row), flush=True)
    from agent.kernels.warm_generator import WarmGenerator

    generator, warm = WarmGenerator(small=small), {}
    try:
        for spec in args.problems:
            began = time.perf_counter()
            try:
                generator.generate(spec)
            except inductor.NoStarter:
                pass
            warm[Path(spec).stem] = round(time.perf_counter() - began, 2)
    finally:
        generator.close()
    print(json.dumps({"warm": warm}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
