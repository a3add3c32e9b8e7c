"""Evaluation over a Ray cluster: `kloop optimize TARGET --ray auto|ADDRESS` (pip install -e '.[ray]').

    with RaySession("auto") as session:            # joins the running cluster (ray start --head / ray start ...)
        pending = session.submit(target, source)   # the same staged calls as Session.submit
        pending.assemble(), pending.verify(), pending.profile()

- Planning is a Ray task per candidate (one CPU), which runs the jailed planner on whatever node Ray picks (on a GPU
  node its planner compiles for that node's GPU without a device: sandbox/pool.py) and returns the checked plans as
  a tar archive; Ray runs a task again elsewhere when its node dies.
- Every GPU of the cluster gets a DeviceActor (num_gpus=1; on a CPU-only cluster, one per unit of the custom
  resource `kloop_device`), which holds that GPU's trusted executor and referee (a Session of its own) and loads,
  verifies and profiles the plans sent to it. While it times, planners given its GPU (KLOOP_DEVICELESS_PLANNERS=0),
  this run's or any other on its node, are stopped (sandbox/pool.py's node registry).
- The driver (this process) runs the graph and the queues (sandbox/pipeline.py), keeps the standing best (its
  plans go to an actor with each candidate that may challenge it), and alone writes the run database. An actor that
  dies with its node loses only the candidate it held: that candidate is evaluated again on another actor, and a
  replacement actor is started where the cluster has a free device.

The trust model is unchanged: planners are jailed wherever they run, the actors are the trusted executor and
referee, and plans are loaded as hostile data on the actor's side.
"""
from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.exceptions import RayActorError

from sandbox.evaluate import BestKernel, EvalSettings, Evaluation, Session, versions
from sandbox.pipeline import DeviceLost, Pipeline
from sandbox.process import scratch_root
from tools import rules
from tools.numerics import pin_numeric_flags
from tools.result import EvalResult
from tools.target import Target, module_from_source

DEVICE_RESOURCE = "kloop_device"   # a CPU-only cluster's devices (tests: ray.cluster_utils.Cluster)
try:  # an actor that died, or whose node is unreachable
    from ray.exceptions import ActorUnavailableError
    LOST = (RayActorError, ActorUnavailableError)
except ImportError:  # older Ray
    LOST = (RayActorError,)


# -- what travels: targets by source, plans as tar archives ---------------------------------------------------------
def target_spec(target: Target) -> dict:
    return {"name": target.name, "path": str(target.path), "source": target.source, "builtin": target.builtin}


def target_from(spec: dict) -> Target:
    source = spec["source"]
    module = module_from_source(source, {}, f"kloop_target_{hashlib.sha256(source.encode()).hexdigest()[:12]}")
    return Target(name=spec["name"], path=Path(spec["path"]), source=source, module=module, builtin=spec["builtin"])


def pack(directory: Path, only: str | None = None) -> bytes:
    """A plans directory as a tar archive (`only`: one of its entries, e.g. the main shape's "0")."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if only is None:
            tar.add(directory, arcname=".")
        else:
            tar.add(directory / only, arcname=only)
    return buffer.getvalue()


def unpack(data: bytes, directory: Path) -> Path:
    """Extract with tarfile's "data" filter: regular files and directories under `directory` only."""
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
        tar.extractall(directory, filter="data")
    return directory


# -- the remote sides ---------------------------------------------------------------------------------------------
class _PlanningSession(Session):
    """A Ray worker's planners: the node's GPUs in turn, no device of its own (GPU facts come from the actor)."""

    def gpu(self) -> dict | None:
        return None


_planning: _PlanningSession | None = None
_planning_lock = threading.Lock()


def _planning_session() -> _PlanningSession:
    global _planning
    with _planning_lock:
        if _planning is None:
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            visible = [v.strip() for v in __import__("os").environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
                       if v.strip()]
            gpus = [visible[i] if i < len(visible) else str(i) for i in range(count)] or None
            _planning = _PlanningSession(spares=1, gpus=gpus)
    return _planning


_targets: dict[str, Target] = {}


@ray.remote(num_cpus=1, max_retries=3)
def plan_candidate(target: dict, source: str, settings: EvalSettings, index: int) -> tuple[dict, bytes | None]:
    """The plan phase on a Ray worker: the EvalResult so far, and the plans (None when planning failed)."""
    return plan_here(target, source, settings, index)


def plan_here(target: dict, source: str, settings: EvalSettings, index: int) -> tuple[dict, bytes | None]:
    # A plain function (Ray ships the remote one by value; this one, and the worker's state, by reference).
    session = _planning_session()
    with _planning_lock:
        if target["source"] not in _targets:  # its derived shapes are worked out once per worker
            _targets.clear()
            _targets[target["source"]] = target_from(target)
    ev = Evaluation(session, _targets[target["source"]], source, settings, index, None)
    try:
        ev.plan()
        plans = pack(ev.plans_dir) if ev.result.verdict is None and ev.plans_dir is not None else None
        return ev.result.to_dict(withheld=True), plans
    finally:
        ev.close()


