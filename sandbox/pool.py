"""Warm, jailed processes for candidates: started ahead of time, each used for one role and one candidate.

A process takes seconds to start (torch, triton); an evaluation takes one as its planner and, without a GPU, one as
its interpreter executor, so `spares` are kept started while the current ones work.

GPUs. By default a process gets no GPU at all: it compiles for the node's GPU kind without one and records plans on
host memory (`deviceless`; Triton's autotuning is left to the trusted executor), so candidate code never runs on a
GPU. With deviceless off, each new process is given the next GPU in turn (its CUDA context, the inputs it plans on
and Triton's autotuning live there). Once such a process is handed a role (it will run candidate code), it is listed in
a node-wide registry (a file per process under scratch_root()/kloop-gpu-users/<GPU UUID>/), and `quiet(uuid)` stops
every listed process of that GPU, this session's or another's on the same node (a Ray planner task beside a Ray
executor actor), while a trusted process times a kernel there: candidate code never runs on a GPU during another
candidate's timing. One listed during a pause is stopped as it is listed. Pauses begin and end, and processes are
listed, one at a time per GPU (a file lock), so no pause's end continues what another pause, or a listing, stopped.
Spares still starting run only kloop's code and are left to warm up.
"""
from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import signal
import threading
from pathlib import Path

from sandbox import jail
from sandbox.process import Child, descendants, process_tree, scratch_root

PLANNER_STATUSES = ("ok", "compile_error", "runtime_error", "rejected", "incorrect")
EXECUTOR_STATUSES = ("ok", "compile_error", "runtime_error", "rejected", "not_run")
NICENESS = 10  # jailed processes yield the CPU to the trusted ones, whose host launch path is inside a timing
REGISTRY = "kloop-gpu-users"
DEVICELESS_ENV = "KLOOP_DEVICELESS_PLANNERS"


def deviceless_default() -> bool:
    """Whether planners on a GPU node get no device ($KLOOP_DEVICELESS_PLANNERS, on unless "0")."""
    return os.environ.get(DEVICELESS_ENV, "1") != "0"


class WarmPool:
    def __init__(self, spares: int = 1, cuda: bool = False, limits: jail.Limits | None = None,
                 gpus: list[str] | None = None, cpus: frozenset[int] | None = None,
                 deviceless: bool | None = None) -> None:
        """gpus: CUDA_VISIBLE_DEVICES entries to spread the processes over (None: the caller's own devices); cpus:
        the CPUs they run on (sandbox.cores: not the trusted processes'; None: the caller's); deviceless (with
        cuda): processes get no device and compile for this process's first GPU, answering CUDA probes as it
        (sandbox/cuda_probes.py), so no candidate code makes a CUDA context or runs anything on a GPU; None:
        $KLOOP_DEVICELESS_PLANNERS, on unless "0"."""
        self.spares, self.cuda, self.limits, self.cpus = spares, cuda, limits, cpus
        self.deviceless = cuda and (deviceless_default() if deviceless is None else deviceless)
        self._described = None
        if self.deviceless:  # every GPU of a node is taken to be of one kind
            from sandbox.cuda_probes import describe

            self._described = describe(0)
        self._idle: list[Child] = []
        self._lock = threading.Lock()  # planners acquire from their own threads
        self._gpus = itertools.cycle(gpus or [None])
        self._uuids: dict[str | None, str | None] = {}
        self.isolation = jail.detect()

    def _start(self, limits: jail.Limits | None = None) -> Child:
        if self.deviceless:  # no GPU to list it under: timings never stop it, as it cannot reach one
            child = Child("sandbox.warm", cuda=False, jailed=True, limits=limits or self.limits,
                          statuses=tuple(set(PLANNER_STATUSES) | set(EXECUTOR_STATUSES)), niceness=NICENESS,
                          cpus=self.cpus, plan_for=self._described)
            child.gpu_uuid = None
            return child
        visible = next(self._gpus)
        child = Child("sandbox.warm", cuda=self.cuda, jailed=True, limits=limits or self.limits,
                      statuses=tuple(set(PLANNER_STATUSES) | set(EXECUTOR_STATUSES)), visible=visible,
                      niceness=NICENESS if self.cuda else 0, cpus=self.cpus)
        if self.cuda and visible not in self._uuids:
            from tools.profile import gpu_uuid

            self._uuids[visible] = gpu_uuid(visible)
        child.gpu_uuid = self._uuids.get(visible)
        return child

    def acquire(self, role: str, timeout_s: float = 180, limits: jail.Limits | None = None) -> Child:
        """A warm process turned into a planner or an (interpreter) executor; one started now where `limits` differ
        from the spares' (a target with large weights)."""
        with self._lock:
            for uuid in set(self._uuids.values()):
                heal(uuid)
            if limits is not None and limits != (self.limits or jail.Limits()):
                child = self._start(limits)
            else:
                child = self._idle.pop(0) if self._idle else self._start()  # the oldest spare is the warmest
            self.refill()
        child.wait_ready(timeout_s)
        child.call(timeout_s, cmd="become", role=role)
        child.statuses = set(PLANNER_STATUSES if role == "planner" else EXECUTOR_STATUSES) | {"ready"}
        if child.gpu_uuid:  # from now on it runs candidate code: listed, so timings on its GPU stop it
            register(child, child.gpu_uuid)
        return child

    def refill(self) -> None:
        """Start spares up to `spares` (the caller holds the lock, or nothing else uses the pool yet)."""
        while len(self._idle) < self.spares:
            self._idle.append(self._start())

    def close(self) -> None:
        with self._lock:
            for child in self._idle:
                child.close()
            self._idle.clear()

    def __enter__(self) -> "WarmPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# -- the node's registry of jailed processes per GPU -------------------------------------------------------------------
