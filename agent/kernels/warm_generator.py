"""Starter generation in a warm child: agent/kernels/inductor.py's generation, one target after another in one
long-lived process, so a suite pays Python's and torch's imports, Inductor's first-use set-up and its compile
workers' start once per child rather than once per problem. Measured at CPU size on the shared 2-core machine
(tests/experiments/starter_phases.py, load ~10): KernelBench level 1's ReLU, Softmax and square matmul and level 2's 12 took
20-36 s each in fresh children, 12-29 s of it outside the generation itself (the child's start, imports, Inductor's
first use); one warm child took 24 s for the first and 3.6-8.3 s for each of the others.

The child keeps what inductor.generate's child keeps apart from the loop (Dynamo's and Inductor's global state, a
crash or a hang); each generation resets Dynamo (inductor.capture) and frees the GPU's cached memory after. A child
that dies, hangs past the timeout or is stopped is killed and the next generation starts another. Some of Inductor's
state outlives the reset: in a process that had generated before, GEMM problems failed ("CachingAutotuner object has
no attribute 'future'", "no valid choice") that a fresh process generated, and level 2's 92 failed with an
InductorError in one suite's warm child and was generated in the next suite's. So a failure of Inductor's own
(FRESH_CHILD_RETRIES) in a child that has generated before is tried once more in a fresh child.

    generator = WarmGenerator(visible="0")                  # no process yet
    generated = generator.generate("kernelbench/level1/19_ReLU.py")   # NoStarter / GenerationStopped as generate()
    generator.close()
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import Callable

from agent.kernels import inductor

MARK = "kloop-starter "   # a reply line; anything else the generation prints goes to stderr
# failure classes (inductor.FAILURE_CLASSES) that an earlier generation's state in the child may have caused
FRESH_CHILD_RETRIES = ("compile_error", "no_template", "generator_crash", "other")


class WarmGenerator:
    """One warm generating child on one GPU (visible: its CUDA_VISIBLE_DEVICES entry; None: this process's), used by
    one thread at a time (any thread may `kill` it). started: called with each child process once it runs (a suite
    lists it as a user of its GPU)."""

    def __init__(self, visible: str | None = None, small: bool | None = None,
                 started: Callable[[subprocess.Popen], None] | None = None,
                 timeout_s: float = inductor.TIMEOUT_S) -> None:
        if small is None:
            from tools.inputs import DEVICE
            small = DEVICE.type != "cuda"
        self.visible, self.small, self.started, self.timeout_s = visible, small, started, timeout_s
        self._child: subprocess.Popen | None = None
        self._stderr = None
        self._buffer = b""
        self._served = 0   # replies of the current child

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1" if self.small else "0")}
        env["PYTHONPATH"] = os.pathsep.join([str(inductor.ROOT)] + [p for p in env.get("PYTHONPATH", "").split(
            os.pathsep) if p])
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "2")   # several children side by side, each a small pool
        if self.visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.visible
        self._stderr = tempfile.TemporaryFile()
        command = [sys.executable, "-m", "agent.kernels.warm_generator"] + (["--small"] if self.small else [])
        self._child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                       env=env, cwd=str(inductor.ROOT))
        self._buffer = b""
        self._served = 0
        inductor._RUNNING.add(self._child)   # inductor.stop_generating() kills it too
        if self.started is not None:
            self.started(self._child)
        return self._child

    def generate(self, target_spec: str) -> inductor.Generated:
        """As inductor.generate(target_spec), in this warm child (started if there is none)."""
        if self._child is not None and self._child.poll() is not None:   # died (or was killed) since its last reply
            self.close()
        child = self._child or self._start()
        try:
            child.stdin.write((json.dumps({"target": str(target_spec)}) + "\n").encode())
            child.stdin.flush()
        except OSError:
            return self._failed()
        deadline = time.monotonic() + self.timeout_s
        while b"\n" not in self._buffer:
            if time.monotonic() >= deadline:
                self.close()
                raise inductor.NoStarter(f"torch.compile did not finish generating Triton within "
                                         f"{self.timeout_s:.0f} s")
            ready, _, _ = select.select([child.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(child.stdout.fileno(), 1 << 20)
                if not chunk:
                    return self._failed()
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(line.decode()[len(MARK):])
        self._served += 1
        if "error" in reply:
            failure = inductor.NoStarter(reply["error"])
            if self._served > 1 and failure.kind in FRESH_CHILD_RETRIES:   # once: a fresh child has served nothing
                self.close()
                return self.generate(target_spec)
            raise failure
        return inductor.Generated.from_dict(reply)

    def _failed(self):
        """The child died mid-generation: killed (GenerationStopped) or crashed (NoStarter, its last stderr line)."""
        child = self._child
        code = child.wait()
        self._stderr.seek(0)
        tail = " ".join(self._stderr.read().decode(errors="replace").strip().splitlines()[-1:])[:300]
        self.close()
        failure = f"generating Inductor's Triton failed (exit {code}): {tail or 'no output'}"
        raise inductor.GenerationStopped(failure) if code < 0 else inductor.NoStarter(failure)

    def kill(self) -> None:
        """End the child now, from any thread: a generation in flight raises GenerationStopped in its own."""
        child = self._child
        if child is not None:
            child.kill()

    def close(self) -> None:
        """The child ends and its pipes are closed (by the thread that generates)."""
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            inductor._RUNNING.discard(self._child)
            for pipe in (self._child.stdin, self._child.stdout):
                pipe.close()
            self._stderr.close()
            self._child = None


def serve(small: bool) -> None:
    """The child: a target per stdin line, a reply line (MARK + JSON) per target on stdout."""
    import gc

    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)   # prints of the reference or Inductor go to stderr, never between replies
    sys.stdout = sys.stderr
    for line in sys.stdin:
        spec = json.loads(line)["target"]
        try:
            reply = inductor.generate_here(spec, small).to_dict()
        except inductor.NoStarter as e:
            reply = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 (a fresh child would have exited with it: one line, the child lives on)
            message = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            reply = {"error": f"generating Inductor's Triton failed: {message}"}
        gc.collect()
        _free_gpu_cache()
        replies.write(MARK + json.dumps(reply) + "\n")
        replies.flush()


def _free_gpu_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    serve("--small" in sys.argv[1:])
    sys.stderr.flush()
    os._exit(0)   # as inductor's child: without waiting for Inductor's compile-worker pool to shut down