@ray.remote(max_restarts=0, max_task_retries=0)
class DeviceActor:
    """One GPU's (or CPU device's) trusted executor and referee on its node."""

    def __init__(self) -> None:
        import torch

        self.session = Session(spares=0 if torch.cuda.is_available() else 1)  # CPU: interpreter executors
        self.session.start()
        self._best_key: str | None = None
        self._targets: dict[str, Target] = {}

    def where(self) -> dict:
        return {"node": ray.get_runtime_context().get_node_id(), "gpu": self.session.gpu()}

    def evaluate(self, target: dict, source: str, settings: EvalSettings, index: int, planned: dict, plans: bytes,
                 best: tuple | None) -> dict:
        ev = self._evaluation(target, source, settings, index, planned, plans, best)
        try:
            ev.load()
            ev.verify()
            ev.profile()
        finally:
            ev.release_device()
        return ev.close().to_dict(withheld=True)

    def versus(self, target: dict, source: str, settings: EvalSettings, index: int, planned: dict, plans: bytes,
               best: tuple | None) -> dict:
        ev = self._evaluation(target, source, settings, index, planned, plans, best)
        ev.versus_standing_best(self.session.devices[0])
        return ev.close().to_dict(withheld=True)

    def _evaluation(self, target, source, settings, index, planned, plans, best) -> Evaluation:
        if target["source"] not in self._targets:
            self._targets = {target["source"]: target_from(target)}  # one target at a time, as the referee
        self._use_best(best)
        ev = Evaluation(self.session, self._targets[target["source"]], source, settings, index,
                        self.session.devices[0])
        ev.result = EvalResult.from_dict(planned)
        ev.plans_dir = unpack(plans, Path(tempfile.mkdtemp(prefix=f"eval-{index}-", dir=self.session.directory)))
        return ev

    def _use_best(self, best: tuple | None) -> None:
        """The driver's standing best: (key, attempt, median_us, target sha256, plans ref), unpacked once."""
        if best is None:
            self.session.forget_best()
            self._best_key = None
            return
        key, attempt, median_us, sha, plans_ref = best
        if key == self._best_key:
            return
        directory = unpack(ray.get(plans_ref), self.session.directory / f"best-{key}")
        self.session.forget_best()
        self.session.best = BestKernel(attempt, directory, median_us, sha)
        self._best_key = key

    def close(self) -> None:
        self.session.close()


# -- the driver's side --------------------------------------------------------------------------------------------
@dataclass
class RemoteDevice:
    actor: object
    name: str


@dataclass
class RemoteBest:
    key: str
    attempt: int | None
    median_us: float
    target_sha256: str
    plans: object     # an ObjectRef of the main shape's plan as a tar archive


class RemoteEvaluation:
    """The driver's handle on one candidate: planned by a Ray task, evaluated by a DeviceActor."""

    def __init__(self, session: "RaySession", target: Target, source: str, settings: EvalSettings,
                 index: int) -> None:
        self.session, self.target, self.source, self.settings, self.index = session, target, source, settings, index
        self.device: RemoteDevice | None = None
        self.plans: bytes | None = None
        self.planner = None   # the pipeline kills a local planner on close; a Ray task is simply abandoned
        self.result = EvalResult(language=rules.detect_language(source), numeric_flags=pin_numeric_flags(),
                                 versions=versions(), isolation=session.isolation)

    def plan(self) -> EvalResult:
        task = plan_candidate.options(**self.session.planning_options)
        result, self.plans = ray.get(task.remote(target_spec(self.target), self.source, self.settings, self.index))
        self.result = EvalResult.from_dict(result)
        return self.result

    def bind(self, device: RemoteDevice) -> None:
        self.device = device

    def load(self) -> EvalResult:
        if self.result.verdict is not None or self.plans is None:
            return self.result
        self._remote("evaluate")
        return self.result

    def verify(self) -> EvalResult:
        return self.result

    def profile(self) -> EvalResult:
        return self.result

    def release_device(self) -> None:
        pass

    def versus_standing_best(self, device: RemoteDevice) -> None:
        self.device = device
        self._remote("versus")

    def _remote(self, method: str) -> None:
        kept = [f for f in self.result.flags if f.startswith("device_lost")]
        try:
            answer = ray.get(getattr(self.device.actor, method).remote(
                target_spec(self.target), self.source, self.settings, self.index, self.result.to_dict(withheld=True),
                self.plans, self.session.best_for(self.target)))
        except LOST as e:
            raise DeviceLost(f"{self.device.name}: {type(e).__name__}") from None
        self.result = EvalResult.from_dict(answer)
        self.result.flags = kept + [f for f in self.result.flags if f not in kept]

    def adopt_as_best(self, attempt: int | None) -> None:
        self.session.adopt_best(self, attempt)

    def close(self) -> EvalResult:
        self.plans = None
        return self.result


