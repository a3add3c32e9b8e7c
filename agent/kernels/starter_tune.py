"""A starter's defaults timed at generation, as torch.compile's autotuner times Inductor's configurations.

Inductor's heuristics give each kernel a list of configurations and torch.compile runs the fastest; a starter that
took the first one loses to torch.compile wherever the first is a poor fit (an outer reduction read one row per
program: 0.3x of torch.compile on KernelBench level 1's reductions over a dimension, H200). So on a GPU the
generating child (agent/kernels/inductor.py) times, per group of tunables (each kernel, then kloop's convolution),
every setting in `Generated.choices` with the other groups at their chosen values, and the fastest becomes the
default. This only picks the starter's first point: the evaluator verifies and times every attempt as always.

A setting is timed only if its outputs are as close to the reference's as the first setting's (a configuration
never changes what a kernel computes, only its summation order); one that fails to compile or launch is passed
over; a first setting further from the reference than FIRST_ERROR_LIMIT leaves the starter untuned. Tuning stops
trying more settings after TUNE_BUDGET_S.

A suite generates several starters side by side on one GPU, and the others' references, compiles and Inductor's
own autotuning run kernels there while a setting is timed (the lock below keeps out only the others' timings).
Such a kernel stretches the timings it overlaps: on an H200, 10's fp32 GEMM timed 5.94 ms at generation and ran in
1.16 ms in the evaluator, so a slower setting was kept. So each setting is timed ROUNDS times, round-robin across
the group's settings (spread over time, as the disturbances are not), and its fastest time counts; within a
timing too the fastest repetition counts.

    >>> tuned = tune(generated, lambda cls: cls(), inputs, expected)   # on a GPU, in the generating child
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

TUNE_BUDGET_S = 120.0
ERROR_FLOOR = 1e-5   # relative to the largest reference value: rounding of a changed summation order
CHUNK = 1 << 24      # elements compared at a time
FIRST_ERROR_LIMIT = 1e-2   # the first setting further than this from the reference: no tuning (half precision fits)
ROUNDS = 3         # timings of each setting, round-robin; the fastest counts


def gpu_time_ms(fn: Callable[[], object]) -> float:
    """The fastest of fn's repetitions on the GPU, in milliseconds (Triton's do_bench, cache flushed between calls),
    timed while no other generation on this GPU times (a suite generates several starters side by side)."""
    from triton.testing import do_bench

    with _timing_alone():
        return float(do_bench(fn, warmup=10, rep=50, return_mode="min"))


@contextlib.contextmanager
def _timing_alone():
    """An exclusive lock per GPU (by its UUID), shared by every process on this machine."""
    uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
    with open(Path(tempfile.gettempdir()) / f"kloop-timing-{uuid}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def tune(generated, make_model: Callable[[type], torch.nn.Module], inputs: list, expected,
         measure: Callable[[Callable[[], object]], float] = gpu_time_ms, budget_s: float = TUNE_BUDGET_S):
    """`generated` with the fastest setting of each group as its defaults, and a note of what was timed (the same
    `generated` where nothing has two settings). make_model: ModelNew's class -> a model holding the reference's
    parameters; expected: the reference's output for `inputs`."""
    groups = [group for group in generated.choices if len(group) > 1]
    if not groups:
        return generated
    with _loaded(generated.source) as module:
        model = make_model(module.ModelNew)
        chosen = dict(generated.defaults)
        vars(module).update(chosen)
        with torch.no_grad():
            run = lambda: model(*inputs)  # noqa: E731
            first_error = _error(run(), expected)
            if not first_error <= FIRST_ERROR_LIMIT:  # nothing to compare settings against
                raise ValueError("the starter's first setting does not reproduce the reference's outputs here")
            allowed = max(2 * first_error, ERROR_FLOOR)
            deadline = time.monotonic() + budget_s
            notes = []
            for group in groups:
                fastest: dict[int, float] = {}   # a setting's index in the group -> its fastest time
                for round_ in range(ROUNDS):
                    for i, setting in enumerate(group):
                        if time.monotonic() > deadline or (round_ and i not in fastest):
                            continue
                        vars(module).update({**chosen, **setting})
                        try:
                            if not round_ and _error(run(), expected) > allowed:
                                continue
                            fastest[i] = min(fastest.get(i, math.inf), measure(run))
                        except Exception:  # a configuration that does not compile or launch here (resources)
                            continue
                timed = [(ms, group[i]) for i, ms in sorted(fastest.items())]
                if timed:
                    first_ms = timed[0][0] if timed[0][1] == group[0] else math.inf
                    best_ms, best = min(timed, key=lambda t: t[0])
                    if best_ms < 0.99 * first_ms:  # only a clear win replaces Inductor's first
                        chosen.update(best)
                    notes.append(_note(group, timed, chosen))
                vars(module).update(chosen)
    return generated.with_defaults(chosen, "; ".join(notes))


@contextlib.contextmanager
def _loaded(source: str):
    """The candidate as a module from a file (Triton reads its kernels' source from there); both gone after."""
    with tempfile.TemporaryDirectory(prefix="kloop-tune-") as folder:
        path = Path(folder) / "kloop_starter_tune.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"kloop_starter_tune_{id(path)}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
            yield module
        finally:
            sys.modules.pop(spec.name, None)


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _error(got, want) -> float:
    """The largest difference from the reference relative to its largest finite value; inf where shapes, integer
    outputs, NaN or infinity positions differ. In chunks: a level-1 output is 6.4 GB."""
    worst = 0.0
    for g, w in zip(_outputs(got), _outputs(want), strict=True):
        if g.shape != w.shape:
            return math.inf
        largest = difference = 0.0
        for gc, wc in zip(g.reshape(-1).split(CHUNK), w.reshape(-1).split(CHUNK)):
            if not wc.is_floating_point():
                if not torch.equal(gc.to(wc.dtype), wc):
                    return math.inf
                continue
            gc, wc = gc.double(), wc.double()
            finite = wc.isfinite()
            if not torch.equal(gc.isfinite(), finite) or not torch.equal(gc[~finite].nan_to_num(),
                                                                         wc[~finite].nan_to_num()):
                return math.inf
            if finite.any():
                largest = max(largest, wc[finite].abs().max().item())
                difference = max(difference, (gc[finite] - wc[finite]).abs().max().item())
        worst = max(worst, difference / (largest or 1.0))
    return worst


def _note(group: list[dict], timed: list[tuple[float, dict]], chosen: dict) -> str:
    names = ", ".join(f"{k}={v}" for k, v in sorted(group[0].items()))
    kept = next(ms for ms, s in timed if all(chosen[k] == v for k, v in s.items()))
    first = next((f"{ms:.3g} ms" for ms, s in timed if s == group[0]), "failed")
    return f"{len(timed)} of {len(group)} settings timed for {names}: first {first}, kept {kept:.3g} ms"
