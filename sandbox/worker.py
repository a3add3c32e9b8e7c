"""The untrusted side: one process per candidate, driven by the trusted evaluator over a pipe.

Started warm (torch and triton imported, CUDA initialised) by sandbox/pool.py with a scrubbed environment. Commands
arrive as JSON lines on stdin; replies go out as JSON lines on the control fd, never on stdout, which belongs to the
candidate and is only ever stored. Output tensors travel as raw bytes in files of the worker's own temp dir, so the
trusted side never unpickles anything this process wrote.

Commands: load, warmup, trial, time, exit. See sandbox/pool.py for the client side.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch
import triton  # noqa: F401  (imported while warm, so a candidate's first import costs nothing)

from sandbox import harness
from tools.inputs import DEVICE, make_inputs, round_seed
from tools.numerics import pin_numeric_flags





def _import_file(path: str, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _raw_bytes(t: torch.Tensor) -> torch.Tensor:
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)


def _send_tensor(t: torch.Tensor, path: str, buffer: dict | None) -> dict:
    """Hand an output to the trusted side: into its GPU buffer when it gave one of the right size, else a raw file."""
    meta = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
    raw = _raw_bytes(t)
    if buffer is not None and raw.is_cuda and raw.numel() == buffer["nbytes"]:
        from sandbox.ipc import open_shared_buffer

        open_shared_buffer(buffer).copy_(raw)
        torch.cuda.synchronize()
        return dict(meta, buffer=True)
    raw.cpu().numpy().tofile(path)
    return dict(meta, file=path)


class Worker:
    def __init__(self, reply_fd: int) -> None:
        self.reply = os.fdopen(reply_fd, "w", buffering=1)
        self.watch = harness.LaunchWatch()
        self.models: dict[int, torch.nn.Module] = {}
        self.target = None
        self.shapes: list[dict] = []
        self.last_outputs: list[tuple[int, torch.device]] = []

    def send(self, **msg) -> None:
        self.reply.write(json.dumps(msg) + "\n")

    # -- commands -------------------------------------------------------------------------------------------
    def load(self, target_path: str, candidate_path: str, shapes: list[dict], init_seed: int) -> dict:
        self.target = _import_file(target_path, "kloop_target")
        self.shapes = shapes
        self.init_seed = init_seed
        self.models: dict[int, torch.nn.Module] = {}
        self.watch.install()
        try:
            self.candidate = _import_file(candidate_path, "candidate")
        except Exception as e:
            return self._error("compile_error", e)
        if not hasattr(self.candidate, "ModelNew"):
            return {"status": "rejected", "message": "the candidate defines no ModelNew"}
        return self._build(0) or {"status": "ok", "device": DEVICE.type, "ptx": self._ptx_kernels()}

    def _build(self, shape: int) -> dict | None:
        """One ModelNew per shape, seeded like the reference so their parameters match; reused for every trial."""
        if shape in self.models:
            return None
        try:
            with self._shape(shape):
                torch.manual_seed(self.init_seed)
                init_inputs = self.target.get_init_inputs()
                torch.manual_seed(self.init_seed)
                self.models[shape] = self.candidate.ModelNew(*init_inputs).to(DEVICE)
        except Exception as e:
            return self._error("compile_error", e)
        return None

    def warmup(self, shape: int, seed: int) -> dict:
        """One untimed, unchecked call per shape: Triton compiles (and autotunes) here, off the record."""
        failed = self._build(shape)
        if failed:
            return failed
        with self._shape(shape):
            inputs = make_inputs(self.target, seed)
            try:
                out = self.models[shape](*inputs)
                self._sync()
            except Exception as e:
                return self._error("runtime_error", e)
        outputs = harness.flatten_outputs(out)
        del out, inputs
        self._forget(outputs)
        return {"status": "ok", "resources": self._resources(), "ptx": self._ptx_kernels()}

    def trial(self, shape: int, seed: int, out_prefix: str, buffers: list | None = None) -> dict:
        started = time.perf_counter()
        with self._shape(shape):
            inputs = make_inputs(self.target, seed)
            before = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            try:
                with self.watch.watching():
                    out = self.models[shape](*inputs)
                self._sync()
            except Exception as e:
                return self._error("runtime_error", e)
        outputs = harness.flatten_outputs(out)
        del out  # only `outputs` may hold them now, so _forget really frees (and poisons) their blocks
        problems = harness.output_problems(outputs, inputs, DEVICE)
        for i, (x, x0) in enumerate(zip(inputs, before)):
            if isinstance(x, torch.Tensor) and not harness.same_bits(x, x0):
                problems.append(f"input {i} was modified by forward (inputs must be left unchanged)")
        files = []
        if not problems:
            buffers = buffers or []
            files = [_send_tensor(t, f"{out_prefix}.{i}.bin", buffers[i] if i < len(buffers) else None)
                     for i, t in enumerate(outputs)]
        self._forget(outputs)
        return {"status": "ok", "problems": problems, "outputs": files, "launches": self.watch.launches,
                "forbidden_ops": self.watch.forbidden_ops, "seconds": time.perf_counter() - started}

    def time(self, seed: int, calls: int, warmup: int, baselines: list[str], keep_rounds: list[int] | None = None,
             buffers: list | None = None, out_prefix: str = "") -> dict:
        """Interleaved timing on fresh input data every round (so no output cache can answer), the candidate's calls
        watched like trials; the outputs of the rounds the trusted side named are handed back for checking."""
        from tools import profile

        keep_rounds, buffers = set(keep_rounds or []), buffers or []
        with self._shape(0):
            current = {"inputs": make_inputs(self.target, round_seed(seed, 0))}
            model = self.models[0]
            launches, forbidden, kept = [], set(), {}

            def candidate():
                before = self.watch.count
                with harness.OpRecorder() as recorder:
                    self.watch.recorder = recorder
                    out = model(*current["inputs"])
                self.watch.recorder = None
                forbidden.update(recorder.forbidden)
                launches.append(self.watch.count - before)
                return out

            def keep(name, round_index, out):
                if name == "candidate" and round_index in keep_rounds:
                    kept[round_index] = [t.clone() for t in harness.flatten_outputs(out) if type(t) is torch.Tensor]
                elif name != "candidate":  # a baseline's output is this round's right answer: never leave it lying
                    harness.poison_tensors(harness.flatten_outputs(out))  # where the candidate's next empty() looks

            fns = {"candidate": candidate}
            if "eager" in baselines or "compile" in baselines:
                torch.manual_seed(self.init_seed)
                init_inputs = self.target.get_init_inputs()
                torch.manual_seed(self.init_seed)
                reference = self.target.Model(*init_inputs).to(DEVICE)
                if "eager" in baselines:
                    fns["eager"] = lambda: reference(*current["inputs"])
                if "compile" in baselines:
                    compiled = torch.compile(reference, mode="max-autotune-no-cudagraphs")
                    fns["compile"] = lambda: compiled(*current["inputs"])
            start = time.perf_counter()
            try:
                timings = profile.time_interleaved(
                    fns, calls=calls, warmup=warmup, after_call=keep,
                    before_round=lambda i: current.update(inputs=make_inputs(self.target, round_seed(seed, i))))
            except Exception as e:
                return self._error("runtime_error", e)
        returned = []
        for round_index in sorted(kept):
            lent = buffers[len(returned)] if len(returned) < len(buffers) else []
            returned.append({"round": round_index, "outputs": [
                _send_tensor(t, f"{out_prefix}.{round_index}.{i}.bin", lent[i] if i < len(lent) else None)
                for i, t in enumerate(kept[round_index])]})
        return {"status": "ok", "timings": timings, "seconds": time.perf_counter() - start, "kept": returned,
                "min_launches": min(launches, default=0), "forbidden_ops": sorted(forbidden)}

    # -- helpers -------------------------------------------------------------------------------------------
    def _shape(self, index: int):
        import contextlib

        @contextlib.contextmanager
        def overridden():
            saved = {k: getattr(self.target, k) for k in self.shapes[index]}
            for k, v in self.shapes[index].items():
                setattr(self.target, k, _decode(v))
            try:
                yield
            finally:
                for k, v in saved.items():
                    setattr(self.target, k, v)

        return overridden()

    def _sync(self) -> None:
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()

    def _forget(self, outputs: list) -> None:
        """Drop our references to the outputs and poison their blocks for the next call."""
        sizes = [(t.untyped_storage().nbytes(), t.device) for t in outputs if type(t) is torch.Tensor]
        outputs.clear()
        harness.poison_like(sizes)

    def _error(self, status: str, e: BaseException) -> dict:
        from tools.launch import NoGpuError

        if isinstance(e, NoGpuError):
            return {"status": "not_run", "message": str(e), "resources": self._resources(), "ptx": self._ptx_kernels()}
        if _is_compile_failure(e):
            status = "compile_error"
        tb = traceback.format_exc(limit=-8)
        return {"status": status, "message": f"{type(e).__name__}: {e}"[:4000], "traceback": tb[-6000:]}

    def _ptx_kernels(self) -> dict:
        """PTX text of the candidate's PtxKernel objects, found on the model (launched or not)."""
        from tools.launch import PtxKernel

        found = dict(self.watch.ptx_kernels)
        for model in self.models.values():
            for value in list(vars(model).values()) + list(vars(type(model)).values()):
                if isinstance(value, PtxKernel):
                    found.setdefault(value.name, value)
        candidate = sys.modules.get("candidate")
        for value in vars(candidate).values() if candidate else []:
            if isinstance(value, PtxKernel):
                found.setdefault(value.name, value)
        self._ptx_objects = found
        return {name: k.ptx for name, k in found.items()}

    def _resources(self) -> list[dict]:
        from tools import assemble

        rows = []
        for name, compiled in self.watch.compiled.items():
            rows.append(dict(assemble.triton_kernel_resources(compiled), source="triton",
                             sass=assemble.sass_of(compiled.asm["cubin"]) if "cubin" in compiled.asm else None))
        for name, kernel in getattr(self, "_ptx_objects", {}).items():
            row = dict(kernel.resources, kernel=name, source="ptxas", spills=kernel.resources["spill_stores_bytes"] // 4,
                       sass=assemble.sass_of(kernel.assembly.cubin))
            if kernel.last_launch:  # what the launch asked for decides occupancy as much as what ptxas reports
                row["threads"] = kernel.last_launch["threads"]
                row["shared_bytes"] = kernel.resources["shared_bytes"] + kernel.last_launch["shared_mem"]
            rows.append(row)
        if not rows:
            rows = [{"kernel": n, "source": "triton-interpreter"} for n in sorted(self.watch.triton_names)]
        return rows


