"""`kloop serve`: kloop's evaluator as an HTTP service for RL trainers and data harvesters.

    POST /v1/evaluate[?wait=true]   {"target": built-in name or KernelBench-style source, "candidate": source,
                                     "options": {...}, "key": optional idempotency key}
                                    202 {"id", "status": "queued"}; with wait=true, 200 and the answer below
    GET  /v1/result/{id}[?wait=true&timeout=S]
                                    {"id", "status": queued|running|done, and when done: "result" (EvalResult.to_dict()),
                                     "components" and "reward" (tools/records/reward.py, REWARD_FORMULA),
                                     "error" (null, or {"kind": time_limit|target|internal, "message"}), "queued_s",
                                     "eval_s", "worker"}
    GET  /v1/health                 {"status": "ok", workers, queue, ...}; the only path that needs no token

Durability: a request is written to SQLite (WAL, synchronous=FULL) before it is acknowledged; workers claim it there,
and its answer is written there. A service killed with SIGKILL loses nothing it acknowledged: at start, requests
that were queued or running are run (again); a request runs to an answer once per id (an answer is written only by
the worker that holds the request's current lease), and a client that retries with the same `key` gets the same id.

Evaluations run in worker processes (`python -m agent.serve worker`), one request at a time each, each owning an
evaluator Session: on CPU several (interpreter, jailed processes of their own), with --gpus one per GPU (CUDA_VISIBLE_DEVICES
set to that GPU, so its Session's executor and referee live there and timings never share a GPU). A worker that
passes the request's time limit is killed with everything it started, the answer says so (verdict timeout, error
kind time_limit), and a fresh worker takes its place.

The HTTP side is Starlette on uvicorn (the optional extra `serve`); nothing else in kloop imports this module.
"""
from __future__ import annotations

import ast
import asyncio
import hmac
import ipaddress
import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

DEFAULT_PORT = 8765
DEFAULT_DB = "runs/serve.db"
MAX_BODY = 4 << 20            # bytes of one request body
MAX_SOURCE = 1 << 20          # characters of a target or a candidate
MAX_RUNS = 3                  # a request that was started this many times without an answer (the service died
                              # each time) gets an internal error instead of a fourth run
KEEP_DONE_S = 7 * 24 * 3600   # answers older than this are pruned (at start, and every PRUNE_EVERY answers)
PRUNE_EVERY = 1000
# options a request may set: EvalSettings fields (bounded) and the time limit
OPTION_RULES = {
    "time_limit_s": (float, 0.1, 24 * 3600),
    "trials": (int, 1, 50),
    "variant_trials": (int, 0, 20),
    "timed_calls": (int, 1, 1000),
    "warmup_calls": (int, 0, 100),
    "ncu": (bool, None, None),
    "baselines": (list, None, None),
}
BASELINES = ("eager", "compile")


class ServeError(Exception):
    """The service cannot start as asked: one line for the user (exit status 2)."""


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class QueueFull(Exception):
    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(f"the queue is full ({waiting} requests waiting): retry after {retry_after} s")
        self.retry_after = retry_after


# -- the queue and the answers: SQLite ---------------------------------------------------------------------------------

