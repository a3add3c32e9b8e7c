"""Warm, jailed processes for candidates: started ahead of time, each used for one role and one candidate.

A process takes seconds to start (torch, triton, a CUDA context); an evaluation takes one as its planner and,
without a GPU, one as its interpreter executor, so `spares` are kept started while the current ones work.
"""
from __future__ import annotations

import threading

from sandbox import jail
from sandbox.process import Child

PLANNER_STATUSES = ("ok", "compile_error", "runtime_error", "rejected", "incorrect")
EXECUTOR_STATUSES = ("ok", "compile_error", "runtime_error", "rejected", "not_run")


class WarmPool:
    def __init__(self, spares: int = 1, cuda: bool = False, limits: jail.Limits | None = None) -> None:
        self.spares, self.cuda, self.limits = spares, cuda, limits
        self._idle: list[Child] = []
        self._lock = threading.Lock()  # branches acquire from their own threads
        self.isolation = jail.detect()

    def _start(self) -> Child:
        return Child("sandbox.warm", cuda=self.cuda, jailed=True, limits=self.limits,
                     statuses=tuple(set(PLANNER_STATUSES) | set(EXECUTOR_STATUSES)))

    def acquire(self, role: str, timeout_s: float = 180) -> Child:
        """A warm process turned into a planner or an (interpreter) executor."""
        with self._lock:
            child = self._idle.pop(0) if self._idle else self._start()  # the oldest spare is the warmest
            while len(self._idle) < self.spares:
                self._idle.append(self._start())
        child.wait_ready(timeout_s)
        child.call(timeout_s, cmd="become", role=role)
        child.statuses = set(PLANNER_STATUSES if role == "planner" else EXECUTOR_STATUSES) | {"ready"}
        return child

    def close(self) -> None:
        with self._lock:
            for child in self._idle:
                child.close()
            self._idle.clear()

    def __enter__(self) -> "WarmPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