def _directory(uuid: str) -> Path:
    """The GPU's registry directory, its parent the caller's only (0700): in the unshare jail /dev/shm is the host's,
    and a candidate that could open the lock file could hold its flock and hang every timing on the GPU."""
    registry = scratch_root() / REGISTRY
    registry.mkdir(mode=0o700, exist_ok=True)
    if registry.stat().st_mode & 0o077:  # made before it was private
        registry.chmod(0o700)
    path = registry / "".join(c for c in uuid if c.isalnum() or c in "-_")
    path.mkdir(exist_ok=True)
    return path


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (with its pid, it names the process for good)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[19].decode()


def register(child: Child, uuid: str) -> None:
    """List a jailed process as one that may use GPU `uuid`; it stops itself if that GPU is being timed on."""
    directory = _directory(uuid)
    started = _start_time(child.proc.pid)
    if started is None:
        return
    with _transition(directory):
        (directory / str(child.proc.pid)).write_text(started)
        if _pausers(directory):
            _signal([child.proc.pid], signal.SIGSTOP)


@contextlib.contextmanager
def _transition(directory: Path):
    """One change of a GPU's pause state at a time, node-wide (an exclusive flock on the GPU's directory's lock file).
    Without it a pause that ends sends its SIGCONT after another pause's SIGSTOP (candidate code then runs during
    that pauser's timing), or after a listing's SIGSTOP (a planner then stays stopped for its whole load timeout,
    seen on an H100)."""
    with open(directory / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _pausers(directory: Path) -> list[Path]:
    """The pause markers of live processes (a pauser killed mid-pause leaves one behind: removed here)."""
    live = []
    for marker in directory.glob("paused-*"):
        pid = marker.name.split("-")[1]
        try:
            recorded = marker.read_text()
        except OSError:
            continue
        if pid.isdigit() and _start_time(int(pid)) == recorded:
            live.append(marker)
        else:
            marker.unlink(missing_ok=True)
    return live


def heal(uuid: str | None) -> None:
    """Continue this GPU's listed processes if nothing pauses them any more (a pauser that died mid-pause)."""
    if uuid:
        directory = _directory(uuid)
        with _transition(directory):
            if not _pausers(directory):
                _signal([pid for pid in _listed(directory) if _state(pid) == "T"], signal.SIGCONT)


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[0].decode()


def _listed(directory: Path) -> list[int]:
    """The live processes listed in a GPU's directory (entries of dead or reused pids are removed)."""
    alive = []
    for entry in directory.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            recorded = entry.read_text()
        except OSError:
            continue
        if _start_time(pid) == recorded:
            alive.append(pid)
        else:
            entry.unlink(missing_ok=True)
    return alive


def _signal(pids: list[int], signum: int) -> None:
    tree = process_tree() if pids else {}
    for root in pids:
        for pid in [root, *descendants(root, tree)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


@contextlib.contextmanager
def quiet(uuid: str | None):
    """Every listed jailed process on GPU `uuid` (every session's on this node) stopped for the block."""
    if not uuid:
        yield
        return
    directory = _directory(uuid)
    marker = directory / f"paused-{os.getpid()}-{threading.get_ident()}"
    with _transition(directory):
        marker.write_text(_start_time(os.getpid()) or "")
        _signal(_listed(directory), signal.SIGSTOP)
    try:
        yield
    finally:
        with _transition(directory):
            marker.unlink(missing_ok=True)
            if not _pausers(directory):
                _signal(_listed(directory), signal.SIGCONT)