class JobStore:
    """Requests and answers in one SQLite file (WAL). One connection behind a lock: every write is a short
    transaction, committed (synchronous=FULL) before the caller acknowledges anything."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=30)
        self.conn.row_factory = sqlite3.Row
        mode = self.conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise ServeError(f"{self.path}: SQLite would not use WAL (journal mode {mode})")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript("""
            CREATE TABLE IF NOT EXISTS jobs (
                seq INTEGER PRIMARY KEY AUTOINCREMENT,
                id TEXT NOT NULL UNIQUE,
                key TEXT UNIQUE,
                state TEXT NOT NULL,            -- queued, running, done
                request TEXT NOT NULL,          -- json
                response TEXT,                  -- json, when done
                created_at REAL NOT NULL,
                started_at REAL,
                finished_at REAL,
                runs INTEGER NOT NULL DEFAULT 0,
                lease TEXT,                     -- the current run's token: only its holder may write the answer
                worker TEXT
            );
            CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, seq);
        """)

    def _tx(self, fn):
        with self._lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                out = fn(self.conn)
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")
            return out

    def add(self, request: dict, key: str | None, max_queued: int, retry_after) -> tuple[str, bool]:
        """(id, True) for a new request, committed; (id, False) for a key seen before. QueueFull when full."""
        def fn(conn):
            if key is not None:
                row = conn.execute("SELECT id FROM jobs WHERE key = ?", (key,)).fetchone()
                if row:
                    return row["id"], False
            waiting = conn.execute("SELECT count(*) FROM jobs WHERE state = 'queued'").fetchone()[0]
            if waiting >= max_queued:
                raise QueueFull(waiting, retry_after(waiting))
            job_id = uuid.uuid4().hex
            conn.execute("INSERT INTO jobs (id, key, state, request, created_at) VALUES (?, ?, 'queued', ?, ?)",
                         (job_id, key, json.dumps(request), time.time()))
            return job_id, True
        return self._tx(fn)

    def claim(self, worker: str) -> tuple[str, dict, str, int] | None:
        """The oldest queued request, now running under a fresh lease: (id, request, lease, runs)."""
        def fn(conn):
            row = conn.execute("SELECT id, request, runs FROM jobs WHERE state = 'queued' ORDER BY seq LIMIT 1"
                               ).fetchone()
            if row is None:
                return None
            lease = uuid.uuid4().hex
            conn.execute("UPDATE jobs SET state = 'running', lease = ?, runs = runs + 1, started_at = ?, worker = ? "
                         "WHERE id = ?", (lease, time.time(), worker, row["id"]))
            return row["id"], json.loads(row["request"]), lease, row["runs"] + 1
        return self._tx(fn)

    def finish(self, job_id: str, lease: str, response: dict) -> bool:
        """Write the answer if `lease` still holds the request; False (and nothing written) otherwise."""
        def fn(conn):
            cur = conn.execute("UPDATE jobs SET state = 'done', response = ?, finished_at = ?, lease = NULL "
                               "WHERE id = ? AND state = 'running' AND lease = ?",
                               (json.dumps(response), time.time(), job_id, lease))
            return cur.rowcount == 1
        return self._tx(fn)

    def requeue_running(self) -> int:
        """At start: what was running when the service stopped runs again."""
        return self._tx(lambda conn: conn.execute(
            "UPDATE jobs SET state = 'queued', lease = NULL WHERE state = 'running'").rowcount)

    def prune(self, older_than_s: float) -> int:
        return self._tx(lambda conn: conn.execute(
            "DELETE FROM jobs WHERE state = 'done' AND finished_at < ?", (time.time() - older_than_s,)).rowcount)

    def get(self, job_id: str) -> dict | None:
        with self._lock:
            row = self.conn.execute("SELECT id, state, response, created_at, started_at, worker FROM jobs "
                                    "WHERE id = ?", (job_id,)).fetchone()
        return dict(row) if row else None

    def counts(self) -> dict:
        with self._lock:
            rows = self.conn.execute("SELECT state, count(*) AS n FROM jobs GROUP BY state").fetchall()
        return {"queued": 0, "running": 0, "done": 0, **{r["state"]: r["n"] for r in rows}}

    def close(self) -> None:
        with self._lock:
            self.conn.close()


# -- requests: checked before they are accepted ------------------------------------------------------------------------

def check_request(body: object, max_time_limit_s: float) -> tuple[dict, str | None]:
    """(the request as it is queued, its idempotency key). BadRequest with one line otherwise."""
    from tools.targets import BUILTIN_TARGETS as builtins

    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with target and candidate")
    unknown = set(body) - {"target", "candidate", "options", "key"}
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(sorted(unknown))}: a request has target, candidate, options, "
                         "key")
    target, candidate = body.get("target"), body.get("candidate")
    if not isinstance(target, str) or not target.strip():
        raise BadRequest("target must be a built-in name or KernelBench-style source (a non-empty string)")
    if not isinstance(candidate, str) or not candidate.strip():
        raise BadRequest("candidate must be the candidate's source (a non-empty string)")
    if len(target) > MAX_SOURCE or len(candidate) > MAX_SOURCE:
        raise BadRequest(f"target and candidate may have at most {MAX_SOURCE} characters each", status=413)
    if "\n" not in target.strip():
        if target.strip() not in builtins:
            raise BadRequest(f"unknown target {target.strip()!r}: not a built-in ({', '.join(builtins)}) "
                             "and not KernelBench-style source")
        target = target.strip()
    else:
        try:
            tree = ast.parse(target)
        except SyntaxError as e:
            raise BadRequest(f"the target's source does not parse: line {e.lineno}: {e.msg}") from None
        defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        missing = [name for name in ("Model", "get_inputs", "get_init_inputs") if name not in defined]
        if missing:
            raise BadRequest(f"the target's source defines no {', '.join(missing)}: a KernelBench-style target "
                             "defines Model, get_inputs() and get_init_inputs()")
    options = body.get("options") or {}
    if not isinstance(options, dict):
        raise BadRequest("options must be a JSON object")
    checked = {}
    for name, value in options.items():
        if name not in OPTION_RULES:
            raise BadRequest(f"unknown option {name!r}; options: {', '.join(OPTION_RULES)}")
        kind, low, high = OPTION_RULES[name]
        if kind is list:
            if not isinstance(value, list) or not all(v in BASELINES for v in value):
                raise BadRequest(f"option baselines must be a list drawn from {', '.join(BASELINES)}")
        elif kind is bool:
            if not isinstance(value, bool):
                raise BadRequest(f"option {name} must be true or false")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)) \
                or not low <= value <= high:
            raise BadRequest(f"option {name} must be a{'n integer' if kind is int else ' number'} from {low:g} to "
                             f"{high:g}")
        checked[name] = kind(value) if kind in (int, float) else value
    checked["time_limit_s"] = min(checked.get("time_limit_s", max_time_limit_s), max_time_limit_s)
    key = body.get("key")
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 200):
        raise BadRequest("key must be a string of 1 to 200 characters")
    return {"target": target, "candidate": candidate, "options": checked}, key


# -- workers: processes that own an evaluator Session ------------------------------------------------------------------

def evaluate_request(request: dict) -> dict:
    """The real evaluator, in a worker process: EvalResult.to_dict() of one request. A target that cannot be used
    raises tools.target.TargetError (the answer's error kind `target`)."""
    from sandbox.evaluate import EvalSettings, evaluate

    options = request.get("options") or {}
    fields = {k: v for k, v in options.items() if k in ("trials", "variant_trials", "timed_calls", "warmup_calls",
                                                          "ncu")}
    settings = EvalSettings(baselines=tuple(options.get("baselines") or ("eager",)), **fields)
    session = _worker_session()
    try:
        result = evaluate(_worker_target(request["target"]), request["candidate"], settings, session)
    except Exception:
        _close_worker_session()  # the next request gets a fresh one
        raise
    return result.to_dict()


def _warm() -> None:
    _worker_session()


evaluate_request.warm = _warm  # called once when a worker starts, so the first request finds warm processes
# called when the service closes the worker's connection (the worker runs as __main__: _WORKER here is another
# module's, so the close goes through the evaluator the worker imported)
evaluate_request.close = lambda: _close_worker_session()

_WORKER: dict = {"session": None, "targets": {}}
# Warm planners a GPU worker keeps ready: a request takes one (about 2 s of work on an H100) and a new one takes ~8 s
# to start beside it; with one spare, every other request waited for that start (2 s and 10 s in turn, measured).
# A CPU worker's cores are few, and each request there also takes an interpreter executor from the same pool.
GPU_WORKER_SPARES = 4


def _worker_session():
    if _WORKER["session"] is None:
        from sandbox.evaluate import Session
        from tools.inputs import DEVICE
        from agent.run import claim_scratch
        _WORKER["session"] = Session(spares=GPU_WORKER_SPARES if DEVICE.type == "cuda" else 1)
        claim_scratch(_WORKER["session"].directory)
    return _WORKER["session"]


def _close_worker_session() -> None:
    session, _WORKER["session"] = _WORKER["session"], None
    if session is not None:
        try:
            session.close()
        except Exception:
            pass


def _worker_target(spec: str):
    import hashlib

    from tools.target import Target, TargetError, check_reference, load_target, module_from_source

    key = hashlib.sha256(spec.encode()).hexdigest()
    if key not in _WORKER["targets"]:
        if "\n" not in spec.strip():
            target = load_target(spec)
        else:
            try:
                module = module_from_source(spec, {}, f"kloop_serve_{key[:12]}")
            except Exception as e:
                raise TargetError(f"the target failed to import: {type(e).__name__}: {e}".splitlines()[0]) from None
            target = Target(name=f"serve_{key[:8]}", path=Path("<serve>"), source=spec, module=module, builtin=False)
        check_reference(target)
        if len(_WORKER["targets"]) >= 64:
            _WORKER["targets"].clear()
        _WORKER["targets"][key] = target
    return _WORKER["targets"][key]


def _worker_main(conn, evaluator: str) -> None:
    """A worker process: requests in, answers out over `conn` (JSON), one at a time."""
    def send(message: dict) -> None:
        conn.send_bytes(json.dumps(message).encode())

    try:  # die with the service, even a SIGKILLed one (Linux)
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:
            os._exit(0)
    except Exception:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the service, which stops its workers
    try:
        fn = _import(evaluator)
        _reward_of({})  # imports what answers need before the first request
        if callable(getattr(fn, "warm", None)):
            fn.warm()
    except Exception as e:
        send({"fatal": f"{type(e).__name__}: {e}".splitlines()[0]})
        return
    send({"ready": True})
    while True:
        try:
            request = json.loads(conn.recv_bytes())
        except (EOFError, OSError):   # the service stopped: its session leaves nothing in the scratch root
            if callable(getattr(fn, "close", None)):
                fn.close()
            return
        try:
            result = fn(request)
            send({"result": result, **_reward_of(result)})
        except Exception as e:
            kind = "target" if type(e).__name__ == "TargetError" else "internal"
            message = f"{type(e).__name__}: {e}".splitlines()[0] if kind == "internal" else str(e).splitlines()[0]
            send({"error": {"kind": kind, "message": message[:2000]},
                       "traceback": traceback.format_exc()[-4000:] if kind == "internal" else None})


def _reward_of(result: dict) -> dict:
    from tools.records.reward import reward_components, scalar_reward
    from tools.result import EvalResult

    components = reward_components(EvalResult.from_dict(result))
    return {"components": components, "reward": scalar_reward(components)}


def _import(path: str):
    import importlib

    module, _, name = path.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{path} is not callable")
    return fn


class WorkerDied(Exception):
    pass


class Worker:
    """One worker process as the service sees it: started lazily, killed (with everything it started) on demand."""

    def __init__(self, name: str, evaluator: str, env: dict) -> None:
        self.name, self.evaluator, self.env = name, evaluator, env
        self.proc = None
        self.conn = None
        self.started = 0

    def ensure(self, timeout_s: float = 600) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        self.kill()
        ours, theirs = socket.socketpair()
        try:
            # a fresh interpreter (not multiprocessing's spawn, which would import the CLI as __main__ again)
            self.proc = subprocess.Popen([sys.executable, "-m", "agent.serve", "worker", str(theirs.fileno()),
                                          self.evaluator], pass_fds=(theirs.fileno(),), env={**os.environ, **self.env},
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            theirs.close()
        parent = Connection(ours.detach())
        self.conn = parent
        self.started += 1
        if not parent.poll(timeout_s):
            self.kill()
            raise WorkerDied(f"worker {self.name} did not start within {timeout_s:.0f} s")
        try:
            hello = json.loads(parent.recv_bytes())
        except (EOFError, OSError):
            self.kill()
            raise WorkerDied(f"worker {self.name} died while starting") from None
        if "fatal" in hello:
            self.kill()
            raise WorkerDied(f"worker {self.name} could not start: {hello['fatal']}")

    def run(self, request: dict, timeout_s: float) -> dict | None:
        """The worker's reply, or None when the time limit passed (the worker is killed). WorkerDied if it died."""
        try:
            self.conn.send_bytes(json.dumps(request).encode())
            if not self.conn.poll(timeout_s):
                self.kill()
                return None
            return json.loads(self.conn.recv_bytes())
        except (EOFError, OSError, BrokenPipeError):
            code = self.proc.poll() if self.proc is not None else None
            self.kill()
            raise WorkerDied(f"the worker process died (exit code {code})") from None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        killed = self.proc is not None and self.proc.poll() is None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # its jailed processes die with it (--die-with-parent, PR_SET_PDEATHSIG)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if killed:   # its session could not remove its scratch folder (plans; weights on a GPU): removed here
            from agent.run import clean_scratch

            clean_scratch()

    def close(self, timeout_s: float = 10) -> None:
        """Stop the worker as it would stop itself: its connection closes, it closes its evaluator session (the
        session's processes and scratch folder) and exits; killed if it has not within timeout_s (mid-request)."""
        if self.proc is not None and self.proc.poll() is None and self.conn is not None:
            self.conn.close()
            self.conn = None
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


# -- the service ---------------------------------------------------------------------------------------------------------

@dataclass
class ServiceConfig:
    db: str = DEFAULT_DB
    workers: int = 2
    gpus: list[str] | None = None       # one worker per GPU when given (CUDA_VISIBLE_DEVICES entries)
    max_queue: int = 64                 # requests waiting (not yet running) before 429
    time_limit_s: float = 600.0         # per request, from its start on a worker; a request may ask for less
    evaluator: str = "agent.serve:evaluate_request"
    token: str | None = None
    max_wait_s: float = 3600.0          # the longest a wait=true call blocks before answering with the status
    keep_done_s: float = KEEP_DONE_S
    worker_env: dict = field(default_factory=dict)


class Service:
    def __init__(self, config: ServiceConfig) -> None:
        self.config = config
        self.store = JobStore(config.db)
        if config.gpus:
            self.workers = [Worker(f"gpu-{g}", config.evaluator, {**config.worker_env, "CUDA_VISIBLE_DEVICES": str(g)})
                            for g in config.gpus]
        else:
            self.workers = [Worker(f"cpu-{i}", config.evaluator, dict(config.worker_env))
                            for i in range(config.workers)]
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._waiters: dict[str, list] = {}
        self._waiters_lock = threading.Lock()
        self._mean_eval_s = 1.0
        self._answered = 0
        self.started_at = time.time()
        self.requeued = 0
        self.log = lambda line: None   # one line per answered request (kloop serve: stdout)

    # lifecycle
    def start(self) -> None:
        self.requeued = self.store.requeue_running()
        self.store.prune(self.config.keep_done_s)
        for worker in self.workers:
            t = threading.Thread(target=self._dispatch, args=(worker,), name=f"kloop-dispatch-{worker.name}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        # An idle dispatch thread closes its worker on its way out (Worker.close: the session removes its scratch
        # folder); it must, as the worker dies with the thread that started it (PR_SET_PDEATHSIG). One still
        # mid-request is killed after that: the request runs again at the next start.
        for t in self._threads:
            t.join(12)
        for worker in self.workers:
            worker.kill()
        for t in self._threads:
            t.join(15)
        self.store.close()

    # requests
    def submit(self, body: object) -> tuple[str, bool]:
        request, key = check_request(body, self.config.time_limit_s)
        job_id, new = self.store.add(request, key, self.config.max_queue, self._retry_after)
        if new:
            with self._wake:
                self._wake.notify()
        return job_id, new

    def _retry_after(self, waiting: int) -> int:
        """Seconds until half the queue is answered: a client told to wait for all of it comes back to workers that
        have sat idle since the queue emptied (two H100 workers idled ~80 s per cycle that way under 200 clients)."""
        ahead = max(1, waiting - self.config.max_queue // 2)
        return int(min(300, max(1, math.ceil(ahead * self._mean_eval_s / max(1, len(self.workers))))))

    def answer(self, job_id: str) -> dict | None:
        row = self.store.get(job_id)
        if row is None:
            return None
        if row["state"] != "done":
            return {"id": job_id, "status": row["state"]}
        return {"id": job_id, "status": "done", **json.loads(row["response"])}

    async def wait(self, job_id: str, timeout_s: float) -> dict | None:
        """The answer once done, or its status after timeout_s."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        entry = (loop, event)
        with self._waiters_lock:
            self._waiters.setdefault(job_id, []).append(entry)
        try:
            answer = await loop.run_in_executor(None, self.answer, job_id)
            if answer is None or answer["status"] == "done":
                return answer
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
            return await loop.run_in_executor(None, self.answer, job_id)
        finally:
            with self._waiters_lock:
                entries = self._waiters.get(job_id)
                if entries and entry in entries:
                    entries.remove(entry)
                    if not entries:
                        del self._waiters[job_id]

    def _notify(self, job_id: str) -> None:
        with self._waiters_lock:
            entries = list(self._waiters.get(job_id, ()))
        for loop, event in entries:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop closed
                pass

    def health(self) -> dict:
        counts = self.store.counts()
        return {"status": "ok", "workers": len(self.workers), "workers_alive": sum(w.alive() for w in self.workers),
                "device": "cuda" if self.config.gpus else "cpu", "gpus": self.config.gpus,
                "queued": counts["queued"], "running": counts["running"], "answered": counts["done"],
                "max_queue": self.config.max_queue, "time_limit_s": self.config.time_limit_s,
                "uptime_s": round(time.time() - self.started_at, 1), "requeued_at_start": self.requeued}

    # workers
    def _dispatch(self, worker: Worker) -> None:
        try:
            self._serve(worker)
        finally:
            worker.close()

    def _serve(self, worker: Worker) -> None:
        try:  # start warm: the first request should not wait for torch, triton and the session's processes
            worker.ensure()
        except WorkerDied:
            pass  # tried again, and reported, with the first request
        while not self._stop.is_set():
            claimed = self.store.claim(worker.name)
            if claimed is None:
                with self._wake:
                    self._wake.wait(0.5)
                continue
            job_id, request, lease, runs = claimed
            started = time.perf_counter()
            if runs > MAX_RUNS:
                response = _error_answer("internal", f"the request was started {runs - 1} times and the service "
                                         "stopped each time before it finished; it is not run again")
            else:
                response = self._run(worker, request)
            if self._stop.is_set():
                return  # a stopping service leaves the request running: the next start runs it again
            took = time.perf_counter() - started
            self._mean_eval_s = 0.8 * self._mean_eval_s + 0.2 * took
            row = self.store.get(job_id)
            response.update(worker=worker.name, eval_s=round(took, 3),
                            queued_s=round(max(0.0, (row["started_at"] or 0) - row["created_at"]), 3) if row else None)
            if self.store.finish(job_id, lease, response):
                self.log(request_line(job_id, request, response))
                self._notify(job_id)
                self._answered += 1
                if self._answered % PRUNE_EVERY == 0:
                    self.store.prune(self.config.keep_done_s)

    def _run(self, worker: Worker, request: dict) -> dict:
        limit = float(request["options"].get("time_limit_s", self.config.time_limit_s))
        for attempt in (1, 2):  # a worker that dies is replaced and the request tried once more
            try:
                worker.ensure()
                reply = worker.run(request, limit)
            except WorkerDied as e:
                if self._stop.is_set():
                    return _error_answer("internal", "the service stopped")
                if attempt == 2:
                    return _error_answer("internal", str(e))
                continue
            if reply is None:
                return _timeout_answer(limit)
            if "error" in reply:
                return _error_answer(reply["error"]["kind"], reply["error"]["message"])
            return _result_answer(reply)
        raise AssertionError("unreachable")


def request_line(job_id: str, request: dict, response: dict) -> str:
    """An answered request in one log line: `<id> target vector_add: correct, reward 1.23, 2.1 s (queued 0.4 s) on
    cpu-0`; a target given as source is named by its first line."""
    target = request["target"].strip()
    name = target if "\n" not in target else f"source '{target.splitlines()[0][:40]}'"
    result = response.get("result") or {}
    outcome = (response.get("error") or {}).get("kind") if result.get("verdict") is None else result["verdict"]
    reward = f", reward {response['reward']:.3g}" if isinstance(response.get("reward"), (int, float)) else ""
    return (f"{job_id} target {name}: {outcome}{reward}, {response.get('eval_s', 0):.1f} s (queued "
            f"{response.get('queued_s') or 0:.1f} s) on {response.get('worker')}")


def _result_answer(reply: dict, error: dict | None = None) -> dict:
    return {"result": reply["result"], "components": reply["components"], "reward": reply["reward"], "error": error}


def _timeout_answer(limit: float) -> dict:
    from tools.result import EvalResult

    message = (f"the service's time limit of {limit:g} s per request was exceeded; the evaluation was stopped and "
               "everything it started was killed")
    result = EvalResult(verdict="timeout", reasons=[message]).to_dict()
    return {"result": result, **_reward_of(result), "error": {"kind": "time_limit", "message": message}}


def _error_answer(kind: str, message: str) -> dict:
    return {"result": None, "components": None, "reward": None, "error": {"kind": kind, "message": message}}


# -- HTTP ---------------------------------------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def make_app(service: Service):
    """The Starlette app over a started Service. Over 80 lines: its routes are closures of a few lines each over the
    service and its token, so the whole HTTP surface reads on one screen."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    token = service.config.token

    def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    def unauthorized() -> JSONResponse:
        return error(401, "missing or wrong bearer token (Authorization: Bearer <token>)",
                     {"WWW-Authenticate": "Bearer"})

    def flag(request: Request, name: str) -> bool:
        return request.query_params.get(name, "").lower() in ("1", "true", "yes")

    def wait_timeout(request: Request) -> float:
        try:
            value = float(request.query_params.get("timeout", service.config.max_wait_s))
        except ValueError:
            raise BadRequest("timeout must be a number of seconds") from None
        return min(max(value, 0.0), service.config.max_wait_s)

    async def evaluate(request: Request):
        if not authorized(request):
            return unauthorized()
        try:
            length = int(request.headers.get("content-length") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY:
            return error(413, f"the body is larger than {MAX_BODY} bytes")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return error(413, f"the body is larger than {MAX_BODY} bytes")
        try:
            parsed = json.loads(body)
        except (ValueError, RecursionError) as e:
            return error(400, f"the body is not JSON: {' '.join(str(e).split())}")
        try:
            timeout = wait_timeout(request)
            job_id, _ = await asyncio.get_running_loop().run_in_executor(None, service.submit, parsed)
        except BadRequest as e:
            return error(e.status, str(e))
        except QueueFull as e:
            return error(429, str(e), {"Retry-After": str(e.retry_after)})
        if flag(request, "wait"):
            answer = await service.wait(job_id, timeout)
            return JSONResponse(answer, status_code=200 if answer["status"] == "done" else 202)
        return JSONResponse({"id": job_id, "status": "queued"}, status_code=202)

    async def result(request: Request):
        if not authorized(request):
            return unauthorized()
        job_id = request.path_params["job_id"]
        try:
            timeout = wait_timeout(request)
        except BadRequest as e:
            return error(400, str(e))
        if flag(request, "wait"):
            answer = await service.wait(job_id, timeout)
        else:
            answer = await asyncio.get_running_loop().run_in_executor(None, service.answer, job_id)
        if answer is None:
            return error(404, f"no request {job_id!r} (unknown, or its answer was pruned)")
        return JSONResponse(answer, status_code=200 if answer["status"] == "done" else 202)

    async def health(request: Request):
        return JSONResponse(await asyncio.get_running_loop().run_in_executor(None, service.health))

    async def not_found(request: Request, exc):
        return error(exc.status_code, f"{exc.status_code}: {request.method} {request.url.path} is not part of the "
                     "API (POST /v1/evaluate, GET /v1/result/{id}, GET /v1/health)")

    return Starlette(routes=[Route("/v1/evaluate", evaluate, methods=["POST"]),
                             Route("/v1/result/{job_id}", result, methods=["GET"]),
                             Route("/v1/health", health, methods=["GET"])],
                     exception_handlers={404: not_found, 405: not_found})


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ServeError(f"cannot resolve --host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def check_config(host: str, config: ServiceConfig) -> None:
    """ServeError (one line) for a configuration the service refuses."""
    if not is_loopback(host) and not config.token:
        raise ServeError(f"--host {host} is not a loopback address: give a bearer token with --token T (or "
                         "KLOOP_SERVE_TOKEN) so that only holders of it can use the service")
    if config.token is not None and len(config.token) < 8:
        raise ServeError("--token must have at least 8 characters")
    if config.workers < 1:
        raise ServeError("--workers must be at least 1")
    if config.max_queue < 1:
        raise ServeError("--queue must be at least 1")
    if not config.time_limit_s > 0:
        raise ServeError("--time-limit must be more than 0 seconds")


def serve(host: str, port: int, config: ServiceConfig, announce=print) -> None:
    """Run until SIGINT/SIGTERM. ServeError (one line) when it cannot start."""
    import uvicorn

    check_config(host, config)
    sock = bind(host, port)
    try:
        service = Service(config)
    except sqlite3.Error as e:
        sock.close()
        raise ServeError(f"{config.db}: {e}") from None
    service.log = lambda line: announce(f"kloop serve: {line}")
    service.start()
    actual = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    where = f"GPUs {','.join(map(str, config.gpus))} (one worker each)" if config.gpus else \
        f"{len(service.workers)} CPU worker(s)"
    announce(f"kloop serve: listening on http://{shown}:{actual} ({where}, queue {config.max_queue}, time limit "
             f"{config.time_limit_s:g} s, {'bearer token required' if config.token else 'no token'}, db "
             f"{config.db}{f', {service.requeued} request(s) requeued' if service.requeued else ''})")
    server = uvicorn.Server(uvicorn.Config(make_app(service), log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=5, lifespan="off"))
    # uvicorn shuts down on SIGTERM, then raises the signal again under the handler it found: with the default one
    # the process died there, before its workers closed their sessions (their scratch folders stayed behind).
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminated) if on_main_thread else None
    try:
        server.run(sockets=[sock])
    except _Terminated:
        pass
    finally:
        service.stop()
        sock.close()
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(Exception):
    """SIGTERM reached the service once uvicorn had stopped: it stops its workers and returns."""


def _terminated(signum, frame) -> None:
    raise _Terminated()


if __name__ == "__main__":  # a worker: python -m agent.serve worker FD MODULE:FUNCTION
    if len(sys.argv) == 4 and sys.argv[1] == "worker":
        _worker_main(Connection(int(sys.argv[2])), sys.argv[3])
    else:
        sys.exit("usage: python -m agent.serve worker FD MODULE:FUNCTION (started by kloop serve)")
