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
import platform
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox import cores, pool
from sandbox.pool import WarmPool
from sandbox.process import Child, ChildDied, ChildTimeout, clean_env, scratch_root
# NO_GPU_NOTE and PTX_NOT_RUN are read from here by callers (agent/cmd_bench.py, the tests)
from sandbox.stages.base import NO_GPU_NOTE, derive_seed
from sandbox.stages.loading import PTX_NOT_RUN, Loading
from sandbox.stages.planning import Planning
from sandbox.stages.profiling import Profiling
from tools import profile, rules
from tools.inputs import DEVICE, RANDOM_STATE
from tools.numerics import pin_numeric_flags
from tools.result import CHECKS_VERSION, EvalResult
from tools.target import Target

EXECUTOR_STATUSES = ("ok", "compile_error", "runtime_error", "rejected", "not_run")
REFEREE_STATUSES = ("ok", "runtime_error", "error")
# Targets whose parameters and buffers hold at most this get a weights trial (tools/weights.py); larger ones are
# mostly randomly initialised layers already, and a second copy of their state would cost gigabytes.
WEIGHTS_TRIAL_MAX_BYTES = 256 << 20
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
        """Memory the planners may hold at once (sandbox.pipeline.MemoryGate); None without a GPU."""
        if not self.cuda:
            return None
        from sandbox.pipeline import planners_memory

        return planners_memory(len(self.devices), self.pool.deviceless)

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

    def interrupt(self) -> None:
        """Ctrl-C for the threads waiting on this session's submitted candidates (sandbox.pipeline.Pipeline.interrupt);
        the session still needs closing."""
        if self._pipeline is not None:
            self._pipeline.interrupt()

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


class Evaluation(Planning, Loading, Profiling):
    """One candidate against one target, in two phases. The plan phase (any thread; it needs no device): the rules,
    then a jailed planner records a launch plan per shape (sandbox/stages/planning.py). The device phase, on
    `device`: the trusted executor loads the plans (loading.py), verifies them against the referee (checks.py), and
    profiles them (profiling.py over timing.py). `assemble` is plan + load. The stages share this state and
    sandbox/stages/base.py's plumbing."""

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

    def assemble(self) -> EvalResult:
        """Plan, then load on the device: one call for callers that judge one candidate at a time."""
        with self._stage("assemble"):
            self.plan()
            self.load()
        return self.result

    def adopt_as_best(self, attempt: int | None) -> None:
        """This candidate is the run's best now: later ones are timed against it, side by side."""
        self.session.adopt_best(self, attempt)

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
