"""What every stage of an evaluation shares (sandbox/evaluate.py's Evaluation is the stages together): the calls to
its processes (planner, executor, referee) and the time spent waiting on them, each reply read into the verdict with a
hidden variant's wording withheld, the seeds of this candidate's inputs, the device it holds.
"""
from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox import jail
from sandbox.process import Child, ChildDied, ChildTimeout
from tools.result import VERDICTS, EvalResult
from tools.target import Target

if TYPE_CHECKING:
    from sandbox.evaluate import Device, EvalSettings, Session

NO_GPU_NOTE = "no CUDA GPU: Triton ran under TRITON_INTERPRET=1 on CPU tensors at small shapes; no timing is real"
# After a candidate whose inputs and outputs fill at most this fraction of the GPU's memory, the executor and referee
# keep their allocators' caches for the next one (same target, same sizes); larger ones give the memory back.
SHALLOW_RELEASE_FRACTION = 1 / 32
LARGE_STATE_BYTES = 1 << 30  # weights above this get jailed processes with room for them, not the warm spares
INPUTS_TIMEOUT_S = 600   # making one set of a shape's inputs (seconds at KernelBench's full sizes)
WITHHELD_CHARS = 2000   # of each withheld reason kept for the operator


def derive_seed(secret: int, *parts) -> int:
    digest = hashlib.sha256(":".join(map(str, (secret,) + parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


class Stage:
    """The state of one candidate's evaluation, made by Evaluation.__init__ (sandbox/evaluate.py) and shared by its
    stages, and the plumbing they all use."""

    session: Session
    target: Target
    source: str
    settings: EvalSettings
    index: int
    device: Device | None
    salt: int
    shapes: list[dict]
    shape_keys: list[str]
    weights_index: int | None
    matched: list[str]
    _referee_shapes: set[int]   # shapes the device's referee was told, and which referee start
    _referee_start: int | None
    init_seed: int
    planner: Child | None
    executor: Child | None
    plans_dir: Path | None
    keys: list[str]
    output_meta: list[list[dict]]
    io_bytes: int | None
    _locked: bool   # the device is held (bind) until release_device
    abandoned: bool
    result: EvalResult

    def _seed(self, *parts) -> int:
        """A seed for this candidate's inputs: from the run's secret and a salt of this evaluation's own, so no two
        candidates of a session see the same inputs (a kernel cannot remember outputs across evaluations)."""
        return derive_seed(self.settings.seed, self.salt, *parts)

    def _jail_limits(self, planner: bool = False) -> jail.Limits | None:
        """Room for the target's weights where they are large, and for its inputs and outputs where a planner keeps
        them in host memory (one without a device), in a jailed planner or executor (None: the warm spares'
        defaults suffice)."""
        state = self.target.state_bytes(small=not self.session.cuda)
        io = self.target.io_bytes(small=False) if planner and self.session.pool.deviceless else 0
        return jail.Limits.holding(state, io) if max(state, io) > LARGE_STATE_BYTES else None

    def bind(self, device: Device) -> None:
        """This evaluation's device phase runs on `device` (held until release_device)."""
        device.lock.acquire()
        self.device, self._locked = device, True

    def release_device(self) -> None:
        """Give the device back: the referee unmaps the executor's buffers, the executor unloads this candidate's
        plans and frees its inputs (and its allocator's cache when the inputs are large); the plans stay on disk
        (a new best is copied from them). Without a GPU the jailed executor is closed."""
        try:
            if self.executor is not None:
                began = time.perf_counter()
                if self.session.cuda:
                    total = (self.result.gpu or {}).get("total_memory_bytes") or 0
                    deep = self.io_bytes is None or not total or self.io_bytes > total * SHALLOW_RELEASE_FRACTION
                    with contextlib.suppress(ChildDied, ChildTimeout):
                        self.device.referee().call(60, cmd="release", deep=deep)
                    if self.executor.alive():
                        for key in self.keys:
                            self._call(self.executor, 60, "unload", key=key)
                        self._call(self.executor, 60, "release", deep=deep)
                else:
                    self.executor.close()
                self.executor = None
                self._waited("release", began)
        finally:
            if self._locked:
                self._locked = False
                self.device.lock.release()

    def _run_timeout(self) -> float:
        return self.settings.hang_timeout_s if self.session.cuda else self.settings.run_timeout_s

    def _round_timeout(self, i: int, seed: int, family: str) -> float | None:
        """The limit of one round on shape i: the hang limit, plus slack for making its inputs (at full size that
        can take seconds). What making them takes is measured here, by a command of its own with the inputs' limit,
        the first time the device meets the shape, so a kernel that hangs costs the hang limit, never the inputs'.
        None if that failed (the verdict is set)."""
        shape_key = self.shape_keys[i]
        known = self.device.inputs_s.get(shape_key)
        if known is None:
            began = time.perf_counter()
            reply = self._call(self.executor, INPUTS_TIMEOUT_S, "inputs", shape=shape_key, seed=seed, family=family)
            if not self._ok(reply, hidden=self._variant(i)):
                return None
            known = self.device.inputs_s[shape_key] = time.perf_counter() - began
        return self._run_timeout() + 10 + 20 * known

    def _call(self, child, timeout_s: float, cmd: str, python_s: float | None = None, **kwargs) -> dict:
        started = time.perf_counter()
        try:
            return child.call(timeout_s, **({} if python_s is None else {"python_s": python_s}), cmd=cmd, **kwargs)
        except ChildTimeout as e:
            return {"status": "timeout", "message": f"{cmd}: {e}; the process and everything it started were killed"}
        except ChildDied as e:
            return {"status": "runtime_error", "message": f"{cmd}: {e}"}
        finally:  # where an evaluation's time goes: waiting on other processes, per command (the rest is ours)
            self._waited(f"{'planner' if child is self.planner else 'executor'}:{cmd}", started)

    def _ref(self, timeout_s: float, cmd: str, **kwargs) -> dict:
        """One referee command. A referee that ends (its CUDA context gone: a reference's device-side assert) answers
        `fatal`; it is dropped, and the next command starts another, told this evaluation's shapes first."""
        started = time.perf_counter()
        try:
            referee = self.device.referee()
            if cmd != "shape" and self._referee_shapes and self._referee_start != self.device.referee_starts:
                self._referee_start = self.device.referee_starts
                for i in sorted(self._referee_shapes):
                    referee.call(600, cmd="shape", **self._shape_command(i))
            reply = referee.call(timeout_s, cmd=cmd, **kwargs)
        except (ChildDied, ChildTimeout) as e:
            reply = {"status": "error", "message": f"the referee's process ended: {e}", "fatal": True}
        finally:
            self._waited(f"referee:{cmd}", started)
        if reply.get("fatal"):
            self.device.drop_referee()
        return reply

    def _shape_command(self, i: int) -> dict:
        weights = {"perturb": self._seed("weights"), "matched": self.matched} if i == self.weights_index else {}
        return {"shape": self.shape_keys[i], "target_source": self.target.source, "overrides": self.shapes[i],
                "init_seed": self.init_seed, **weights}

    def _variant(self, i: int) -> int | None:
        """i when shape i is a hidden variant (what a policy may learn of it is its number and the verdict), else
        None: the main shape, and the main shape's weights trial."""
        return i if 0 < i != self.weights_index else None

    def _shape_name(self, i: int) -> str:
        if i == self.weights_index:
            return "main shape, its parameters drawn at random"
        return f"hidden variant {i}" if i else "main shape"

    def _referee_shape(self, i: int) -> None:
        self._ref(600, "shape", **self._shape_command(i))
        self._referee_shapes.add(i)
        self._referee_start = self.device.referee_starts

    def _waited(self, what: str, since: float) -> None:
        """Time spent waiting on `what`, summed, and how many waits: a slower call and more calls look alike in
        the sum alone."""
        waited = self.result.durations_s.setdefault("waited", {})
        waited[what] = round(waited.get(what, 0.0) + time.perf_counter() - since, 4)
        calls = self.result.durations_s.setdefault("calls", {})
        calls[what] = calls.get(what, 0) + 1

    def _ok(self, reply: dict, hidden: int | None, stage: str = "") -> bool:
        status = reply.get("status")
        if status == "ok":
            return True
        message = str(reply.get("message") or "no reason given")
        verdict = status if status in VERDICTS else "runtime_error"
        if hidden is None and reply.get("traceback"):
            self.result.compile_log = (self.result.compile_log + "\n" + str(reply["traceback"])).strip()
        if stage == "profile" and verdict != "timeout":
            message = f"failed while being timed: {message}"
        self._finish(verdict, *self._hidden(hidden, verdict, message))
        return False

    def _hidden(self, index: int | None, verdict: str, *reasons: str) -> list[str]:
        """Reasons as the policy may see them: nothing about a hidden shape but its number and the verdict. The
        whole reasons go to the operator alone (EvalResult.withheld)."""
        if not index:
            return list(reasons)
        if self.result.verdict in (None, "correct"):   # the failure that decides the verdict, as _finish keeps it
            self.result.withheld += [f"hidden variant {index}: {verdict}: {r[:WITHHELD_CHARS]}" for r in reasons]
        return [f"hidden variant {index}: {verdict}"]

    def _overran(self, reply: dict, i: int) -> bool:
        """A replay (or one while the executor autotuned a plan at load) wrote into a guard region around one of its
        buffers (sandbox/executor.py): incorrect."""
        if not reply.get("overrun"):
            return False
        self._finish("incorrect", *self._hidden(self._variant(i), "incorrect", f"{self._shape_name(i)}: "
                                                                                 f"{reply['overrun']}"))
        return True

    def _finish(self, verdict: str, *reasons: str) -> None:
        if self.result.verdict is None or self.result.verdict == "correct":
            self.result.verdict = verdict
            self.result.reasons += list(reasons)
        if not self.session.cuda and self.result.timing_note is None:
            self.result.timing_note = NO_GPU_NOTE

    def _stage(self, name: str):
        @contextlib.contextmanager
        def timed():
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.result.durations_s[name] = round(time.perf_counter() - t0, 3)
        return timed()
