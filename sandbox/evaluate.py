"""The evaluator: judge one candidate against one target, in stages the graph can call one by one.

    with Session() as session:                       # the trusted machinery of one device, kept across candidates
        with session.evaluation(target, source) as ev:
            ev.assemble()    # rules, then the jailed planner records a launch plan per shape; the executor loads them
            ev.verify()      # the executor replays each plan on fresh seeded inputs; the referee compares
            ev.profile()     # timings taken by the executor and the referee, interleaved; roofline; Nsight Compute
        ev.result            # an EvalResult (tools/result.py)

The trust model: a candidate is hostile. Its Python runs only in the jailed planner, whose only product is a plan
(data). What the plan computes is decided by running it in the executor, on inputs the executor makes, and comparing
in the referee with a reference the candidate never sees. Only failures can come from a process that ran candidate
code, and for hidden shapes not even their wording: "hidden variant k: <verdict>".
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import random
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox.plan import ITEMSIZE, PlanError, copy_plan, load_plan
from sandbox import cores, jail, pool
from sandbox.pool import WarmPool
from sandbox.process import Child, ChildDied, ChildTimeout, clean_env, read_limited, scratch_root
from tools import profile, rules
from tools.inputs import DEVICE, FAMILIES, OWN, RANDOM_STATE
from tools.numerics import pin_numeric_flags
from tools.result import CHECKS_VERSION, VERDICTS, Correctness, Counters, EvalResult, Resources, Roofline, Timing, VsBest
from tools.target import Target

NO_GPU_NOTE = "no CUDA GPU: Triton ran under TRITON_INTERPRET=1 on CPU tensors at small shapes; no timing is real"
PTX_NOT_RUN = "no CUDA GPU: the PTX was assembled for sm_90 by ptxas but not run"
EXECUTOR_STATUSES = ("ok", "compile_error", "runtime_error", "rejected", "not_run")
REFEREE_STATUSES = ("ok", "runtime_error", "error")
# Calls of forward recorded at the main shape after the compiling one: they must all launch the same plan, so a
# forward that changes its work after a number of calls is refused rather than judged on its early calls.
RECORDED_CALLS = 20
# After a candidate whose inputs and outputs fill at most this fraction of the GPU's memory, the executor and referee
# keep their allocators' caches for the next one (same target, same sizes); larger ones give the memory back.
SHALLOW_RELEASE_FRACTION = 1 / 32
LARGE_STATE_BYTES = 1 << 30  # weights above this get jailed processes with room for them, not the warm spares
# A plan's module state (parameters, buffers, cached workspaces) may hold at most twice the reference's parameters and
# buffers plus this: the trusted side copies it, keeps it and restores it before every call, so a candidate must not
# make it hold gigabytes a target without weights never needed.
STATE_SLACK_BYTES = 64 << 20
# Targets whose parameters and buffers hold at most this get a weights trial (tools/weights.py); larger ones are
# mostly randomly initialised layers already, and a second copy of their state would cost gigabytes.
WEIGHTS_TRIAL_MAX_BYTES = 256 << 20
# Bytes every plan allocation is filled with before a trial, by trial: NaN bits in every float format, then zeros. A
# kernel that leaves unwritten the elements whose answer is the fill (True in a bool output, 0.0 after a ReLU) fails
# one of the two.
TRIAL_POISONS = (0xFF, 0x00)
INPUTS_TIMEOUT_S = 600   # making one set of a shape's inputs (seconds at KernelBench's full sizes)
WITHHELD_CHARS = 2000   # of each withheld reason kept for the operator
PRUNE_TRIALS = 2   # main-shape trials timed before pruning (the faster counts: a first call may load lazily)
# torch.compile modes the compile baseline can take. max-autotune-no-cudagraphs (autotuned Triton and GEMM templates)
# is the stronger bar; "default" is what `torch.compile(model)` does, and KernelBench's published torch.compile
# baselines. CUDA-graph modes are left out: replaying a graph copies each round's new inputs into its own buffers.
COMPILE_MODES = ("max-autotune-no-cudagraphs", "default")


@dataclass
class EvalSettings:
    trials: int = 2                   # on the main shape in the target's own distribution; then one per input family
    variant_trials: int = 2           # each hidden variant's
    seed: int | None = None           # the run's secret; random when None. Never given to a jailed process.
    timed_calls: int = 30
    warmup_calls: int = 3             # rounds run (and checked) before the timed ones
    load_timeout_s: float = 300.0     # import + build + the compiling call, per shape (compile has its own limit)
    hang_timeout_s: float = 30.0      # one replay of a plan on a GPU, once its compile is done
    run_timeout_s: float = 120.0      # one replay under the CPU interpreter
    baseline_timeout_s: float = 900.0  # torch.compile (max-autotune) of the reference, its first call
    baselines: tuple[str, ...] = ("eager", "compile")
    compile_mode: str = COMPILE_MODES[0]   # the compile baseline's torch.compile mode
    # torch.compile (max-autotune) of the reference costs seconds even from its cache. "reuse": measure it once per
    # session and shape, interleaved with eager, then derive it for later candidates from the eager time measured
    # beside them (marked derived_from_eager). "measure": every time.
    compile_baseline: str = "reuse"
    ncu: bool = False
    small: bool | None = None         # CPU-sized shapes; default: when there is no GPU
    max_speedup: float = 10.0         # above this, re-measure and flag
    paired_calls: int = 30            # rounds of the paired re-measurement against the standing best
    # Pruning: a candidate whose first two main-shape trials both ran more than this many times slower than the
    # standing best of the same target is not verified further (verdict timeout, the reason says so); 0: never.
    prune_slower_than: float = 10.0

    def __post_init__(self):
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"unknown torch.compile mode {self.compile_mode!r} (one of {', '.join(COMPILE_MODES)})")
        if self.seed is None:
            self.seed = secrets.randbits(62)
        if self.small is None:
            self.small = DEVICE.type != "cuda"


def derive_seed(secret: int, *parts) -> int:
    digest = hashlib.sha256(":".join(map(str, (secret,) + parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 2


def versions() -> dict:
    import torch
    import triton

    try:
        import cupy
        cupy_version = cupy.__version__
    except Exception:
        cupy_version = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "cupy": cupy_version, "cuda": torch.version.cuda}


class _InProcess:
    """The CPU referee runs inside the evaluator: the same calls and replies as a Child, without a process. A command
    holds torch's global random state (tools.inputs.RANDOM_STATE) throughout: it seeds and draws (inputs, weights, a
    reference's dropout), and other lanes' referees are threads of this process."""

    def __init__(self, referee) -> None:
        self.referee = referee

    def call(self, timeout_s: float, cmd: str, **kwargs) -> dict:
        from sandbox.referee import answer

        with RANDOM_STATE:
            return answer(self.referee, {"cmd": cmd, **kwargs})

    def close(self) -> None:
        pass


@dataclass
class BestKernel:
    """The standing best of a run: its plans stay on disk, so a challenger can be timed against it side by side."""
    attempt: int | None
    directory: Path
    median_us: float
    target_sha256: str


class Device:
    """The trusted processes of one GPU: its long-lived executor and its referee, and what they learned (the
    torch.compile/eager ratio per shape, restarts). Without a GPU, the CPU: an interpreter executor per candidate
    (jailed, from the pool) and the referee in this process. One evaluation at a time uses a device (`lock`)."""

    def __init__(self, session: "Session", visible: str | None = None) -> None:
        self.session, self.visible, self.cuda = session, visible, session.cuda
        self.lock = threading.RLock()
        self._executor: Child | None = None
        self._referee = None
        self._gpu: dict | None = None
        self._uuid: str | None = None
        # (shape, torch.compile mode) -> torch.compile time / eager time, measured side by side
        self.compile_to_eager: dict[tuple[str, str], float] = {}
        self.restarts = 0
        self.inputs_s: dict[str, float] = {}   # shape key -> seconds the executor takes to make its inputs
        self.referee_starts = 0   # a new referee knows no shapes: evaluations tell it theirs again
        self._target_sha = ""   # the referee keeps one target's reference models at a time

    @property
    def name(self) -> str:
        return "cpu" if not self.cuda else f"cuda:{self.visible}" if self.visible is not None else "cuda"

    def executor(self) -> Child:
        """The GPU's executor, restarted if the last candidate took it down."""
        if self._executor is None or not self._executor.alive():
            self._refuse_if_closed()
            if self._executor is not None:
                self._executor.close()
                self.restarts += 1
            self._executor = Child("sandbox.executor", cuda=True, jailed=False, statuses=EXECUTOR_STATUSES,
                                   workdir=Path(tempfile.mkdtemp(prefix="executor-", dir=self.session.directory)),
                                   visible=self.visible, cpus=self.cpus())
            self._executor.wait_ready()
        return self._executor

    def referee(self):
        """The GPU's referee (without a GPU, one in this process), started again if a reference took it down."""
        if self._referee is not None and self.cuda and not self._referee.alive():
            self.drop_referee()
        if self._referee is None:
            self._refuse_if_closed()
            self.referee_starts += 1
            if self.cuda:
                workdir = Path(tempfile.mkdtemp(prefix="referee-", dir=self.session.directory))
                # The first referee warms up before it is ready (sandbox.referee.warm_up); one started again
                # mid-evaluation (a reference that device-asserts on a family's inputs) would pay it every time.
                first = "1" if self.referee_starts == 1 else ""
                env = {**clean_env(workdir, True), "KLOOP_REFEREE_WARM_UP": first}
                self._referee = Child("sandbox.referee", cuda=True, jailed=False, statuses=REFEREE_STATUSES,
                                      workdir=workdir, env=env, visible=self.visible, cpus=self.cpus())
                self._referee.wait_ready()
            else:
                from sandbox.referee import Referee

                self._referee = _InProcess(Referee())
        return self._referee

    def _refuse_if_closed(self) -> None:
        """No process is started for a closed session: an evaluation finishing on another thread after a stop (its
        release) would start one in the session's removed folder."""
        if self.session.closed:
            raise ChildDied("the evaluator session is closed")

    def drop_referee(self) -> None:
        """The referee's CUDA context is gone (a device-side assert in the reference): the next call starts another."""
        if self._referee is not None:
            self._referee.close()
            self._referee = None
            self.restarts += 1

    def start(self) -> None:
        """Start the trusted processes now (each takes seconds), not at the first candidate."""
        if self.cuda:
            self.executor()
            self.gpu()

    def gpu(self) -> dict | None:
        """This GPU's facts (gpu_info: name, index and UUID among them), None on the CPU."""
        if self.cuda and self._gpu is None:
            with self.lock:  # the referee's pipe is the device thread's while it evaluates
                if self._gpu is None:
                    self._gpu = self.referee().call(60, cmd="gpu")["gpu"]
        return self._gpu

    def use_target(self, target: Target) -> None:
        if target.sha256 != self._target_sha:
            if self._referee is not None:
                self.referee().call(600, cmd="forget")
            self._target_sha = target.sha256

    def quiet(self):
        """While a kernel is timed here: every jailed process running candidate code on this GPU, of any kloop
        session on this node (planners: the candidate's Python, Triton's autotuning), is stopped, so no other
        candidate's work shares the GPU (sandbox/pool.py keeps the registry)."""
        if not self.cuda:
            return contextlib.nullcontext()
        return pool.quiet(self.uuid())

    def uuid(self) -> str:
        """As the pool lists its processes: NVML's UUID of the CUDA_VISIBLE_DEVICES entry ("" without NVML)."""
        if self._uuid is None:
            self._uuid = profile.gpu_uuid(self.visible) or ""
        return self._uuid

    def cpus(self) -> frozenset[int] | None:
        """The CPUs this GPU's trusted processes run on (sandbox.cores), None where the session does not split."""
        if self.session.core_split is None:
            return None
        place = profile.gpu_place(self.uuid()) if self.uuid() else None
        return self.session.core_split.for_gpu(place[0]) if place else None

    def nvml_snapshot(self) -> dict | None:
        return profile.nvml_snapshot(uuid=(self.gpu() or {}).get("uuid"))

    def close(self) -> None:
        for child in (self._executor, self._referee):
            if child is not None:
                child.close()
        self._executor = self._referee = None


