"""The trusted evaluator: judge one candidate against one target, in stages the graph can call one by one.

    with Evaluation(target, source) as ev:
        ev.assemble()   # rules, then import + build + one warm-up call per shape in a fresh sandboxed worker
        ev.verify()     # fresh seeded inputs, the reference computed here, outputs compared here
        ev.profile()    # timings with L2 flush (GPU), NVML, roofline, optional Nsight Compute
    ev.result          # one JSON-able dict (docs/design.md)

Nothing the worker says is believed except the bytes of its output tensors, compared here against a reference this
process computed on inputs it generated itself from a secret per-run seed.
"""
from __future__ import annotations

import hashlib
import json
import platform
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sandbox.ipc import share_buffer
from sandbox.pool import WorkerDied, WorkerPool, WorkerProcess, WorkerTimeout, scrubbed_env
from tools import profile, rules, verify
from tools.inputs import DEVICE, make_inputs, round_seed
from tools.numerics import pin_numeric_flags
from tools.target import Target

VERDICTS = ("correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected")
NO_GPU_NOTE = "no CUDA GPU: Triton ran under TRITON_INTERPRET=1 on CPU tensors at small shapes; no timing is real"


@dataclass
class EvalSettings:
    trials: int = 5                   # on the main shape; each hidden variant gets variant_trials more
    variant_trials: int = 2
    seed: int | None = None           # the run's secret; random when None. Never given to the worker.
    timed_calls: int = 30
    warmup_calls: int = 5
    load_timeout_s: float = 300.0     # import + build + first call (Triton compiles, autotunes)
    run_timeout_s: float = 120.0      # one trial
    time_timeout_s: float = 600.0     # the whole timing phase (torch.compile of the reference included)
    baselines: tuple[str, ...] = ("eager", "compile")
    # torch.compile (max-autotune) of the reference costs seconds even from its cache. "reuse": measure it once per
    # process and target, interleaved with eager, then derive it for later candidates from the eager time measured
    # beside them (marked derived_from_eager). "measure": every time.
    compile_baseline: str = "reuse"
    ncu: bool = False
    small: bool | None = None         # CPU-sized shapes; default: when there is no GPU
    max_speedup: float = 10.0         # above this, re-measure and flag

    def __post_init__(self):
        if self.seed is None:
            self.seed = secrets.randbits(62)
        if self.small is None:
            self.small = DEVICE.type != "cuda"


_COMPILE_TO_EAGER: dict[str, float] = {}  # target and shape -> torch.compile time / eager time, measured side by side


KEPT_ROUNDS = 3  # timed rounds whose outputs are checked afterwards