def _is_compile_failure(e: BaseException) -> bool:
    """Triton compiles at the first launch and ptxas at PtxKernel construction: their errors are compile errors.
    The interpreter has no compile step; the name errors Triton's compiler would catch surface as InterpreterError."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.interpreter import InterpreterError

    from tools.assemble import PtxAssembleError

    if isinstance(e, InterpreterError) and isinstance(e.__cause__, (NameError, SyntaxError)):
        return True
    return isinstance(e, (CompilationError, PtxAssembleError, SyntaxError))


def _decode(value):
    """Shape overrides travel as JSON; dtypes are written 'torch.float16'."""
    if isinstance(value, str) and value.startswith("torch."):
        return getattr(torch, value.removeprefix("torch."))
    return value


def run_once(spec_path: str) -> None:
    """Standalone mode for Nsight Compute: load, warm up, call the candidate a few times, exit. Prints nothing."""
    spec = json.loads(open(spec_path).read())
    worker = Worker(os.open(os.devnull, os.O_WRONLY))
    for step in (worker.load(spec["target_path"], spec["candidate_path"], spec["shapes"], spec["init_seed"]),
                 worker.warmup(0, spec["seed"])):
        if step["status"] != "ok":
            sys.exit(1)
    inputs = make_inputs(worker.target, spec["seed"])
    for _ in range(spec.get("calls", 3)):
        worker.models[0](*inputs)
    worker._sync()


def main() -> None:
    pin_numeric_flags()
    if sys.argv[1] == "--once":
        run_once(sys.argv[2])
        return
    reply_fd = int(sys.argv[1])
    if DEVICE.type == "cuda":
        torch.zeros(1, device=DEVICE)  # create the context while warm
    with harness.OpRecorder():  # the first dispatch mode of a process pays for lazy imports: pay it while warm
        torch.empty(1, device=DEVICE).zero_()
    worker = Worker(reply_fd)
    worker.send(status="ready", pid=os.getpid(), device=DEVICE.type)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("cmd")
        if op == "exit":
            break
        try:
            reply = getattr(worker, op)(**cmd)
        except Exception as e:  # a bug of ours or a candidate that broke the harness: report, never hang
            reply = worker._error("runtime_error", e)
        worker.send(**reply)
    worker.reply.close()
    os._exit(0)


if __name__ == "__main__":
    main()
