"""Stub evaluators for `kloop serve` tests (--evaluator tests.fakes.serve_stub:evaluate): no torch, no processes.

The candidate's text steers it: `sleep=S` sleeps S seconds, `verdict=V` answers V (default correct),
`speedup=X` reports a speedup over eager, `crash` kills the worker process, `target-error` raises TargetError.
With KLOOP_STUB_LOG set, every call appends one line (the candidate's first line) to that file.
"""
from __future__ import annotations

import os
import re
import time


class TargetError(Exception):
    pass


def evaluate(request: dict) -> dict:
    from tools.result import EvalResult, Timing

    text = request["candidate"]
    log = os.environ.get("KLOOP_STUB_LOG")
    if log:
        with open(log, "a") as f:
            f.write(text.splitlines()[0] + "\n")
    if "crash" in text:
        os._exit(3)
    if "target-error" in text:
        raise TargetError("the stub's target is broken")
    sleep = re.search(r"sleep=([0-9.]+)", text)
    if sleep:
        time.sleep(float(sleep.group(1)))
    verdict = re.search(r"verdict=(\w+)", text)
    speedup = re.search(r"speedup=([0-9.]+)", text)
    result = EvalResult(verdict=verdict.group(1) if verdict else "correct", language="triton",
                        executed_on="stub")
    if speedup:
        result.speedup = {"eager": float(speedup.group(1))}
        result.time_us = Timing(median=10.0)
    return result.to_dict()