def derive_seed(secret: int, *parts) -> int:
    digest = hashlib.sha256(":".join(map(str, (secret,) + parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2




def _encode(values: dict) -> dict:
    return {k: (str(v) if isinstance(v, torch.dtype) else v) for k, v in values.items()}


def versions() -> dict:
    import triton

    try:
        import cupy
        cupy_version = cupy.__version__
    except Exception:
        cupy_version = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "cupy": cupy_version, "cuda": torch.version.cuda}


class Evaluation:
    def __init__(self, target: Target, source: str, settings: EvalSettings | None = None,
                 pool: WorkerPool | None = None) -> None:
        self.target = target
        self.source = source
        self.settings = settings or EvalSettings()
        self.pool = pool
        self.worker: WorkerProcess | None = None
        self.shapes = target.shapes(self.settings.small)
        self.init_seed = derive_seed(self.settings.seed, "init")
        self._buffers: dict[tuple, tuple[torch.Tensor, dict]] = {}
        self._started = time.perf_counter()
        self.result: dict = {
            "verdict": None, "reasons": [], "language": rules.detect_language(source),
            "executed_on": None, "time_us": None, "baselines": None, "speedup": None, "roofline": None,
            "resources": [], "ptx": {}, "sass": {}, "compile_log": "", "correctness": None, "nvml": None,
            "ncu": None, "flags": [], "numeric_flags": pin_numeric_flags(), "timing_note": None,
            "gpu": profile.gpu_info() if DEVICE.type == "cuda" else None, "versions": versions(),
            "stdout": "", "stderr": "", "durations_s": {},
        }

    # -- stages ------------------------------------------------------------------------------------------------
    def assemble(self) -> dict:
        t0 = time.perf_counter()
        try:
            self._assemble()
        finally:
            self.result["durations_s"]["assemble"] = round(time.perf_counter() - t0, 3)
        return self.result

    def _assemble(self) -> None:
        try:
            broken = rules.check_source(self.source)
        except SyntaxError as e:
            return self._finish("compile_error", f"syntax error at line {e.lineno}: {e.msg}")
        if broken:
            return self._finish("rejected", *broken)
        self.worker = self.pool.acquire() if self.pool else WorkerProcess()
        candidate_path = self.worker.workdir / "candidate.py"
        candidate_path.write_text(self.source)
        reply = self._call(self.settings.load_timeout_s, cmd="load", target_path=str(self.target.path),
                           candidate_path=str(candidate_path), shapes=[_encode(s) for s in self.shapes],
                           init_seed=self.init_seed)
        if not self._ok(reply):
            return
        self.result["ptx"] = reply.get("ptx", {})
        for index in range(len(self.shapes)):
            reply = self._call(self.settings.load_timeout_s, cmd="warmup", shape=index,
                               seed=derive_seed(self.settings.seed, "warmup", index))
            if not self._ok(reply):
                return
            self.result["executed_on"] = "cuda" if DEVICE.type == "cuda" else "cpu-interpreter"
        self._take_resources(reply)

    def verify(self) -> dict:
        if self.result["verdict"] is not None:
            return self.result
        t0 = time.perf_counter()
        try:
            self._verify()
        finally:
            self.result["durations_s"]["verify"] = round(time.perf_counter() - t0, 3)
        return self.result

    def _verify(self) -> None:
        worst = {"max_abs_err": 0.0, "max_rel_err": 0.0}
        trials = 0
        for index, shape in enumerate(self.shapes):
            with self.target.overrides(shape):
                torch.manual_seed(self.init_seed)
                init_inputs = self.target.module.get_init_inputs()
                torch.manual_seed(self.init_seed)
                reference = self.target.module.Model(*init_inputs).to(DEVICE)
                count = self.settings.trials if index == 0 else self.settings.variant_trials
                for trial in range(count):
                    seed = derive_seed(self.settings.seed, "trial", index, trial)
                    with torch.no_grad():
                        expected = verify_outputs_of(reference, make_inputs(self.target.module, seed))
                    lent = self._lend(index, expected) if DEVICE.type == "cuda" else []
                    reply = self._call(self.settings.run_timeout_s, cmd="trial", shape=index, seed=seed,
                                       out_prefix=str(self.worker.workdir / f"out-{index}-{trial}"),
                                       buffers=[desc for _, desc in lent])
                    if not self._ok(reply):
                        return
                    trials += 1
                    if reply.get("forbidden_ops"):
                        return self._finish("rejected", "ModelNew.forward computed with PyTorch ops: "
                                            + ", ".join(reply["forbidden_ops"][:8])
                                            + " (only allocation, views and zero-fill are allowed)")
                    if not reply.get("launches"):
                        return self._finish("rejected", "no kernel of the candidate's was launched in forward "
                                            "(its own Triton or PTX kernels must do the work)")
                    if reply.get("problems"):
                        return self._finish("incorrect", *reply["problems"])
                    reasons = self._compare(reply.get("outputs", []), expected, [buf for buf, _ in lent], worst)
                    self._discard_files(reply)
                    if reasons:
                        where = f"shape {index} ({'main' if index == 0 else 'hidden variant'}), trial {trial + 1}"
                        self.result["correctness"] = dict(worst, trials=trials, shapes=len(self.shapes))
                        return self._finish("incorrect", *[f"{where}: {r}" for r in reasons])
        self.result["correctness"] = dict(worst, trials=trials, shapes=len(self.shapes))
        self.result["verdict"] = "correct"

    def _lend(self, shape, expected: list) -> list[tuple[torch.Tensor, dict]]:
        """One output buffer per shape and output, shared once (opening an IPC handle is slow), poisoned per trial."""
        lent = []
        for i, ref in enumerate(expected):
            nbytes = ref.numel() * ref.element_size()
            key = (shape, i)
            if key not in self._buffers or self._buffers[key][0].numel() != nbytes:
                self._buffers[key] = share_buffer(nbytes, DEVICE)
            buf, desc = self._buffers[key]
            buf.fill_(0xFF)
            lent.append((buf, desc))
        return lent

    def _compare(self, metas: list, expected: list, lent: list, worst: dict) -> list[str]:
        if len(metas) != len(expected):
            return [f"forward returned {len(metas)} outputs, the reference returns {len(expected)}"]
        reasons = []
        for i, (meta, ref) in enumerate(zip(metas, expected)):
            try:
                if meta.get("buffer") and i < len(lent):
                    out = verify.view_buffer(meta, lent[i])
                else:
                    out = verify.read_output(meta, self.worker.workdir, DEVICE)
            except (ValueError, OSError) as e:
                return [f"output {i}: {e}"]
            found, stats = verify.compare(out, ref, i)
            reasons += found
            for key in ("max_abs_err", "max_rel_err"):
                if stats.get(key) is not None:
                    worst[key] = max(worst[key], stats[key])
            if "worst" in stats:
                worst["worst"] = stats["worst"]
        return reasons

    def profile(self) -> dict:
        if self.result["verdict"] != "correct":
            return self.result
        t0 = time.perf_counter()
        try:
            self._profile()
        finally:
            self.result["durations_s"]["profile"] = round(time.perf_counter() - t0, 3)
        return self.result

    def _profile(self) -> None:
        main_inputs_seed = derive_seed(self.settings.seed, "time")
        with self.target.overrides(self.shapes[0]):
            torch.manual_seed(self.init_seed)
            init_inputs = self.target.module.get_init_inputs()
            torch.manual_seed(self.init_seed)
            reference = self.target.module.Model(*init_inputs).to(DEVICE)
            inputs = make_inputs(self.target.module, main_inputs_seed)
            with torch.no_grad():
                outputs = verify_outputs_of(reference, inputs)
            nbytes, flops = profile.count_bytes_and_flops(reference, inputs, outputs)
            dtype = next((x.dtype for x in inputs if isinstance(x, torch.Tensor)), torch.float32)
        del inputs, outputs
        if DEVICE.type != "cuda":
            self.result["timing_note"] = NO_GPU_NOTE
            self.result["roofline"] = {"bytes": nbytes, "flops": flops, "bound": None, "sol_us": None,
                                       "sol_fraction": None}
            return
        timings = self._time(main_inputs_seed, reference)
        if timings is None:
            return
        gpu = self.result["gpu"]
        roof = profile.roofline(nbytes, flops, gpu, timings["candidate"]["median"], dtype)
        speedup = self._speedups(timings)
        suspicious = (speedup and max(speedup.values()) > self.settings.max_speedup) or \
            (roof.get("sol_us") and timings["candidate"]["median"] < roof["sol_us"])
        if suspicious:  # measure again before believing it, and say so either way
            again = self._time(derive_seed(self.settings.seed, "time", "again"), reference)
            if again is None:
                return
            timings = again
            roof = profile.roofline(nbytes, flops, gpu, timings["candidate"]["median"], dtype)
            speedup = self._speedups(timings)
            if speedup and max(speedup.values()) > self.settings.max_speedup:
                self.result["flags"].append(f"speedup_over_{self.settings.max_speedup:g}x_remeasured")
            if roof.get("sol_us") and timings["candidate"]["median"] < roof["sol_us"]:
                self.result["flags"].append("below_speed_of_light_remeasured")
        self.result["time_us"] = timings["candidate"]
        self.result["baselines"] = {k: v for k, v in timings.items() if k != "candidate"} or None
        self.result["speedup"] = speedup
        self.result["roofline"] = roof
        for r in self.result["resources"]:
            if r.get("registers") is not None and r.get("threads"):
                from tools import assemble
                r["occupancy"] = assemble.theoretical_occupancy(r["registers"], r.get("shared_bytes") or 0,
                                                                r["threads"])
        if self.settings.ncu:
            self.result["ncu"] = self._ncu()

    def _time(self, seed: int, reference: torch.nn.Module) -> dict | None:
        """One interleaved timing in the worker; None (and a verdict) if the candidate misbehaved while timed."""
        calls = self.settings.timed_calls
        keep_rounds = sorted(secrets.SystemRandom().sample(range(calls), min(KEPT_ROUNDS, calls)))
        with self.target.overrides(self.shapes[0]), torch.no_grad():
            expected = verify_outputs_of(reference, make_inputs(self.target.module, round_seed(seed, 0)))
        lent = [self._lend(("time", r), expected) for r in range(len(keep_rounds))]
        before = profile.nvml_snapshot()
        baselines = list(self.settings.baselines)
        ratio_key = f"{self.target.sha256}:{json.dumps(_encode(self.shapes[0]), sort_keys=True)}"
        derive = "compile" in baselines and "eager" in baselines and self.settings.compile_baseline == "reuse" \
            and ratio_key in _COMPILE_TO_EAGER
        if derive:
            baselines.remove("compile")
        reply = self._call(self.settings.time_timeout_s, cmd="time", seed=seed, calls=calls,
                           warmup=self.settings.warmup_calls, baselines=baselines, keep_rounds=keep_rounds,
                           buffers=[[desc for _, desc in bufs] for bufs in lent],
                           out_prefix=str(self.worker.workdir / "timed"))
        after = profile.nvml_snapshot()
        if not self._ok(reply, stage="profile") or not self._timed_calls_honest(reply, seed, reference, lent):
            return None
        timings = reply["timings"]
        if derive:
            ratio = _COMPILE_TO_EAGER[ratio_key]
            timings["compile"] = {"median": timings["eager"]["median"] * ratio, "derived_from_eager": True,
                                  "compile_to_eager": ratio}
        elif "compile" in timings and "eager" in timings:
            _COMPILE_TO_EAGER[ratio_key] = timings["compile"]["median"] / timings["eager"]["median"]
        throttled = profile.throttle_reasons(before, after) if before and after else []
        self.result["nvml"] = {"before": before, "after": after, "throttled": bool(throttled), "reasons": throttled}
        if throttled and "throttled" not in self.result["flags"]:
            self.result["flags"].append("throttled")
        cand = timings.get("candidate", {})
        if cand.get("events_total_ms") and cand.get("wall_total_ms") and \
                cand["events_total_ms"] > cand["wall_total_ms"] * 1.05:
            self.result["flags"].append("events_exceed_wall_clock")
        return timings

    def _timed_calls_honest(self, reply: dict, seed: int, reference: torch.nn.Module, lent: list) -> bool:
        """Timed calls get fresh data each round; the outputs of rounds only we knew in advance must be right too,
        so a candidate cannot be fast by being wrong (or idle, or PyTorch) once verification is over."""
        if reply.get("forbidden_ops"):
            self._finish("rejected", "while timed, ModelNew.forward computed with PyTorch ops: "
                         + ", ".join(reply["forbidden_ops"][:8]))
            return False
        if not reply.get("min_launches"):
            self._finish("rejected", "a timed call launched none of the candidate's kernels")
            return False
        kept = reply.get("kept") or []
        if len(kept) != len(lent):
            self._finish("incorrect", f"the worker returned {len(kept)} of the {len(lent)} timed outputs asked for")
            return False
        worst = {"max_abs_err": 0.0, "max_rel_err": 0.0}
        for entry, bufs in zip(kept, lent):
            with self.target.overrides(self.shapes[0]), torch.no_grad():
                round_inputs = make_inputs(self.target.module, round_seed(seed, entry["round"]))
                expected = verify_outputs_of(reference, round_inputs)
            reasons = self._compare(entry.get("outputs", []), expected, [buf for buf, _ in bufs], worst)
            self._discard_files(entry)
            if reasons:
                self._finish("incorrect", *[f"timed call {entry['round'] + 1}: {r}" for r in reasons])
                return False
        return True

    @staticmethod
    def _speedups(timings: dict) -> dict | None:
        cand = timings["candidate"]["median"]
        out = {name: timings[name]["median"] / cand for name in ("eager", "compile") if name in timings and cand}
        return out or None

    def _ncu(self) -> dict | None:
        spec = {"target_path": str(self.target.path), "candidate_path": str(self.worker.workdir / "candidate.py"),
                "shapes": [_encode(s) for s in self.shapes], "init_seed": self.init_seed,
                "seed": derive_seed(self.settings.seed, "ncu"), "calls": 3}
        spec_path = self.worker.workdir / "ncu-spec.json"
        spec_path.write_text(json.dumps(spec))
        names = [r["kernel"] for r in self.result["resources"] if r.get("kernel")]
        regex = "|".join(names) or None
        try:
            return profile.run_ncu([sys.executable, "-m", "sandbox.worker", "--once", str(spec_path)],
                                   env=scrubbed_env(self.worker.workdir), kernel_regex=regex, timeout_s=300)
        except Exception as e:  # counters are optional: their absence is reported, never fatal
            self.result["flags"].append(f"ncu_failed: {str(e)[:200]}")
            return None

    # -- plumbing ------------------------------------------------------------------------------------------------
    def _call(self, timeout_s: float, **cmd) -> dict:
        started = time.perf_counter()
        try:
            return self.worker.call(timeout_s, **cmd)
        except WorkerTimeout as e:
            return {"status": "timeout", "message": f"{cmd['cmd']}: {e}; the worker's process group was killed"}
        except WorkerDied as e:
            return {"status": "runtime_error", "message": f"{cmd['cmd']}: {e}", "died": True}
        finally:  # where an evaluation's time goes: waiting on the worker, per command (the rest is ours)
            waited = self.result["durations_s"].setdefault("worker", {})
            waited[cmd["cmd"]] = round(waited.get(cmd["cmd"], 0.0) + time.perf_counter() - started, 3)

    def _ok(self, reply: dict, stage: str = "") -> bool:
        status = reply.get("status")
        if status == "ok":
            return True
        if status == "not_run":  # PTX without a GPU: assembled (resources known), not run
            self._take_resources(reply)
            self.result["timing_note"] = "no CUDA GPU: the PTX was assembled for sm_90 by ptxas but not run"
            self._finish("runtime_error", f"not run: {reply.get('message', 'no CUDA GPU')}")
            return False
        message = str(reply.get("message", "the worker gave no reason"))
        if reply.get("traceback"):
            self.result["compile_log"] = (self.result["compile_log"] + "\n" + str(reply["traceback"])).strip()
        if reply.get("died") and DEVICE.type == "cuda":
            self._check_gpu_health()
        verdict = status if status in VERDICTS else "runtime_error"
        if stage == "profile" and verdict != "timeout":
            message = f"failed while being timed: {message}"
        self._finish(verdict, message)
        return False

    def _take_resources(self, reply: dict) -> None:
        self.result["resources"] = reply.get("resources", self.result["resources"])
        self.result["ptx"].update(reply.get("ptx", {}))
        for row in self.result["resources"]:  # PTX and SASS sit in each kernel's row: keep them once, by kernel
            for listing in ("ptx", "sass"):
                text = row.pop(listing, None)
                if text:
                    self.result[listing][row.get("kernel", "kernel")] = text
        logs = [r.get("log", "") for r in self.result["resources"] if r.get("log")]
        if logs:
            self.result["compile_log"] = "\n".join(logs)

    def _check_gpu_health(self) -> None:
        """A crashed worker must not leave the GPU broken for the next candidate."""
        try:
            probe = torch.ones(1024, device=DEVICE) * 2
            torch.cuda.synchronize()
            healthy = float(probe.sum()) == 2048.0
        except Exception as e:
            healthy, self.result["flags"] = False, self.result["flags"] + [f"gpu_unhealthy: {e}"]
        if not healthy:
            raise RuntimeError("the GPU did not pass a health check after a candidate crashed")

    def _discard_files(self, reply: dict) -> None:
        for meta in reply.get("outputs", []):
            if meta.get("file"):
                Path(meta["file"]).unlink(missing_ok=True)

    def _finish(self, verdict: str, *reasons: str) -> None:
        self.result["verdict"] = verdict
        self.result["reasons"] += list(reasons)
        if DEVICE.type != "cuda" and self.result["timing_note"] is None:
            self.result["timing_note"] = NO_GPU_NOTE

    def close(self) -> dict:
        if self.worker is not None:
            self.result["stdout"] = self.worker.stdout()
            self.result["stderr"] = self.worker.stderr()
            self.worker.close()
            self.worker = None
        self._buffers.clear()
        if DEVICE.type == "cuda":
            torch.cuda.ipc_collect()  # free the output buffers lent to the worker, now that it is gone
        self.result["durations_s"]["total"] = round(time.perf_counter() - self._started, 3)
        return self.result

    def __enter__(self) -> "Evaluation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def verify_outputs_of(model: torch.nn.Module, inputs: list) -> list[torch.Tensor]:
    out = model(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def evaluate(target: Target, source: str, settings: EvalSettings | None = None, pool: WorkerPool | None = None) -> dict:
    """All three stages; the verdict stops the ones after a failure."""
    with Evaluation(target, source, settings, pool) as ev:
        ev.assemble()
        ev.verify()
        ev.profile()
    return ev.result