class Session:
    """The trusted machinery of one node, kept across candidates: a warm pool of jailed processes and one Device per
    GPU (or the CPU). Candidates are judged one by one with `evaluation` (staged, on the first device), or handed to
    `submit`, which plans them in parallel jailed planners and runs each on the first free device
    (sandbox/pipeline.py).

    gpus: CUDA_VISIBLE_DEVICES entries, one device each (None: this process's GPU, or the CPU); planners: candidates
    planned at once by `submit`."""

    def __init__(self, spares: int | None = None, settings: EvalSettings | None = None,
                 gpus: list[str] | None = None, planners: int = 1) -> None:
        pin_numeric_flags()
        self.cuda = DEVICE.type == "cuda"
        self.settings = settings or EvalSettings()
        self.planners = max(1, planners)
        if gpus is not None and not self.cuda:
            raise ValueError("gpus were given, but this process sees no CUDA GPU")
        self.core_split = self._core_split(gpus)
        self.pool = WarmPool(spares=spares if spares is not None else (2 if self.cuda else 1), cuda=self.cuda,
                             gpus=gpus, cpus=self.core_split.jailed if self.core_split else None)
        self.directory = Path(tempfile.mkdtemp(prefix="kloop-session-", dir=scratch_root()))
        self.devices = [Device(self, g) for g in gpus] if gpus else [Device(self)]
        self.best: BestKernel | None = None
        self._best_lock = threading.Lock()
        self._best_users: dict[Path, int] = {}
        self._count = 0
        self._count_lock = threading.Lock()
        self._pipeline = None
        self.closed = False

    def _core_split(self, gpus: list[str] | None) -> cores.CoreSplit | None:
        """The node's CPU split (sandbox.cores) on a GPU node, None on the CPU or where it is off or unknown."""
        if not self.cuda or not cores.enabled():
            return None
        uuid = profile.gpu_uuid(gpus[0] if gpus else None)
        place = profile.gpu_place(uuid) if uuid else None
        return cores.split(place[1]) if place else None

    @property
    def isolation(self) -> str:
        """The isolation mode with its one-line note, as stored with every result and run."""
        mode = self.pool.isolation
        return f"{mode.mode}: {mode.note}" if mode.note else mode.mode

    @property
    def weakly_isolated(self) -> bool:
        return self.pool.isolation.mode != "bwrap"

    def planning_memory(self) -> int | None:
        """GPU memory the planners may hold at once (sandbox.pipeline.MemoryGate); None without a GPU."""
        if not self.cuda:
            return None
        import torch

        from sandbox.pipeline import PLANNER_MEMORY_SHARE

        return int(torch.cuda.get_device_properties(0).total_memory * PLANNER_MEMORY_SHARE) * len(self.devices)

    # The first device's, for callers that judge one candidate at a time.
    def executor(self) -> Child:
        return self.devices[0].executor()

    def referee(self):
        return self.devices[0].referee()

    def gpu(self) -> dict | None:
        return self.devices[0].gpu()

    @property
    def restarts(self) -> int:
        return sum(d.restarts for d in self.devices)

    def _next_index(self) -> int:
        with self._count_lock:
            self._count += 1
            return self._count

    def evaluation(self, target: Target, source: str, settings: EvalSettings | None = None) -> "Evaluation":
        """One candidate, staged by the caller (assemble, verify, profile), on the first device."""
        return Evaluation(self, target, source, settings or self.settings, self._next_index(), self.devices[0])

    def submit(self, target: Target, source: str, settings: EvalSettings | None = None):
        """One candidate, evaluated in the background: planned by the next free planner, then loaded, verified and
        profiled by the next free device. Returns a sandbox.pipeline.Submitted (the same staged calls, which wait)."""
        if self._pipeline is None:
            from sandbox.pipeline import Pipeline

            self._pipeline = Pipeline(self)
        return self._pipeline.submit(Evaluation(self, target, source, settings or self.settings,
                                                self._next_index(), None))

    def start(self, timeout_s: float = 600) -> None:
        """Start every device's trusted processes and the planners' spares now, and wait until they are ready (they
        start in parallel, seconds each), so the first candidates do not wait for them."""
        with self.pool._lock:
            self.pool.refill()
            spares = list(self.pool._idle)
        threads = [threading.Thread(target=d.start, daemon=True) for d in self.devices]
        for t in threads:
            t.start()
        for child in spares:
            with contextlib.suppress(ChildDied, ChildTimeout):
                child.wait_ready(timeout_s)
        for t in threads:
            t.join()

    def adopt_best(self, evaluation: "Evaluation", attempt: int | None, median_us: float | None = None) -> None:
        """Keep a verified, timed candidate's plans as the one later candidates must beat."""
        median_us = median_us or evaluation.result.median_us
        if median_us is None or evaluation.plans_dir is None:
            return
        directory = self.directory / f"best-{evaluation.index}"
        shutil.copytree(evaluation.plans_dir / "0", directory / "0", dirs_exist_ok=True)
        with self._best_lock:
            old, self.best = self.best, BestKernel(attempt, directory, median_us, evaluation.target.sha256)
            if old is not None and not self._best_users.get(old.directory):
                shutil.rmtree(old.directory, ignore_errors=True)

    def forget_best(self) -> None:
        """No standing best (the next run's candidates are not timed against this one's)."""
        with self._best_lock:
            old, self.best = self.best, None
            if old is not None and not self._best_users.get(old.directory):
                shutil.rmtree(old.directory, ignore_errors=True)

    @contextlib.contextmanager
    def hold_best(self):
        """The standing best (or None), whose plans stay on disk for the block even if a new best is adopted."""
        with self._best_lock:
            best = self.best
            if best is not None:
                self._best_users[best.directory] = self._best_users.get(best.directory, 0) + 1
        try:
            yield best
        finally:
            if best is not None:
                with self._best_lock:
                    self._best_users[best.directory] -= 1
                    if not self._best_users[best.directory]:
                        del self._best_users[best.directory]
                        if self.best is None or self.best.directory != best.directory:
                            shutil.rmtree(best.directory, ignore_errors=True)

    def restore_best(self, target: Target, source: str, attempt: int, median_us: float) -> None:
        """A resumed run's best, planned again so later candidates can be timed against it side by side."""
        with self.evaluation(target, source) as ev:
            ev.plan()
            if ev.result.verdict is None:
                self.adopt_best(ev, attempt, median_us)

    def close(self) -> None:
        self.closed = True
        if self._pipeline is not None:
            self._pipeline.close()
        self.pool.close()
        for device in self.devices:
            device.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Evaluation:
    """One candidate against one target, in two phases. The plan phase (any thread; it needs no device): the rules,
    then a jailed planner records a launch plan per shape. The device phase, on `device`: the trusted executor loads
    the plans, verifies them against the referee, and profiles them. `assemble` is plan + load."""

    def __init__(self, session: Session, target: Target, source: str, settings: EvalSettings, index: int,
                 device: Device | None) -> None:
        self.session, self.target, self.source, self.settings, self.index = session, target, source, settings, index
        self.device = device
        self.salt = secrets.randbits(62)   # the inputs: this candidate's own (see _seed)
        self.shapes = target.shapes(settings.small)
        self.shape_keys = [_shape_key(target, s) for s in self.shapes]
        # A weights trial (tools/weights.py): the main shape once more, its module's parameters drawn at random for
        # the reference and the candidate alike; its key is known once the planner says what it could follow.
        self.weights_index: int | None = None
        if 0 < target.state_bytes(small=settings.small) <= WEIGHTS_TRIAL_MAX_BYTES:
            self.weights_index = len(self.shapes)
            self.shapes.append(dict(self.shapes[0]))
            self.shape_keys.append(self.shape_keys[0] + ":weights")
        self.matched: list[str] = []
        self._referee_shapes: set[int] = set()   # shapes the device's referee was told, and which referee start
        self._referee_start: int | None = None
        self.init_seed = derive_seed(settings.seed, "init")   # the weights: the same for every candidate of a run
        self.planner: Child | None = None
        self.executor = None
        self.plans_dir: Path | None = None
        self.keys: list[str] = []
        self.output_meta: list[list[dict]] = []
        self.io_bytes: int | None = None     # the main shape's inputs and outputs (how much a release frees)
        self._locked = False
        self._sass: tuple[threading.Thread, dict[str, str]] | None = None   # disassembling while the device works
        self.abandoned = False   # set by a closing pipeline: planning stops at the next step
        self._started = time.perf_counter()
        self.result = EvalResult(language=rules.detect_language(source), numeric_flags=pin_numeric_flags(),
                                 gpu=session.gpu(), versions=versions(), isolation=session.isolation,
                                 checks=CHECKS_VERSION)

    # -- plan: rules, then the jailed planner ----------------------------------------------------------------------
    def assemble(self) -> EvalResult:
        """Plan, then load on the device: one call for callers that judge one candidate at a time."""
        with self._stage("assemble"):
            self.plan()
            self.load()
        return self.result

    def plan(self) -> EvalResult:
        with self._stage("plan"):
            self._plan()
        return self.result

    def _jail_limits(self) -> jail.Limits | None:
        """Room for the target's weights where they are large (None: the warm spares' defaults suffice)."""
        state = self.target.state_bytes(small=not self.session.cuda)
        return jail.Limits.holding(state) if state > LARGE_STATE_BYTES else None

    def _plan(self) -> None:
        began = time.perf_counter()
        try:
            broken = rules.check_source(self.source)
        except SyntaxError as e:
            return self._finish("compile_error", f"syntax error at line {e.lineno}: {e.msg}")
        if broken:
            return self._finish("rejected", *broken)
        self._waited("rules", began)
        began = time.perf_counter()
        self.planner = self.session.pool.acquire("planner", limits=self._jail_limits())
        self._waited("planner:acquire", began)
        if self.abandoned:
            return self._close_planner()
        candidate = self.planner.workdir / "candidate.py"
        candidate.write_text(self.source)
        reply = self._call(self.planner, self.settings.load_timeout_s, "load", target_source=self.target.source,
                           candidate=str(candidate), init_seed=self.init_seed)
        if not self._ok(reply, hidden=None):
            return self._close_planner()
        self.plans_dir = Path(tempfile.mkdtemp(prefix=f"eval-{self.index}-", dir=self.session.directory))
        for i, shape in enumerate(self.shapes):
            if self.abandoned:
                return self._close_planner()
            if i == 1:  # what the candidate prints from here on may carry hidden shapes: keep only what came before
                self._output_cut = self.planner.output_sizes()
            perturb = {"perturb": self._seed("weights")} if i == self.weights_index else {}
            reply = self._call(self.planner, self.settings.load_timeout_s, "build", shape=i, overrides=shape,
                               seed=self._seed("plan", i), python_s=self._run_timeout(), **perturb)
            if perturb and reply.get("status") == "ok":
                self.matched = list(reply.get("matched") or [])
                self.shape_keys[i] = f"{self.shape_keys[0]}:weights:" + hashlib.sha256(
                    json.dumps([perturb["perturb"], self.matched]).encode()).hexdigest()[:16]
            if self._ok(reply, hidden=self._variant(i)):  # compiled: a hang costs the hang limit from here, not compile's
                reply = self._call(self.planner, self._run_timeout(), "record", out=str(self.planner.workdir /
                                   f"plan-{i}"), records=RECORDED_CALLS if i == 0 else 3)
            if not self._ok(reply, hidden=self._variant(i)):
                return self._close_planner()
            began = time.perf_counter()
            try:
                copy_plan(self.planner.workdir / f"plan-{i}", self.plans_dir / str(i))
                self._check_state(i)
            except PlanError as e:
                self._close_planner()
                return self._finish("rejected", *self._hidden(self._variant(i), "rejected",
                                                              f"the launch plan: {e}"))
            if i == 0:
                self._start_sass()
            self._waited("plan:copy", began)
        began = time.perf_counter()
        self._close_planner()
        self._waited("planner:close", began)

    def _check_state(self, i: int) -> None:
        """Refuse (PlanError) a plan whose module state outgrows the reference's (STATE_SLACK_BYTES)."""
        held = sum(entry["nbytes"] for entry in load_plan(self.plans_dir / str(i) / "plan.json").state)
        reference = self.target.state_bytes(small=not self.session.cuda)
        if held > 2 * reference + STATE_SLACK_BYTES:
            raise PlanError(f"its module state (parameters, buffers, workspaces made before forward) holds {held} "
                            f"bytes, over twice the reference's {reference} plus {STATE_SLACK_BYTES >> 20} MiB: "
                            "allocate workspaces in forward instead")

    def _start_sass(self) -> None:
        """The SASS of the main plan's Triton kernels, disassembled (cuobjdump: trusted, CPU only) on a thread of its
        own while the hidden shapes build and the device phase goes on: it took a fifth of a candidate's overhead.
        `collect_sass` (or `close`) joins it."""
        from tools.assemble import sass_of

        if not self.session.cuda:
            return
        try:
            plan = load_plan(self.plans_dir / "0" / "plan.json")
        except PlanError:
            return  # the device phase reports it
        cubins = {k.name: (plan.directory / k.blob).read_bytes() for k in plan.kernels if k.kind == "triton" and k.blob}
        listings: dict[str, str] = {}

        def disassemble() -> None:
            for name, cubin in cubins.items():
                with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):  # the listing is extra
                    listings[name] = sass_of(cubin)

        self._sass = (threading.Thread(target=disassemble, name=f"sass-{self.index}", daemon=True), listings)
        self._sass[0].start()

    def collect_sass(self) -> None:
        """The SASS listings into the result (the disassembly thread joined); the result is complete after it."""
        if self._sass is None:
            return
        began = time.perf_counter()
        thread, listings = self._sass
        thread.join()
        self.result.sass.update({name: sass for name, sass in listings.items() if sass})
        self._sass = None
        self._ptx_sass()
        self._waited("sass", began)

    def _ptx_sass(self) -> None:
        """The SASS of the PTX kernels the executor ran: assembled again here (ptxas, trusted) for this GPU's
        architecture, known once the device phase has run."""
        from tools.assemble import PtxAssembleError, assemble_ptx, sass_of

        cc = (self.result.gpu or {}).get("cc")
        ptx_kernels = {r.kernel for r in self.result.resources if r.source == "ptxas" and r.kernel in self.result.ptx}
        for name in ptx_kernels if cc else ():
            with contextlib.suppress(PtxAssembleError, ValueError, RuntimeError, OSError, subprocess.SubprocessError):
                listing = sass_of(assemble_ptx(self.result.ptx[name], "sm_" + cc.replace(".", "")).cubin)
                if listing:
                    self.result.sass[name] = listing

    # -- load: the device's executor and referee take the plans -------------------------------------------------------
    def load(self) -> EvalResult:
        if self.result.verdict is not None or self.plans_dir is None:
            return self.result
        with self._stage("load"):
            self._load()
        return self.result

    def bind(self, device: Device) -> None:
        """This evaluation's device phase runs on `device` (held until release_device)."""
        device.lock.acquire()
        self.device, self._locked = device, True

    def _load(self) -> None:
        if not self._locked:
            self.bind(self.device)
        device = self.device
        device.use_target(self.target)
        if self.session.cuda:
            self.executor = device.executor()
            self.result.gpu = device.gpu()
        else:
            began = time.perf_counter()
            self.executor = self.session.pool.acquire("executor", limits=self._jail_limits())
            self._waited("executor:acquire", began)
        self.keys = [f"e{self.index}:{i}" for i in range(len(self.shapes))]
        for i, (shape, key) in enumerate(zip(self.shapes, self.shape_keys)):
            self._referee_shape(i)
            reply = self._call(self.executor, 120, "shape", shape=key, target_source=self.target.source,
                               overrides=shape)
            if not self._ok(reply, hidden=self._variant(i)):
                return
            plan_dir = self.plans_dir / str(i)
            if not self.session.cuda:  # the jailed executor reads only its own directory
                shutil.copytree(plan_dir, self.executor.workdir / f"plan-{i}")
                plan_dir = self.executor.workdir / f"plan-{i}"
            reply = self._call(self.executor, self.settings.load_timeout_s, "load", key=self.keys[i],
                               plan_dir=str(plan_dir), shape=key)
            if reply.get("status") == "not_run":
                return self._ptx_not_run()
            if not self._ok(reply, hidden=self._variant(i)):
                return
            plan = load_plan(self.plans_dir / str(i) / "plan.json")
            if i == 0:
                self._take_resources(reply.get("resources") or [])
                self.io_bytes = sum(x.nbytes for x in plan.inputs if x.dtype is not None) + \
                    sum(ITEMSIZE[o.dtype] * math.prod(o.shape) for o in plan.outputs)
            self.output_meta.append([{"dtype": o.dtype, "shape": o.shape} for o in plan.outputs])
        self.result.executed_on = "cuda" if self.session.cuda else "cpu-interpreter"

    def _ptx_not_run(self) -> None:
        """No GPU: assemble the plan's PTX here (ptxas, trusted) and report its resources; nothing ran."""
        from tools.assemble import PtxAssembleError, assemble_ptx, sass_of

        plan = load_plan(self.plans_dir / "0" / "plan.json")
        for k in plan.kernels:
            if k.kind != "ptx":
                continue
            try:
                assembly = assemble_ptx(k.ptx, "sm_90")
            except (PtxAssembleError, ValueError) as e:  # ValueError: text ptxas cannot take (hostile plan data)
                return self._finish("compile_error", str(e))
            usage = assembly.kernels.get(k.name)
            if usage:
                self.result.resources.append(Resources(kernel=k.name, source="ptxas", registers=usage["registers"],
                                                       spills=usage["spill_stores_bytes"] // 4,
                                                       shared_bytes=usage["shared_bytes"]))
            self.result.ptx[k.name] = k.ptx
            sass = sass_of(assembly.cubin)
            if sass:
                self.result.sass[k.name] = sass
            self.result.compile_log = assembly.log
        self.result.timing_note = PTX_NOT_RUN
        self._finish("runtime_error", "not run: no CUDA GPU here (PTX is assembled, not run, without a GPU)")

    def _take_resources(self, rows: list[dict]) -> None:
        for row in rows:
            ptx = row.pop("ptx", None)
            if ptx:
                self.result.ptx[row["kernel"]] = ptx
            self.result.resources.append(Resources(**{k: v for k, v in row.items()
                                                      if k in Resources.__dataclass_fields__}))

    # -- verify: replay on fresh inputs, compare in the referee ------------------------------------------------------
    def verify(self) -> EvalResult:
        if self.result.verdict is not None:
            return self.result
        with self._stage("verify"):
            self._verify()
        return self.result

    def _verify(self) -> None:
        """Trials on fresh inputs: at the main shape `trials` in the target's own distribution (alternating
        poisons), then one per input family (tools/inputs.py) in an order drawn from the seed; `variant_trials` per
        hidden variant. A family whose reference fails or is nowhere finite is skipped. The reference's outputs must
        differ between the main shape's trials, else the target is degenerate: a kernel writing them without reading
        its inputs would pass (flagged, no speedup)."""
        stats = Correctness(shapes=len(self.shapes))
        trial_us: list[float] = []   # the main shape's first trials, for pruning
        fingerprints = []
        for i in range(len(self.shapes)):
            own = self.settings.trials if i == 0 else self.settings.variant_trials
            families = [OWN] * own + (self._families() if i == 0 else [])
            for trial, family in enumerate(families):
                seed = self._seed("trial", i, trial)
                reasons = self._replay_and_check(i, seed, stats if i == 0 else None, timed=False, family=family,
                                                 poison=TRIAL_POISONS[trial % len(TRIAL_POISONS)])
                if reasons is None:
                    return
                if self._last_check.get("skipped"):
                    stats.skipped.append(f"{family}: {self._last_check['skipped'][:200]}")
                    continue
                stats.trials += 1
                if reasons:
                    if i == 0:
                        self.result.correctness = stats
                    where = f"trial {trial + 1}" + ("" if family == OWN else f" ({family} inputs)")
                    return self._finish("incorrect", *self._hidden(
                        self._variant(i), "incorrect", *[f"{self._shape_name(i)}, {where}: {r}" for r in reasons]))
                if i == 0:
                    if family != OWN:
                        stats.families.append(family)
                    fingerprints.append(self._last_check.get("fingerprint"))
                    if trial < PRUNE_TRIALS:
                        trial_us.append((self._last_run.get("ms") or 0.0) * 1e3)
                        if len(trial_us) == PRUNE_TRIALS and self._pruned(min(trial_us), stats):
                            return
        self.result.correctness = stats
        self.result.verdict = "correct"
        if len(fingerprints) > 1 and all(f == fingerprints[0] for f in fingerprints):
            self.result.degenerate = ("the reference's output is the same on every input family tried: a kernel "
                                      "writing it without reading its inputs would pass")
            self.result.flags.append("degenerate_target")

    def _families(self) -> list[str]:
        """The input families the main shape is tried on, in an order drawn from this candidate's seed."""
        families = list(FAMILIES)
        random.Random(self._seed("families")).shuffle(families)
        return families

    def _seed(self, *parts) -> int:
        """A seed for this candidate's inputs: from the run's secret and a salt of this evaluation's own, so no two
        candidates of a session see the same inputs (a kernel cannot remember outputs across evaluations)."""
        return derive_seed(self.settings.seed, self.salt, *parts)

    def _pruned(self, trial_us: float, stats: Correctness) -> bool:
        """Stop here (verdict timeout) when the candidate's faster of its first main-shape trials took more than
        prune_slower_than times the standing best's median: it cannot become the best, and its hidden variants and
        timing would cost the search most of an evaluation. The trials' times are taken by the trusted executor, with
        a warm L2 (faster, if anything, than the best's timed calls)."""
        factor = self.settings.prune_slower_than
        if not (self.session.cuda and factor and trial_us):
            return False
        with self.session.hold_best() as best:
            if best is None or best.target_sha256 != self.target.sha256 or trial_us <= factor * best.median_us:
                return False
            self.result.correctness = stats
            self._finish("timeout", f"pruned: its first {PRUNE_TRIALS} main-shape calls took {trial_us:.4g} us or "
                         f"more, over {factor:g}x the standing best's {best.median_us:.4g} us; not verified further")
        return True

    def _replay_and_check(self, i: int, seed: int, stats: Correctness | None, timed: bool,
                          key: str | None = None, family: str = OWN,
                          poison: int = TRIAL_POISONS[0]) -> list[str] | None:
        """Fresh inputs in `family` (tools/inputs.py, the same on both sides), one replay, one comparison. None when
        the replay itself failed (the verdict is set). poison: the byte the plan's allocations are filled with
        first."""
        key = key or self.keys[i]
        timeout = self._round_timeout(i, seed, family)
        if timeout is None:
            return None
        directory = self._output_dir()
        reply = self._call(self.executor, timeout, "round", key=key, seed=seed, family=family, timed=timed,
                           dir=str(directory) if directory else None, poison=poison)
        if not self._ok(reply, hidden=self._variant(i), stage="profile" if timed else "") or self._overran(reply, i):
            return None
        self._last_run = reply
        return self._check(i, seed, key, stats, family, shared=reply)

    def _output_dir(self) -> Path | None:
        """Without a GPU, where the jailed executor writes its outputs (emptied first); None on a GPU (CUDA IPC)."""
        if self.session.cuda:
            return None
        directory = self.executor.workdir / "out"
        shutil.rmtree(directory, ignore_errors=True)
        return directory

    def _check(self, i: int, seed: int, key: str, stats: Correctness | None, family: str = OWN,
               shared: dict | None = None) -> list[str] | None:
        """Compare what the executor holds for `key` (described in `shared`, else asked for) with the reference.
        stats: where the main shape's error statistics go (None for a hidden variant: nothing numeric about one may
        reach a policy)."""
        directory = None if self.session.cuda else self.executor.workdir / "out"
        if shared is None:
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
            shared = self._call(self.executor, 600, "share", key=key, dir=str(directory) if directory else None)
            if not self._ok(shared, hidden=self._variant(i)):
                return None
        if directory is not None and (directory.is_symlink() or not directory.is_dir()):
            self._finish("runtime_error", "the executor's output directory is not a directory")
            return None
        outputs = shared.get("outputs") or []
        if directory is not None:  # files: their sizes come from the plan the executor ran, checked on read
            metas = self.output_meta[i]
            if len(outputs) != len(metas):
                return [f"the executor returned {len(outputs)} outputs, the plan has {len(metas)}"]
            outputs = [dict(m, file=name) for m, name in zip(metas, outputs)]
        inputs = [None if name is None else ({"file": name} if directory is not None else name)
                  for name in shared.get("inputs") or []]
        reply = self._ref(600, "check", shape=self.shape_keys[i], seed=seed, outputs=outputs, inputs=inputs,
                          directory=str(directory) if directory else None, family=family)
        self._last_check = reply
        if reply.get("status") != "ok" and family != OWN and reply.get("fatal"):
            # the reference took its process down on inputs outside its domain: no answer there, as when it raises
            self._last_check = {"skipped": f"the reference ended its process on {family} inputs: "
                                           f"{reply.get('message')}"}
            return []
        if reply.get("status") != "ok":
            self._finish("runtime_error", f"the reference failed: {reply.get('message')}")
            return None
        found = reply.get("stats") or {}
        if stats is not None:
            stats.norm_err = max(stats.norm_err, found.get("norm_err") or 0.0)
        if stats is not None and family == OWN:   # other families' element errors follow their own scales
            stats.max_abs_err = max(stats.max_abs_err, found.get("max_abs_err") or 0.0)
            stats.max_rel_err = max(stats.max_rel_err, found.get("max_rel_err") or 0.0)
            if found.get("worst"):
                stats.worst = found["worst"]
        return list(reply.get("reasons") or [])

    # -- profile: interleaved timing, every timed output checked ------------------------------------------------------
    def profile(self) -> EvalResult:
        if self.result.verdict != "correct":
            return self.result
        with self._stage("profile"):
            self._profile()
        return self.result

    def _profile(self) -> None:
        counts = self._ref(600, "roofline_counts", shape=self.shape_keys[0],
                           seed=self._seed("roofline"))
        if counts.get("status") != "ok":
            return self._finish("runtime_error", f"the reference failed: {counts.get('message')}")
        if not self.session.cuda:
            self.result.timing_note = NO_GPU_NOTE
            self.result.roofline = Roofline(bytes=counts["bytes"], flops=counts["flops"])
            return
        timings = self._time(self._seed("time"))
        if timings is None:
            return
        gpu = self.result.gpu
        roof = Roofline(**profile.roofline(counts["bytes"], counts["flops"], gpu, timings["candidate"].median,
                                           _dtype_key(counts["dtype"])))
        speedup = _speedups(timings)
        suspicious = (speedup and max(speedup.values()) > self.settings.max_speedup) or \
            (roof.sol_us and timings["candidate"].median < roof.sol_us)
        if suspicious:  # measure again before believing it, and say so either way
            again = self._time(self._seed("time", "again"))
            if again is None:
                return
            timings, speedup = again, _speedups(again)
            roof = Roofline(**profile.roofline(counts["bytes"], counts["flops"], gpu, timings["candidate"].median,
                                               _dtype_key(counts["dtype"])))
            if speedup and max(speedup.values()) > self.settings.max_speedup:
                self.result.flags.append(f"speedup_over_{self.settings.max_speedup:g}x_remeasured")
            if roof.sol_us and timings["candidate"].median < roof.sol_us:
                self.result.flags.append("below_speed_of_light_remeasured")
        self.result.time_us = timings.pop("candidate")
        self.result.baselines = timings or None
        self.result.speedup = None if self.result.degenerate else speedup   # nothing to be faster at
        self.result.roofline = roof
        with self.session.hold_best() as best:
            if best is not None and best.target_sha256 == self.target.sha256 and \
                    self.result.time_us.median < best.median_us:
                self._versus_best(best)
        if self.settings.ncu:
            self.result.ncu = self._ncu()

    def _time(self, seed: int) -> dict[str, Timing] | None:
        """Interleaved rounds: fresh inputs each round, the candidate (executor) and each baseline (referee) in a
        rotating order, every candidate output checked against the round's reference. None if it misbehaved."""
        with self.device.quiet():
            return self._rounds(seed)

    def _rounds(self, seed: int) -> dict[str, Timing] | None:
        names = ["candidate"] + list(self.settings.baselines)
        ratio_key = (self.shape_keys[0], self.settings.compile_mode)
        derive = self.settings.compile_baseline == "reuse" and "compile" in names and "eager" in names and \
            ratio_key in self.device.compile_to_eager
        if derive:
            names.remove("compile")
        samples: dict[str, list[float]] = {name: [] for name in names}
        wall: dict[str, float] = dict.fromkeys(names, 0.0)
        before = self.device.nvml_snapshot()
        rounds = self.settings.warmup_calls + self.settings.timed_calls
        for r in range(rounds):
            round_seed = derive_seed(seed, r)
            family = self._round_family(round_seed)
            shift = r % len(names)
            shared = None
            for name in names[shift:] + names[:shift]:
                if name == "candidate":
                    reasons_or_none = self._replay(round_seed, family)
                    if reasons_or_none is None:
                        return None
                    reply = shared = reasons_or_none
                else:
                    reply = self._ref(self.settings.baseline_timeout_s, "time", name=name,
                                      shape=self.shape_keys[0], seed=round_seed, mode=self.settings.compile_mode,
                                      family=family)
                    if reply.get("status") != "ok":
                        self.result.flags.append(f"baseline_{name}_failed: {str(reply.get('message'))[:200]}")
                        names.remove(name)
                        samples.pop(name)
                        continue
                if r >= self.settings.warmup_calls:
                    samples[name].append(reply["ms"])
                    wall[name] += reply["wall_ms"]
            reasons = self._check(0, round_seed, self.keys[0], None, family, shared=shared)
            if reasons is None:
                return None
            if reasons:  # a kernel must be right every time it is timed, not only when it was verified
                self._finish("incorrect", *[f"timed call {r + 1}: {reason}" for reason in reasons])
                return None
        after = self.device.nvml_snapshot()
        timings = {name: Timing(**profile.summarize(s), events_total_ms=sum(s), wall_total_ms=wall[name])
                   for name, s in samples.items() if s}
        if derive:
            ratio = self.device.compile_to_eager[ratio_key]
            timings["compile"] = Timing(median=timings["eager"].median * ratio, derived_from_eager=True,
                                        compile_to_eager=ratio)
        elif "compile" in timings and "eager" in timings:
            self.device.compile_to_eager[ratio_key] = timings["compile"].median / timings["eager"].median
        if "compile" in timings:
            timings["compile"].mode = self.settings.compile_mode
        throttled = profile.throttle_reasons(before, after) if before and after else []
        self.result.nvml = {"before": before, "after": after, "throttled": bool(throttled), "reasons": throttled}
        if throttled and "throttled" not in self.result.flags:
            self.result.flags.append("throttled")
        cand = timings["candidate"]
        if cand.events_total_ms > cand.wall_total_ms * 1.05:
            self.result.flags.append("events_exceed_wall_clock")
        return timings

    def _round_family(self, seed: int) -> str:
        """A timed round's input family: drawn from the target's own and those the main shape was judged on, so a
        kernel cannot tell a timed call from a checked one by its inputs (every timed output is checked too)."""
        judged = self.result.correctness.families if self.result.correctness else []
        return random.Random(seed).choice([OWN, *judged])

    def _replay(self, seed: int, family: str = OWN) -> dict | None:
        """One timed call of the candidate on fresh inputs (its outputs described for the check); None if it
        failed (the verdict is set)."""
        timeout = self._round_timeout(0, seed, family)
        if timeout is None:
            return None
        reply = self._call(self.executor, timeout, "round", key=self.keys[0], seed=seed, family=family, timed=True)
        if not self._ok(reply, hidden=None, stage="profile") or self._overran(reply, 0):
            return None
        return reply

    def _overran(self, reply: dict, i: int) -> bool:
        """The replay wrote into a guard region around one of its buffers (sandbox/executor.py): incorrect."""
        if not reply.get("overrun"):
            return False
        self._finish("incorrect", *self._hidden(self._variant(i), "incorrect", f"{self._shape_name(i)}: "
                                                                                 f"{reply['overrun']}"))
        return True

    def _versus_best(self, best: BestKernel, key: str | None = None) -> None:
        """A would-be new best is timed again against the standing best, interleaved round by round, and counts
        as faster only when the 95% confidence interval of the time ratio lies above 1."""
        mine = key or self.keys[0]
        other = f"best{self.index}"
        reply = self._call(self.executor, self.settings.load_timeout_s, "load", key=other,
                           plan_dir=str(best.directory / "0"), shape=self.shape_keys[0])
        if reply.get("status") != "ok":
            self.result.flags.append(f"versus_best_failed: {str(reply.get('message'))[:200]}")
            return
        ratios = []
        began = time.perf_counter()
        try:
            with self.device.quiet():
                for r in range(self.settings.paired_calls):
                    seed = self._seed("paired", r)
                    family = self._round_family(seed)
                    reply = self._call(self.executor, 600, "inputs", shape=self.shape_keys[0], seed=seed,
                                       family=family)
                    if not self._ok(reply, hidden=None, stage="profile"):
                        return
                    times = {}
                    for which in ((mine, other) if r % 2 == 0 else (other, mine)):
                        reply = self._call(self.executor, self._run_timeout(), "run", key=which, timed=True)
                        if not self._ok(reply, hidden=None, stage="profile") or \
                                (which == mine and self._overran(reply, 0)):
                            return
                        times[which] = reply["ms"]
                    reasons = self._check(0, seed, mine, None, family)
                    if reasons is None:
                        return
                    if reasons:
                        return self._finish("incorrect", *[f"paired timing {r + 1}: {x}" for x in reasons])
                    ratios.append(times[other] / times[mine])
        finally:
            if self.executor.alive():
                self._call(self.executor, 60, "unload", key=other)
            self._waited("paired", began)
        self.result.vs_best = paired_ratio(ratios, best.attempt)

    def versus_standing_best(self, device: Device) -> None:
        """The paired re-measurement again, against the session's best as it stands now (it changed since this
        candidate was profiled), on `device`: the challenger's main plan is loaded there once more."""
        with self.session.hold_best() as best:
            if best is None or best.target_sha256 != self.target.sha256 or self.plans_dir is None or \
                    not self.result.correct or not self.session.cuda:
                return
            self.bind(device)
            try:
                device.use_target(self.target)
                self.executor = device.executor()
                key = f"e{self.index}:again"
                self._referee_shape(0)
                reply = self._call(self.executor, 120, "shape", shape=self.shape_keys[0],
                                   target_source=self.target.source, overrides=self.shapes[0])
                if self._ok(reply, hidden=None):
                    reply = self._call(self.executor, self.settings.load_timeout_s, "load", key=key,
                                       plan_dir=str(self.plans_dir / "0"), shape=self.shape_keys[0])
                    if self._ok(reply, hidden=None, stage="profile"):
                        self.keys = [key]
                        self._versus_best(best, key)
            finally:
                self.release_device()

    def _ncu(self) -> dict[str, Counters] | None:
        spec = {"plan_dir": str(self.plans_dir / "0"), "target_source": self.target.source,
                "overrides": self.shapes[0], "seed": self._seed("ncu"), "calls": 3}
        spec_path = self.plans_dir / "ncu-spec.json"
        spec_path.write_text(json.dumps(spec))
        names = [r.kernel for r in self.result.resources]
        env = None if self.device.visible is None else {**os.environ, "CUDA_VISIBLE_DEVICES": self.device.visible}
        try:
            with self.device.quiet():
                found = profile.run_ncu([sys.executable, "-m", "sandbox.executor", "--profile", str(spec_path)],
                                        env=env, kernel_regex="|".join(names) or None, timeout_s=300)
        except Exception as e:  # counters are optional: their absence is reported, never fatal
            self.result.flags.append(f"ncu_failed: {str(e)[:200]}")
            return None
        return {name: Counters(**{k: v for k, v in c.items() if k in Counters.__dataclass_fields__})
                for name, c in found.items()}

    def adopt_as_best(self, attempt: int | None) -> None:
        """This candidate is the run's best now: later ones are timed against it, side by side."""
        self.session.adopt_best(self, attempt)

    # -- plumbing ------------------------------------------------------------------------------------------------
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

    def _finish(self, verdict: str, *reasons: str) -> None:
        if self.result.verdict is None or self.result.verdict == "correct":
            self.result.verdict = verdict
            self.result.reasons += list(reasons)
        if not self.session.cuda and self.result.timing_note is None:
            self.result.timing_note = NO_GPU_NOTE

    def _close_planner(self) -> None:
        if self.planner is None:
            return
        cut = getattr(self, "_output_cut", None)
        self.result.stdout = read_limited(self.planner.stdout_path, stop=cut[0] if cut else None)
        self.result.stderr = read_limited(self.planner.stderr_path, stop=cut[1] if cut else None)
        self.planner.close()
        self.planner = None

    def _stage(self, name: str):
        @contextlib.contextmanager
        def timed():
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.result.durations_s[name] = round(time.perf_counter() - t0, 3)
        return timed()

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

    def close(self) -> EvalResult:
        self._close_planner()
        self.release_device()
        self.collect_sass()
        if self.plans_dir is not None:  # a new best was copied out of it
            shutil.rmtree(self.plans_dir, ignore_errors=True)
            self.plans_dir = None
        if self.session.restarts:
            self.result.durations_s["executor_restarts"] = self.session.restarts
        self.result.durations_s["total"] = round(time.perf_counter() - self._started, 3)
        self.account()
        return self.result

    def account(self) -> None:
        """durations_s["busy"]: the time the stages took, queues not counted (the pipeline logs it before close)."""
        self.result.durations_s["busy"] = round(sum(self.result.durations_s.get(k, 0.0)
                                                    for k in ("plan", "load", "verify", "profile")), 3)

    def __enter__(self) -> "Evaluation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def paired_ratio(ratios: list[float], best_attempt: int | None) -> VsBest:
    """best time / candidate time per round; a 95% t-interval of the mean log-ratio, back on the ratio scale."""
    logs = [math.log(r) for r in ratios if r > 0]
    n = len(logs)
    mean = statistics.fmean(logs) if logs else 0.0
    half = _t975(n - 1) * statistics.stdev(logs) / math.sqrt(n) if n > 1 else math.inf
    low, high = math.exp(mean - half), math.exp(mean + half)
    outcome = "faster" if low > 1.0 else "slower" if high < 1.0 else "tie"
    return VsBest(best_attempt=best_attempt, ratio=math.exp(mean), ci_low=low, ci_high=high, n=n, outcome=outcome)


def _t975(df: int) -> float:
    """Student's t 97.5% quantile (two-sided 95%)."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
             12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
    if df <= 0:
        return math.inf
    for k in sorted(table):
        if df <= k:
            return table[k]
    return 1.960


def _speedups(timings: dict[str, Timing]) -> dict[str, float] | None:
    cand = timings["candidate"].median
    out = {name: timings[name].median / cand for name in ("eager", "compile") if name in timings and cand}
    return out or None


def _dtype_key(name: str) -> str | None:
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(name)


def _shape_key(target: Target, shape: dict) -> str:
    return hashlib.sha256((target.source + json.dumps(shape, sort_keys=True, default=str)).encode()).hexdigest()[:16]


def evaluate(target: Target, source: str, settings: EvalSettings | None = None,
             session: Session | None = None) -> EvalResult:
    """All three stages in a session of their own (or the given one); the verdict stops the ones after a failure."""
    own = session is None
    session = session or Session(spares=0, settings=settings)
    try:
        with session.evaluation(target, source, settings) as ev:
            ev.assemble()
            ev.verify()
            ev.profile()
        return ev.result
    finally:
        if own:
            session.close()