class RaySession:
    """Session's interface (submit, start, restore_best, forget_best, isolation, planners, devices, close) over a
    Ray cluster; `address`: "auto" (the running cluster) or a cluster address."""

    def __init__(self, address: str = "auto", settings: EvalSettings | None = None, planners: int | None = None,
                 init: bool = True) -> None:
        if init and not ray.is_initialized():
            ray.init(address=address, log_to_driver=False)
        self.settings = settings or EvalSettings()
        gpus = bool(ray.cluster_resources().get("GPU"))
        self.settings.small = not gpus  # the cluster's devices decide, not this process's
        # A planning task takes no GPU from Ray, but its planners need the node's GPUs (a CUDA context, inputs,
        # autotuning): Ray must leave CUDA_VISIBLE_DEVICES alone (some versions empty it for GPU-less tasks).
        self.planning_options = {"runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}} \
            if gpus else {}
        self.best: RemoteBest | None = None
        self._lock = threading.Lock()
        self._count = 0
        self.devices: list[RemoteDevice] = []
        self._made = 0
        self._add_devices()
        if not self.devices:
            raise RuntimeError("the Ray cluster has no GPU (and no kloop_device resource) for an executor")
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.planners = planners or max(1, cpus - 2 * len(self.devices))
        self.isolation = ray.get(_isolation.remote())
        self.weakly_isolated = not self.isolation.startswith("bwrap")
        self._pipeline = Pipeline(self)

    def planning_memory(self) -> int | None:
        """No node-wide memory gate: Ray places the planning tasks on the cluster's nodes by their own resources."""
        return None

    def _capacity(self) -> tuple[dict, int]:
        total = ray.cluster_resources()
        if total.get("GPU"):
            return {"num_gpus": 1}, int(total["GPU"])
        return {"num_cpus": 0, "resources": {DEVICE_RESOURCE: 1}}, int(total.get(DEVICE_RESOURCE, 0))

    def _add_devices(self) -> list[RemoteDevice]:
        """DeviceActors for the cluster's devices that have none (all at first; a replacement after a loss)."""
        options, count = self._capacity()
        free = count - len(self.devices)
        if free <= 0:
            return []
        actors = [DeviceActor.options(**options).remote() for _ in range(free)]
        made = []
        for actor in actors:
            try:
                where = ray.get(actor.where.remote(), timeout=600)
            except Exception:  # a device that cannot start (its node went away) is not counted
                ray.kill(actor)
                continue
            self._made += 1
            gpu = where["gpu"] or {}
            name = f"ray:{where['node'][:8]}:" + (f"gpu{gpu.get('index')}" if gpu else f"device{self._made}")
            made.append(RemoteDevice(actor, name))
        self.devices.extend(made)
        return made

    def device_lost(self, device: RemoteDevice) -> RemoteDevice | None:
        """Pipeline's hook: drop the lost actor; a replacement where the cluster has a free device now."""
        if device in self.devices:
            self.devices.remove(device)
        try:
            ray.kill(device.actor)
        except Exception:
            pass
        made = self._add_devices()
        return made[0] if made else None

    def submit(self, target: Target, source: str, settings: EvalSettings | None = None):
        with self._lock:
            self._count += 1
            index = self._count
        return self._pipeline.submit(RemoteEvaluation(self, target, source, settings or self.settings, index))

    def start(self, timeout_s: float = 600) -> None:
        """The actors started when the session was made; planning workers start with their first task."""

    def best_for(self, target: Target) -> tuple | None:
        best = self.best
        if best is None or best.target_sha256 != target.sha256:
            return None
        return best.key, best.attempt, best.median_us, best.target_sha256, best.plans

    def adopt_best(self, evaluation: RemoteEvaluation, attempt: int | None, median_us: float | None = None) -> None:
        median_us = median_us or evaluation.result.median_us
        if median_us is None or evaluation.plans is None:
            return
        with tempfile.TemporaryDirectory(dir=scratch_root()) as tmp:
            main = pack(unpack(evaluation.plans, Path(tmp)), only="0")  # the best is timed at the main shape only
        self.best = RemoteBest(uuid.uuid4().hex, attempt, median_us, evaluation.target.sha256, ray.put(main))

    def forget_best(self) -> None:
        self.best = None

    def restore_best(self, target: Target, source: str, attempt: int, median_us: float) -> None:
        ev = RemoteEvaluation(self, target, source, self.settings, 0)
        ev.plan()
        if ev.result.verdict is None:
            self.adopt_best(ev, attempt, median_us)

    def interrupt(self) -> None:
        """As Session.interrupt."""
        self._pipeline.interrupt()

    def close(self) -> None:
        self._pipeline.close()
        for device in self.devices:
            try:
                ray.kill(device.actor)
            except Exception:
                pass
        self.devices = []

    def __enter__(self) -> "RaySession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@ray.remote(num_cpus=0)
def _isolation() -> str:
    from sandbox import jail

    mode = jail.detect()
    return f"{mode.mode}: {mode.note}" if mode.note else mode.mode
