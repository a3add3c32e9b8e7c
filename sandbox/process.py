"""One child process driven over JSON lines, with deadlines: the planner, the executor and the referee all are.

Commands go to the child's stdin; replies come back on a pipe of their own (never stdout or stderr, which belong to
whatever the child runs and are only stored, size-capped). A reply is untrusted input: one line of at most
MAX_REPLY bytes holding a JSON object whose status is one of the statuses its caller allows, else the child is
killed and the call fails with a one-line reason. A jailed child has run candidate code, so every other field of
its replies must also be one the protocol has, of its type (JAILED_FIELDS), before the trusted side reads any. A
child is its own session (process group) and, when jailed, its own PID namespace, so killing it kills everything it
started.
"""
from __future__ import annotations

import json
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandbox import cores, jail

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_REPLY = 1 << 20
OUTPUT_LIMIT = 64 * 1024  # bytes of a child's stdout/stderr kept
PLAN_GPU_ENV = "KLOOP_PLAN_GPU"  # the GPU a child without a device plans for (sandbox/cuda_probes.py)
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
                 "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "TRITON_INTERPRET",
                 "TRITON_PTXAS_PATH", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
                 "TRITON_DEFAULT_FP_FUSION")


def _seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _names(value) -> bool:
    return isinstance(value, list) and all(v is None or isinstance(v, str) for v in value)


def _resource_rows(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(row, dict) and isinstance(row.get("kernel"), str)
        and all(isinstance(k, str) and (v is None or isinstance(v, (str, int, float, bool))) for k, v in row.items())
        for row in value)


# Every field a jailed child (planner; without a GPU, the interpreter executor) may put in a reply besides status and
# message, with its type: the evaluator reads these, and a process that ran candidate code is hostile.
JAILED_FIELDS = {"traceback": lambda v: isinstance(v, str), "fatal": lambda v: isinstance(v, bool),
                 "ms": _seconds, "wall_ms": _seconds, "overrun": lambda v: isinstance(v, str) and len(v) < 300,
                 "matched": lambda v: isinstance(v, list) and len(v) <= 4096 and all(
                     isinstance(n, str) and len(n) <= 500 for n in v),
                 "outputs": _names, "inputs": _names, "resources": _resource_rows}


def is_cuda_failure(e: BaseException) -> bool:
    """An error after which the process's CUDA context is unusable (an illegal address, a device-side assert): a
    trusted child that meets one answers with `fatal` and exits, and the evaluator starts another."""
    text = f"{type(e).__name__}: {e}"
    return any(s in text for s in ("CUDA error", "CUDA_ERROR", "cudaError", "illegal memory access",
                                   "illegal instruction", "misaligned address", "unspecified launch failure",
                                   "CUDADriverError", "an illegal", "device-side assert"))


class ChildDied(Exception):
    """The child exited, was killed, or broke the protocol; the message says how."""


class ChildTimeout(Exception):
    pass


SHM_MIN_BYTES = 16 << 30  # a /dev/shm smaller than this cannot hold a large target's weights (twice, as plan parts)


def scratch_root() -> Path:
    """Where children's working directories go: $KLOOP_SCRATCH, else RAM when there is a large /dev/shm (plans and
    their state are written there), else the temp dir. A container's /dev/shm is often 64 MB. Decided by the mount's
    size, not its free space, so every session on a node picks the same root (the GPU users' registry is there)."""
    if os.environ.get("KLOOP_SCRATCH"):
        root = Path(os.environ["KLOOP_SCRATCH"])
        root.mkdir(parents=True, exist_ok=True)
        return root
    shm = Path("/dev/shm")
    try:
        large = shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).total >= SHM_MIN_BYTES
    except OSError:
        large = False
    return shm if large else Path(tempfile.gettempdir())


