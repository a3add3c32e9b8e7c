"""Starting, driving and killing worker processes: one fresh process per candidate, kept warm ahead of time.

Each worker is its own session (process group), so a timeout kills everything it started. Its environment is built
from an allowlist (no API keys or tokens of any kind), with its own temp dir, HOME and TRITON_CACHE_DIR. A spare
worker is started in the background while the current one runs, so a candidate rarely waits for torch to import.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
                 "LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "TRITON_INTERPRET",
                 "TRITON_PTXAS_PATH", "TORCHINDUCTOR_CACHE_DIR", "NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                 "NVSHMEM_DISABLE_NVLS")
OUTPUT_LIMIT = 64 * 1024  # bytes of the candidate's stdout/stderr kept


class WorkerDied(Exception):
    """The worker exited or was killed; `detail` says how (signal, exit code, stderr tail)."""


class WorkerTimeout(Exception):
    pass


def scrubbed_env(workdir: Path) -> dict:
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.update(
        HOME=str(workdir), TMPDIR=str(workdir), TRITON_CACHE_DIR=str(workdir / "triton-cache"),
        PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1",
    )
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(tempfile.gettempdir()) / "kloop-inductor-cache"))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"  # no GPU: candidates' Triton kernels run on CPU tensors
    return env


def _scratch_root() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


class WorkerProcess:
    """One sandboxed process; `call` sends a command and waits for its reply within a deadline."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="kloop-worker-", dir=_scratch_root()))
        read_fd, write_fd = os.pipe()
        self.stdout_path = self.workdir / "stdout.txt"
        self.stderr_path = self.workdir / "stderr.txt"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sandbox.worker", str(write_fd)],
                stdin=subprocess.PIPE, stdout=out, stderr=err, pass_fds=(write_fd,), cwd=self.workdir,
                env=scrubbed_env(self.workdir), start_new_session=True, text=True,
            )
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "rb", buffering=0)
        self._buffer = b""
        self.ready: dict | None = None

    def wait_ready(self, timeout_s: float = 120) -> dict:
        if self.ready is None:
            self.ready = self._read_reply(timeout_s)
        return self.ready

    def call(self, timeout_s: float, **cmd) -> dict:
        self.wait_ready()
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self._death_detail()) from None
        return self._read_reply(timeout_s)

    def _read_reply(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout_s:.0f} s")
            ready, _, _ = select.select([self._replies], [], [], min(left, 1.0))
            if ready:
                chunk = self._replies.read(1 << 16)
                if not chunk:
                    self.proc.wait(timeout=10)
                    raise WorkerDied(self._death_detail())
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            self.kill()
            raise WorkerDied("the worker wrote something that is not a reply on its control pipe") from None
        if not isinstance(reply, dict):
            self.kill()
            raise WorkerDied("the worker's reply is not an object")
        return reply

    def _death_detail(self) -> str:
        code = self.proc.poll()
        how = f"killed by signal {signal.Signals(-code).name}" if code and code < 0 else f"exited with code {code}"
        tail = self.stderr()[-1500:].strip()
        return f"worker {how}" + (f"; stderr ends: {tail}" if tail else "")

    def stdout(self) -> str:
        return _read_limited(self.stdout_path)

    def stderr(self) -> str:
        return _read_limited(self.stderr_path)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()  # anything the candidate left running in its group goes too
        self._replies.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _read_limited(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(OUTPUT_LIMIT + 1)
    except OSError:
        return ""
    text = data[:OUTPUT_LIMIT].decode("utf-8", "replace")
    return text + ("\n[... truncated]" if len(data) > OUTPUT_LIMIT else "")


class WorkerPool:
    """Hands out fresh workers, keeping `spares` started ahead so the next candidate finds one warm."""

    def __init__(self, spares: int = 1) -> None:
        self.spares = spares
        self._idle: list[WorkerProcess] = []
        self._lock = threading.Lock()  # parallel branches acquire from their own threads

    def acquire(self) -> WorkerProcess:
        with self._lock:
            worker = self._idle.pop(0) if self._idle else WorkerProcess()  # the oldest spare is the warmest
            while len(self._idle) < self.spares:
                self._idle.append(WorkerProcess())
        return worker

    def close(self) -> None:
        for worker in self._idle:
            worker.close()
        self._idle.clear()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
