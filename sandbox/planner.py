"""The untrusted side: a jailed process that runs a candidate's Python and writes its launch plans.

Started warm (torch and triton imported) by sandbox/warm.py, inside the jail of sandbox/jail.py. Commands arrive as
JSON lines on stdin; replies go out as JSON lines on the control fd, never on stdout, which belongs to the candidate
and is only ever stored. A reply can only say that a plan was written, or why not (a failure status and a message):
the trusted side believes neither, it loads the plan as hostile data and judges what the plan computes.

    {"cmd": "load", "target_source": ..., "candidate": "candidate.py", "init_seed": 7}
    {"cmd": "build", "shape": 0, "overrides": {...}, "seed": 11}     the model, and the call that compiles
    {"cmd": "record", "out": "plan-0", "records": 20}                 recorded calls, the plan written
"""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import torch
import triton  # noqa: F401  (imported while warm, so a candidate's first import costs nothing)

from sandbox import cuda_probes, libdevice_cpu
from sandbox import plan as planfmt
from sandbox import record
from tools import weights
from tools.inputs import DEVICE, make_inputs
from tools.target import module_from_source

MAX_RECORDS = 3  # extra calls allowed when Triton's autotuner ran inside a recorded one
# Words of the errors that CUDA-only code meets on the CPU after sandbox/cuda_probes.py answered its probes.
GPU_ONLY = ("CUDA", "cuda", "NVIDIA", "libdevice.", "n_regs", "_init_handles")