def clean_env(workdir: Path, cuda: bool) -> dict:
    """An environment from an allowlist: no API keys, tokens or anything else of the caller's."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.update(HOME=str(workdir), TMPDIR=str(workdir), TRITON_CACHE_DIR=str(workdir / "triton-cache"),
               PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"))
    if not cuda:
        env["TRITON_INTERPRET"] = "1"  # no GPU: Triton kernels run on CPU tensors
    return env


class PythonClock:
    """How long a planner's forward ran its own Python: the planner says when forward starts and when Triton's
    compiler or autotuner (or ptxas) starts and stops, and only the time between, outside them, counts. A `while
    True:` in forward then costs the hang limit, not the whole load limit; a candidate that fakes the lines gains
    nothing over that (the call's own limit still holds)."""

    EVENTS = ("forward", "compiling", "compiled")

    def __init__(self, limit_s: float) -> None:
        self.limit_s, self.spent = limit_s, 0.0
        self.since: float | None = None   # when the Python now running began to count (None: not counting)
        self.started = self.compiling = False

    def note(self, event: str) -> None:
        now = time.monotonic()
        if self.since is not None:
            self.spent += now - self.since
        self.started = self.started or event == "forward"
        self.compiling = event == "compiling" or (self.compiling and event == "forward")
        self.since = now if self.started and not self.compiling else None

    def left(self) -> float:
        running = 0.0 if self.since is None else time.monotonic() - self.since
        return self.limit_s - self.spent - running


class Child:
    """A started program; `call` sends one command and waits for its reply within a deadline."""

    def __init__(self, module: str, *, cuda: bool, jailed: bool, statuses: tuple[str, ...],
                 workdir: Path | None = None, env: dict | None = None, limits: jail.Limits | None = None,
                 visible: str | None = None, niceness: int = 0, cpus: frozenset[int] | None = None,
                 plan_for: str | None = None) -> None:
        """visible: the CUDA_VISIBLE_DEVICES entry of the one GPU the child may use (None: the caller's);
        plan_for: a GPU described by sandbox/cuda_probes.describe, which the child (then given no device) compiles
        Triton for, answering CUDA probes as it;
        niceness: started under `nice -n` (jailed planners yield the CPU to the trusted processes that time);
        cpus: the CPUs it and everything it starts run on (sandbox.cores; None: the caller's)."""
        self.statuses = set(statuses) | {"ready"}
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kloop-", dir=scratch_root()))
        self.isolation = jail.detect() if jailed else None
        self.visible = visible
        read_fd, write_fd = os.pipe()
        self.stdout_path, self.stderr_path = self.workdir / "stdout.txt", self.workdir / "stderr.txt"
        argv = [sys.executable, "-m", module, str(write_fd), str(self.workdir)]
        if jailed:
            argv = jail.command(argv, workdir=self.workdir, readable=[REPO_ROOT / "sandbox", REPO_ROOT / "tools"],
                                gpu=cuda, limits=limits or jail.Limits(), isolation=self.isolation)
        if niceness:
            argv = [shutil.which("nice") or "nice", "-n", str(niceness), *argv]
        argv = [*cores.command(cpus), *argv]
        if env is None:
            env = clean_env(self.workdir, cuda or plan_for is not None)
            if jailed:  # RLIMIT_NPROC counts the threads of every jail together: no thread pool per core
                env.setdefault("OMP_NUM_THREADS", "1")
        if plan_for is not None:
            env = {**env, "CUDA_VISIBLE_DEVICES": "", PLAN_GPU_ENV: plan_for}
        elif visible is not None:
            env = {**env, "CUDA_VISIBLE_DEVICES": visible}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = jail.spawn(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, pass_fds=(write_fd,),
                                   cwd=self.workdir, env=env, start_new_session=True, text=True)
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "rb", buffering=0)
        self._buffer = b""
        self.ready: dict | None = None

    def wait_ready(self, timeout_s: float = 180) -> dict:
        if self.ready is None:
            self.ready = self._read_reply(timeout_s)
        return self.ready

    def call(self, timeout_s: float, python_s: float | None = None, **cmd) -> dict:
        """Send a command and wait for its reply, at most timeout_s. python_s: the child's own Python may run at most
        this long of it (see PythonClock); the rest is its compiler's."""
        self.wait_ready()
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise ChildDied(self._death_detail()) from None
        return self._read_reply(timeout_s, PythonClock(python_s) if python_s is not None else None)

    def _read_reply(self, timeout_s: float, clock: "PythonClock | None" = None) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" not in self._buffer:
                if len(self._buffer) > MAX_REPLY:
                    self.kill()
                    raise ChildDied(f"the reply was longer than {MAX_REPLY} bytes")
                left = deadline - time.monotonic()
                if left <= 0:
                    self.kill()
                    raise ChildTimeout(f"no answer within {timeout_s:.0f} s")
                if clock is not None and clock.left() <= 0:
                    self.kill()
                    raise ChildTimeout(f"forward ran its own Python for over {clock.limit_s:.0f} s (Triton's "
                                       "compiling and autotuning not counted)")
                wait = min(left, 1.0) if clock is None else min(left, 1.0, max(clock.left(), 0.01))
                ready, _, _ = select.select([self._replies], [], [], wait)
                if ready:
                    chunk = self._replies.read(1 << 16)
                    if not chunk:
                        try:
                            self.proc.wait(timeout=10)
                        except subprocess.TimeoutExpired:
                            self.kill()
                        raise ChildDied(self._death_detail())
                    self._buffer += chunk
            line, _, self._buffer = self._buffer.partition(b"\n")
            try:
                reply = json.loads(line)
            except (ValueError, RecursionError):
                reply = None
            if not (isinstance(reply, dict) and reply.get("status") == "progress"):
                break
            if set(reply) - {"status", "progress"} or reply.get("progress") not in PythonClock.EVENTS:
                self.kill()
                raise ChildDied("the process broke the protocol: a progress line it may not give")
            if clock is not None:
                clock.note(reply["progress"])
        if not isinstance(reply, dict) or reply.get("status") not in self.statuses or \
                not isinstance(reply.get("message", ""), str) or (self.isolation is not None and any(
                    key not in ("status", "message") and not JAILED_FIELDS.get(key, lambda v: False)(value)
                    for key, value in reply.items())):
            self.kill()
            raise ChildDied("the process broke the protocol: its reply was not one it may give")
        return reply

    def _death_detail(self) -> str:
        code = self.proc.poll()
        if code is None:
            return "the process closed its reply pipe"
        # A jailed program's death by signal comes back through the jail's tools as exit status 128 + signal.
        signum = -code if code < 0 else code - 128 if code > 128 and code - 128 in signal.valid_signals() else None
        how = f"killed by signal {signal.Signals(signum).name}" if signum else f"exited with code {code}"
        tail = self.stderr()[-1500:].strip()
        return f"process {how}" + (f"; stderr ends: {tail}" if tail else "")

    def stdout(self, limit: int = OUTPUT_LIMIT) -> str:
        return read_limited(self.stdout_path, limit)

    def stderr(self, limit: int = OUTPUT_LIMIT) -> str:
        return read_limited(self.stderr_path, limit)

    def output_sizes(self) -> tuple[int, int]:
        """Bytes written to stdout and stderr so far (to keep only what came before a hidden shape was shown)."""
        return tuple(p.stat().st_size if p.exists() else 0 for p in (self.stdout_path, self.stderr_path))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stopped(self) -> bool:
        """Whether the child is stopped (a planner paused while its GPU times a kernel)."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        return stat[stat.rindex(b")") + 2:].split()[0] == b"T"

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def close(self, keep_workdir: bool = False) -> None:
        # A jailed child ran candidate code and has nothing to flush (its output goes unbuffered to files): it is
        # killed at once, a tenth of a second less per candidate. A trusted one exits by itself, unless stopped.
        if self.isolation is None and self.proc.poll() is None and not self.stopped():
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()  # anything the child left running in its group goes too
        self._replies.close()
        if not keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def process_tree() -> dict[int, list[int]]:
    """Parent pid -> child pids, from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])  # the command name may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(root: int, tree: dict[int, list[int]] | None = None) -> list[int]:
    """Every process below `root` (children before grandchildren); `tree`: a process_tree() already read."""
    tree = process_tree() if tree is None else tree
    found, todo = [], [root]
    while todo:
        for child in tree.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def read_limited(path: Path, limit: int = OUTPUT_LIMIT, start: int = 0, stop: int | None = None) -> str:
    """Text of a file a child wrote, from byte `start` to `stop`, at most `limit` bytes; never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        os.lseek(fd, start, os.SEEK_SET)
        want = limit + 1 if stop is None else min(limit + 1, max(0, stop - start))
        data = os.read(fd, want)
    finally:
        os.close(fd)
    text = data[:limit].decode("utf-8", "replace")
    return text + ("\n[... truncated]" if len(data) > limit else "")