class Planner:
    def __init__(self, reply) -> None:
        self.reply = reply
        self.candidate = None
        self.target_source = ""
        self.init_seed = 0
        self.model = None
        self.inputs: list = []

    def send(self, **msg) -> None:
        self.reply.write(json.dumps(msg) + "\n")

    def load(self, target_source: str, candidate: str, init_seed: int) -> dict:
        import importlib.util

        self.target_source, self.init_seed = target_source, init_seed
        record.install()
        _mark_compiling(self)
        if DEVICE.type == "cpu":  # the candidate plans as it would on a GPU (sandbox/cuda_probes.py)
            cuda_probes.install()
            if os.environ.get("TRITON_INTERPRET") == "1":  # else compiled for the GPU it plans for, not run
                libdevice_cpu.interpreter_compat()
        spec = importlib.util.spec_from_file_location("candidate", candidate)
        module = importlib.util.module_from_spec(spec)
        sys.modules["candidate"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            return _error("compile_error", e)
        if not hasattr(module, "ModelNew"):
            return {"status": "rejected", "message": "the candidate defines no ModelNew"}
        self.candidate = module
        return {"status": "ok"}

    def build(self, shape: int, overrides: dict, seed: int, perturb: int | None = None) -> dict:
        """ModelNew at this shape (seeded like the reference, so parameters match), and one call of forward that
        compiles (and autotunes): no kernel runs here except those Triton's autotuner times. perturb: a weights
        trial's seed (tools/weights.py): the candidate's tensors that equal a reference entry are drawn as the
        referee draws that entry; the reply names the entries matched."""
        matched = None
        try:
            target = module_from_source(self.target_source, overrides, f"kloop_target_{shape}")
            torch.manual_seed(self.init_seed)
            init_inputs = target.get_init_inputs()
            torch.manual_seed(self.init_seed)
            self.model = self.candidate.ModelNew(*init_inputs).to(DEVICE)
            if perturb is not None:
                torch.manual_seed(self.init_seed)
                reference = target.Model(*init_inputs).to(DEVICE)
                matched = weights.perturb_candidate(self.model, reference, perturb)
                del reference
        except BaseException as e:
            return _error("compile_error", e)
        self.inputs = make_inputs(target, seed)
        try:
            self.send(status="progress", progress="forward")   # its Python counts from here (PythonClock)
            with torch.no_grad():
                self.model(*self.inputs)
        except record.PlanRefused as e:
            return {"status": e.status, "message": str(e)}
        except BaseException as e:
            return _error("runtime_error", e)
        return {"status": "ok"} if matched is None else {"status": "ok", "matched": matched}

    def record(self, out: str, records: int = 3) -> dict:
        """Record `records` calls of the built model: they must all launch the same plan, which is written."""
        out_dir = Path(out)
        out_dir.mkdir(parents=True, exist_ok=True)
        plans = []
        try:
            with torch.no_grad():
                for _ in range(records + MAX_RECORDS):
                    out = None  # the last call's outputs go before the next call makes its own (full size: GBs)
                    # Only the first recording keeps its files; the others are only compared with it.
                    with record.recording(None if plans else out_dir, self.inputs) as recorder:
                        out = self.model(*self.inputs)
                    if recorder.autotuned:  # Triton's autotuner ran inside the call: that call is not the plan
                        continue
                    problem = recorder.problems()
                    if problem:
                        return {"status": problem[0], "message": problem[1]}
                    plans.append(recorder.finish(out))
                    if len(plans) == records:
                        break
        except record.PlanRefused as e:
            return {"status": e.status, "message": str(e)}
        except BaseException as e:
            return _error("runtime_error", e)
        if not plans:
            return {"status": "runtime_error", "message": "Triton's autotuner never settled on a configuration"}
        if any(record.comparable(p) != record.comparable(plans[0]) for p in plans[1:]):
            return {"status": "rejected", "message": "forward launched different work on different calls (after "
                    "the first): a kernel's work must not depend on how often it was called"}
        planfmt.dump(plans[0], out_dir)
        return {"status": "ok"}


def _mark_compiling(planner: Planner) -> None:
    """Tell the evaluator when Triton compiles or autotunes a kernel, or ptxas assembles one: that time is not the
    candidate's own Python (sandbox.process.PythonClock). Nested calls say it once."""
    import functools

    from triton.runtime import autotuner, jit

    from tools import launch

    depth = [0]

    def marked(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            depth[0] += 1
            if depth[0] == 1:
                planner.send(status="progress", progress="compiling")
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    planner.send(status="progress", progress="compiled")
        return call

    if hasattr(jit.JITFunction, "_do_compile"):
        jit.JITFunction._do_compile = marked(jit.JITFunction._do_compile)
    autotuner.Autotuner._bench = marked(autotuner.Autotuner._bench)
    launch._assemble_cached = marked(launch._assemble_cached)


def _error(status: str, e: BaseException) -> dict:
    from triton.compiler.errors import CompilationError
    from triton.runtime.interpreter import InterpreterError

    from tools.assemble import PtxAssembleError

    # Triton compiles at the first launch and ptxas at PtxKernel construction: their errors are compile errors
    # (Triton's JIT refuses a kernel that calls a Python function, e.g. torch.add, with a RuntimeError).
    # The interpreter has no compile step; the name errors Triton's compiler would catch surface as InterpreterError.
    if isinstance(e, (CompilationError, PtxAssembleError, SyntaxError)) or \
            (isinstance(e, RuntimeError) and str(e).startswith("Unsupported function referenced")) or \
            (isinstance(e, InterpreterError) and isinstance(e.__cause__, (NameError, SyntaxError))):
        status = "compile_error"
    if isinstance(e, torch.OutOfMemoryError):
        return {"status": "runtime_error", "message": f"out of memory while planning: {str(e)[:300]}"}
    return {"status": status, "message": _said(e)[:4000], "traceback": traceback.format_exc(limit=-8)[-6000:]}


def _said(e: BaseException) -> str:
    """One line for the failure: a bare `assert` names its line of the candidate, and on the CPU a failure that
    only a GPU can get past says so."""
    message = f"{type(e).__name__}: {e}"
    if isinstance(e, AssertionError) and not str(e):
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename.endswith("candidate.py")]
        if frames:
            what = f"`{frames[-1].line}`" if frames[-1].line else "an assert"
            message = f"AssertionError: {what} failed (candidate line {frames[-1].lineno})"
    if os.environ.get("TRITON_INTERPRET") == "1" and any(word in str(e) for word in GPU_ONLY):
        message += " (planned under Triton's CPU interpreter, which cannot run this: it needs a GPU)"
    return message


def serve(reply, workdir: Path) -> None:
    """Answer commands until stdin closes or `exit` comes (the ready line was sent by sandbox/warm.py)."""
    planner = Planner(reply)
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            op = cmd.pop("cmd")
            answer = getattr(planner, op)(**cmd) if op in ("load", "build", "record") else None
        except BaseException as e:  # a bug of ours or a candidate that broke the planner: report, never hang
            answer = _error("runtime_error", e)
        if answer is None:
            break
        planner.send(**answer)
