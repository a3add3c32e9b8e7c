"""Suites: the loop on every problem of a KernelBench-style problem set, one run per problem (per strategy), all in
one run database, resumable; the report is tools/records/suite_report.py.

    >>> problems = discover(["kernelbench/KernelBench"], levels=[1])          # level1/*.py, in KernelBench order
    >>> plan = SuitePlan(problems, policy="offline", strategies=["refine"], max_attempts=4)
    >>> rows = run_suite(open_db("runs/kloop.db"), plan, on_event=print)      # one suite_problems row per item

Bookkeeping lives in two tables of the run database, beside runs/attempts/messages (plain SQL, like them):
- `suite_problems`: one row per (problem, source sha256, settings key): its status (running, done, skipped,
  failed, stopped), the reason where it was skipped or failed, its run, wall seconds. The settings key is a hash
  of what makes two runs comparable (policy, model, base URL, language, budget, strategy), so a problem finished
  with the same settings and the same source is skipped, and a changed budget or problem file runs anew;
- `suite_starters`: the offline policy's Inductor starters (agent/kernels/inductor.py), or the reason there is
  none, per problem source, device kind and torch version, kept for the generator's code that made them (a changed
  generator makes them again). They are generated `jobs` problems at a time, in
  parallel child processes, just before those problems run (never while a kernel is timed), so a suite stopped by
  its budget has results for its first problems, and a resumed suite reuses them (and runs the problems whose
  starters it kept before it generates the rest of their chunk). A straggling generation, or one that ran out of
  memory beside others, is generated again alone after the batch's other problems have run.

Lanes: with --gpus naming several GPUs, problems run side by side, one per GPU (each lane a thread with its own
evaluator session and database connection, taking the next chunk of problems when it is done with its own);
`lanes` sets their number (one GPU lane per GPU, or CPU lanes).

A problem's run is recorded as `running` before its loop starts, so after `kill -9` the next call resumes that run
(agent.run.resume: at most the attempt in flight is lost); Ctrl-C marks it `stopped` (resumed the same way) and
re-raises. A problem that cannot run (its reference fails, no starter, a file that is no KernelBench module) is
`skipped` with its one-line reason; a run that fails (RunFailed) is `failed` and tried again by the next call.
Neither stops the suite. Nothing here prints: progress goes to `on_event` as dicts (kinds: starter, starter_later,
problem, problem_done, and the loop's own events).
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import math
import os
import re
import statistics
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agent import run as runs
from tools.records.store import Store, now, open_db

PROBLEMS_TABLE = "suite_problems"
STARTERS_TABLE = "suite_starters"
DEFAULT_MAX_ATTEMPTS = 8
STRAGGLER_AFTER_S = 120.0   # prepare_starters: a generation running longer than this ...
STRAGGLER_FACTOR = 3.0      # ... and this many times the median of the half of the batch that is done: later, alone


class SuiteError(Exception):
    """Bad suite input (no such path, no problems, conflicting budgets): one line for the user."""


@dataclass(frozen=True)
class Problem:
    key: str            # level1/23_Softmax, or the file's stem outside a level folder
    path: Path
    level: int | None

    @property
    def name(self) -> str:
        return self.path.stem


@dataclass
class SuitePlan:
    """What to run: problems x strategies under one policy and one per-problem budget."""
    problems: list[Problem]
    policy: str = "offline"
    strategies: list[str] = field(default_factory=lambda: ["refine"])
    max_attempts: int | None = None
    minutes: float | None = None
    language: str = "auto"
    model: str | None = None
    base_url: str | None = None
    jobs: int = 1                       # parallel starter generations
    # torch.compile's mode for the compile baseline: "default", as KernelBench's published baselines, so fast_p over
    # torch.compile can be set beside published figures; max-autotune-no-cudagraphs is the stronger bar
    compile_mode: str = "default"
    evaluator: dict = field(default_factory=dict)  # gpus / ray / planners / pipeline (agent.run.evaluator_session)
    lanes: int | None = None            # problems run side by side (None: one per GPU of evaluator["gpus"], else 1)

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.minutes is not None:
            raise SuiteError("give --minutes-per-problem or --max-attempts, not both")
        if self.minutes is None and self.max_attempts is None:
            self.max_attempts = DEFAULT_MAX_ATTEMPTS
        if self.minutes is not None and not self.minutes > 0:
            raise SuiteError(f"--minutes-per-problem must be more than 0, got {self.minutes:g}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise SuiteError(f"--max-attempts must be at least 1, got {self.max_attempts}")
        from agent.strategies import STRATEGIES
        unknown = [s for s in self.strategies if s not in STRATEGIES]
        if unknown or not self.strategies:
            raise SuiteError(f"unknown strategy {unknown[0]!r} (one of {', '.join(STRATEGIES)})" if unknown
                             else "--strategy names no strategy")
        if len(set(self.strategies)) != len(self.strategies):
            raise SuiteError(f"--strategy repeats a strategy: {','.join(self.strategies)}")
        if self.jobs < 1:
            raise SuiteError(f"--jobs must be at least 1, got {self.jobs}")
        if self.lanes is not None and self.lanes < 1:
            raise SuiteError(f"--lanes must be at least 1, got {self.lanes}")

    def run_settings(self, problem: Problem, strategy: str, evaluator: dict | None = None) -> dict:
        """The run settings of one problem under one strategy (agent.run.settings_for, as every entry point). A
        fixed budget: no early stop on patience (a run still stops once its best reaches target_sol of speed of
        light); the strategy seed comes from the problem, so strategies compared on a problem, and a re-made run,
        draw alike. evaluator: the lane's (default: the plan's)."""
        attempts = self.max_attempts if self.max_attempts is not None else sys.maxsize
        seed = int(hashlib.sha256(problem.key.encode()).hexdigest()[:8], 16)
        return runs.settings_for(
            str(problem.path), max_attempts=attempts, hours=self.minutes / 60 if self.minutes else None,
            patience=attempts, language=self.language, model=self.model, base_url=self.base_url,
            **runs.strategy_settings(strategy, seed), **(self.evaluator if evaluator is None else evaluator),
            compile_mode=self.compile_mode,
            started_by="kloop suite", suite_problem=problem.key)

    def settings_key(self, strategy: str) -> str:
        """The hash of the settings that make two runs of a problem comparable: a problem finished with the same
        key (and source) is not run again."""
        values = {"policy": self.policy, "model": self.model, "base_url": self.base_url, "language": self.language,
                  "max_attempts": self.max_attempts, "hours": self.minutes / 60 if self.minutes else None,
                  "branches": 1, "strategy": strategy}
        if self.compile_mode != "max-autotune-no-cudagraphs":  # the mode of every suite before it was a setting:
            values["compile_mode"] = self.compile_mode         # their finished problems keep their keys
        return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self, strategy: str) -> dict:
        return {"policy": self.policy, "model": self.model, "base_url": self.base_url, "language": self.language,
                "max_attempts": self.max_attempts, "minutes_per_problem": self.minutes, "strategy": strategy,
                "compile_mode": self.compile_mode}

    def items(self) -> list[tuple[Problem, str]]:
        """(problem, strategy) in run order: each problem under every strategy before the next problem."""
        return [(p, s) for p in self.problems for s in self.strategies]

    def lane_evaluators(self) -> list[dict]:
        """The evaluator settings of each lane. Lanes run problems side by side, each with an evaluator of its own.
        With --gpus naming several GPUs (and no Ray) there is one lane per GPU by default: a problem's few attempts
        gain little from GPUs they share, while a suite gains a GPU's worth of problems from each. SuiteError for
        lanes that would time kernels side by side on one GPU."""
        spec = self.evaluator.get("gpus")
        ray = self.evaluator.get("ray")
        gpus = runs.gpu_indices(spec) if spec and not ray else None
        lanes = self.lanes if self.lanes is not None else len(gpus or [None])
        if lanes == 1:
            return [dict(self.evaluator)]
        if ray:
            raise SuiteError(f"--lanes {lanes} with --ray: a Ray session already spreads each problem over the "
                             "cluster; leave --lanes out")
        if gpus is not None:
            if lanes != len(gpus):
                raise SuiteError(f"--lanes {lanes} with --gpus {spec}: give one lane per GPU ({len(gpus)}), or 1 "
                                 "to spread each problem over them all")
            return [{**self.evaluator, "gpus": str(g)} for g in gpus]
        if runs.has_gpu():
            raise SuiteError(f"--lanes {lanes} on one GPU would time kernels side by side: give --gpus with "
                             f"{lanes} GPUs")
        return [dict(self.evaluator) for _ in range(lanes)]


def check_plan(plan: SuitePlan) -> None:
    """Refuse now what would fail every problem alike: an unknown policy or language, a misplaced setting, a model
    policy without its key or model (RunError / SuiteError, one line)."""
    if plan.policy not in ("offline", "anthropic", "openai"):
        raise SuiteError(f"a suite runs the offline, anthropic or openai policy, not {plan.policy!r}")
    settings = plan.run_settings(plan.problems[0], plan.strategies[0])
    runs.check_settings(plan.policy, settings)
    runs.check_evaluator(settings)
    plan.lane_evaluators()
    if plan.policy != "offline":
        runs.make_policy(plan.policy, settings, None, None)


# -- problems ---------------------------------------------------------------------------------------------------
_LEVEL = re.compile(r"^level(\d+)$")


def discover(paths: list[str | os.PathLike], levels: list[int] | None = None, pattern: str | None = None) \
        -> list[Problem]:
    """The problems under `paths`: a KernelBench checkout (PATH/level{N} or PATH/KernelBench/level{N}), any folder
    of KernelBench-style files (its *.py, not recursive), or single files. levels: only those levels (problems
    outside a level folder are left out when levels are given); pattern: comma-separated globs matched against
    the file name, its stem or the problem key (`23_*`, `*Softmax*`, `level1/4*`). In KernelBench's numeric
    order; each file once."""
    found: list[Problem] = []
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            found.append(_problem(path))
        elif path.is_dir():
            level_dirs = _level_dirs(path)
            if level_dirs:
                for number, folder in level_dirs:
                    if levels is None or number in levels:
                        found += [_problem(f, number) for f in _python_files(folder)]
            else:
                found += [_problem(f) for f in _python_files(path)]
        else:
            raise SuiteError(f"no such file or folder: {path}")
    if levels is not None:
        found = [p for p in found if p.level in levels]
    if pattern:
        globs = [g.strip() for g in pattern.split(",") if g.strip()]
        found = [p for p in found if any(fnmatch.fnmatch(name, g) for g in globs
                                         for name in (p.path.name, p.path.stem, p.key))]
    unique: dict[Path, Problem] = {}
    for p in found:
        unique.setdefault(p.path.resolve(), p)
    problems = sorted(unique.values(), key=lambda p: (p.level or 0, _number(p.path.stem), p.path.stem))
    if not problems:
        where = ", ".join(map(str, paths))
        what = " at level " + ",".join(map(str, levels)) if levels else ""
        raise SuiteError(f"no KernelBench-style problems{what} under {where}"
                         + (f" matching {pattern!r}" if pattern else ""))
    return problems


def _level_dirs(path: Path) -> list[tuple[int, Path]]:
    for base in (path, path / "KernelBench"):
        dirs = sorted((int(m.group(1)), d) for d in base.glob("level*") if d.is_dir()
                      and (m := _LEVEL.match(d.name)))
        if dirs:
            return dirs
    return []


def _python_files(folder: Path) -> list[Path]:
    return [f for f in folder.glob("*.py") if f.is_file() and not f.name.startswith("_")]


def _problem(path: Path, level: int | None = None) -> Problem:
    if level is None and (m := _LEVEL.match(path.parent.name)):
        level = int(m.group(1))
    return Problem(f"level{level}/{path.stem}" if level is not None else path.stem, path.resolve(), level)


def _number(stem: str) -> int:
    m = re.match(r"(\d+)", stem)
    return int(m.group(1)) if m else sys.maxsize


def source_sha256(path: Path) -> str:
    """As tools.target.Target.sha256: of the file's text."""
    return hashlib.sha256(path.read_text().encode()).hexdigest()


# -- bookkeeping ------------------------------------------------------------------------------------------------
def ensure_tables(store: Store) -> None:
    db = store.db
    with store.transaction():
        if PROBLEMS_TABLE not in db.table_names():
            db[PROBLEMS_TABLE].create({
                "id": int, "settings_key": str, "settings": str, "problem": str, "path": str, "level": int,
                "target_sha256": str, "strategy": str, "policy": str, "status": str, "reason": str, "run_id": str,
                "started_at": str, "finished_at": str, "seconds": float}, pk="id")
            db[PROBLEMS_TABLE].create_index(["settings_key", "problem", "target_sha256"], unique=True)
        if STARTERS_TABLE not in db.table_names():
            db[STARTERS_TABLE].create({"target_sha256": str, "device": str, "torch": str, "starter": str,
                                       "error": str, "seconds": float, "created_at": str, "generator": str},
                                      pk=("target_sha256", "device", "torch"))
        elif "generator" not in db[STARTERS_TABLE].columns_dict:   # a database from before: its starters are stale
            db[STARTERS_TABLE].add_column("generator", str)


def problem_row(store: Store, settings_key: str, problem: Problem, sha: str) -> dict | None:
    rows = list(store.db.query(f"SELECT * FROM {PROBLEMS_TABLE} WHERE settings_key = ? AND problem = ? AND "
                               "target_sha256 = ?", [settings_key, problem.key, sha]))
    return rows[0] if rows else None


def record(store: Store, plan: SuitePlan, problem: Problem, strategy: str, sha: str, **columns: Any) -> None:
    """Insert or update the row of (problem, settings) with `columns`."""
    key = plan.settings_key(strategy)
    with store.transaction():
        existing = problem_row(store, key, problem, sha)
        if existing is None:
            store.db[PROBLEMS_TABLE].insert({
                "settings_key": key, "settings": json.dumps(plan.describe(strategy), sort_keys=True),
                "problem": problem.key, "path": str(problem.path), "level": problem.level, "target_sha256": sha,
                "strategy": strategy, "policy": plan.policy, "started_at": now(), **columns})
        else:
            store.db[PROBLEMS_TABLE].update(existing["id"], columns)


def rows_of(store: Store, plan: SuitePlan) -> list[dict]:
    """The plan's rows in its order (a problem not reached yet has status None)."""
    out = []
    for problem, strategy in plan.items():
        row = problem_row(store, plan.settings_key(strategy), problem, source_sha256(problem.path)) \
            if problem.path.is_file() else None
        out.append(row or {"problem": problem.key, "path": str(problem.path), "level": problem.level,
                           "strategy": strategy, "policy": plan.policy, "status": None, "reason": None,
                           "run_id": None, "seconds": None, "settings_key": plan.settings_key(strategy)})
    return out


# -- starters ---------------------------------------------------------------------------------------------------
def device_kind() -> tuple[str, str]:
    """(device, torch version) a starter is generated for: Inductor's GPU Triton on a CUDA machine, its CPU
    Triton at the CPU sizes otherwise."""
    import torch

    return ("cuda" if runs.has_gpu() else "cpu-small"), torch.__version__


# The modules whose code makes a starter: a starter another version of them made is made again.
GENERATOR_MODULES = ("inductor.py", "inductor_conv.py", "inductor_gemm.py", "inductor_rnn.py", "starter_tune.py")


@functools.cache
def generator_version() -> str:
    """A hash of the starter generator's source (GENERATOR_MODULES, agent/kernels/)."""
    folder = Path(__file__).parent / "kernels"
    digest = hashlib.sha256()
    for name in GENERATOR_MODULES:
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]


def cached_starter(store: Store, sha: str) -> dict | None:
    device, torch_version = device_kind()
    rows = list(store.db.query(f"SELECT * FROM {STARTERS_TABLE} WHERE target_sha256 = ? AND device = ? AND "
                               "torch = ? AND generator = ?", [sha, device, torch_version, generator_version()]))
    if not rows:
        return None
    row = rows[0]
    return {"starter": json.loads(row["starter"]) if row["starter"] else None, "error": row["error"],
            "seconds": row["seconds"]}


GENERATION_MEMORY_SHARE = 0.8   # of the GPU memory free when a batch of starters begins
GENERATION_CONTEXT_BYTES = 1 << 30


def generation_memory(gpu: int | None = None) -> int | None:
    """GPU memory the starter generations may hold at once (on GPU index `gpu`, default this process's); None
    without a GPU."""
    if not runs.has_gpu():
        return None
    import torch

    return int(torch.cuda.mem_get_info(gpu)[0] * GENERATION_MEMORY_SHARE)


def generation_bytes(problem: Problem) -> int:
    """GPU memory one full-size generation holds: its CUDA context, the reference's inputs and outputs three times
    (the eager run, the compiled one, Inductor's buffers) and its weights (counted on the meta device)."""
    from tools.target import TargetError, load_target

    try:
        target = load_target(str(problem.path))
        return GENERATION_CONTEXT_BYTES + 3 * target.io_bytes(False) + target.state_bytes(False)
    except TargetError:  # its generation fails before it holds much
        return GENERATION_CONTEXT_BYTES


def starter_needed(store: Store, plan: SuitePlan, problem: Problem, strategy: str) -> str | None:
    """The problem's source sha256 where its offline run is still to come and no starter (or reason for none) is
    kept for that source; None otherwise."""
    if plan.policy != "offline" or not problem.path.is_file():
        return None
    sha = source_sha256(problem.path)
    row = problem_row(store, plan.settings_key(strategy), problem, sha)
    if (row is None or row["status"] not in ("done", "skipped")) and cached_starter(store, sha) is None:
        return sha
    return None


def prepare_starters(store: Store, plan: SuitePlan, on_event: Callable[[dict], None],
                     items: list[tuple[Problem, str]] | None = None, gpu: int | None = None) \
        -> list[tuple[Problem, str]]:
    """Generate the Inductor starters that `items` (default: the whole plan) still need for offline runs,
    `plan.jobs` at a time (each in its own child process), and keep each, or its reason, in suite_starters as it
    arrives. On a GPU, generations side by side hold at most GENERATION_MEMORY_SHARE of its free memory (each its
    reference's full-size inputs and outputs, three times, and weights): a level-1 ReLU moves 12.8 GB, and five at
    once ran out of memory, to be generated again one at a time. gpu: the index of the GPU to generate on (a
    lane's; default this process's).

    Returns the items left for later, to be generated again alone (a call with that item alone): generations that
    ran out of memory beside others, and stragglers. A straggler, once at least half the batch is done, has run
    longer than STRAGGLER_AFTER_S and STRAGGLER_FACTOR times their median (counted from when it got its memory): it
    is killed, so that one slow or stuck generation (KernelBench level 2's 23 never came back beside seven others)
    does not hold up the problems whose starters are ready."""
    items = plan.items() if items is None else items
    todo: dict[str, Problem] = {}
    for problem, strategy in items:
        if (sha := starter_needed(store, plan, problem, strategy)) is not None:
            todo.setdefault(sha, problem)
    if not todo:
        return []
    from agent.kernels import inductor

    device, torch_version = device_kind()
    total, done = len(todo), 0

    from sandbox.pipeline import MemoryGate

    gate = MemoryGate(generation_memory(gpu))
    visible = None if gpu is None else runs.gpu_list(str(gpu))[0]
    give_up = {sha: threading.Event() for sha in todo}
    started: dict[str, float] = {}   # when each generation got its memory and began

    def one(sha: str, problem: Problem) -> tuple[str, Problem, dict | None, Exception | None, float]:
        need = 0 if gate.budget is None else min(gate.budget, generation_bytes(problem))
        gate.take(need)
        began = started[sha] = time.monotonic()
        try:
            return sha, problem, inductor.generate(str(problem.path), visible=visible,
                                                   give_up=give_up[sha]).to_dict(), None, time.monotonic() - began
        except inductor.NoStarter as e:
            return sha, problem, None, e, time.monotonic() - began
        finally:
            gate.give(need)

    def keep(result) -> None:
        nonlocal done
        sha, problem, starter, error, seconds = result
        done += 1
        event = {"kind": "starter", "problem": problem.key, "done": done, "total": total, "ok": starter is not None,
                 "error": str(error) if error else None, "seconds": seconds}
        if not isinstance(error, inductor.GenerationStopped):  # a killed one is generated again next time
            with store.transaction():
                store.db[STARTERS_TABLE].upsert({"target_sha256": sha, "device": device, "torch": torch_version,
                                                 "starter": json.dumps(starter) if starter else None,
                                                 "error": event["error"], "seconds": seconds, "created_at": now(),
                                                 "generator": generator_version()},
                                                pk=("target_sha256", "device", "torch"))
        on_event(event)

    later: set[str] = set()
    pool = ThreadPoolExecutor(max_workers=plan.jobs)
    took = []
    try:
        pending = {pool.submit(one, sha, problem): sha for sha, problem in todo.items()}
        while pending:
            finished, _ = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for future in finished:
                sha, problem, _, error, seconds = result = future.result()
                del pending[future]
                straggler = isinstance(error, inductor.GenerationStopped) and give_up[sha].is_set()
                if straggler or (len(todo) > 1 and error and "out of memory" in str(error).lower()):
                    later.add(sha)
                    on_event({"kind": "starter_later", "problem": problem.key, "seconds": seconds,
                              "why": "a straggler" if straggler else "out of memory beside others"})
                else:
                    took.append(seconds)
                    keep(result)
            if pending and 2 * len(took) >= len(todo):
                limit = max(STRAGGLER_AFTER_S, STRAGGLER_FACTOR * statistics.median(took))
                for sha in pending.values():
                    if time.monotonic() - started.get(sha, math.inf) > limit:   # waiting for memory is no lag
                        give_up[sha].set()
        pool.shutdown(wait=True)
    except KeyboardInterrupt:  # what was generated is kept; the rest is generated by the next call
        pool.shutdown(wait=False, cancel_futures=True)
        inductor.stop_generating()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [(problem, strategy) for problem, strategy in items
            if problem.path.is_file() and source_sha256(problem.path) in later]


# -- the suite --------------------------------------------------------------------------------------------------
def run_suite(store: Store, plan: SuitePlan, on_event: Callable[[dict], None] = lambda event: None,
              session=None) -> list[dict]:
    """Every (problem, strategy) of the plan not yet finished with the same settings, in plan order, by one lane or
    several side by side (plan.lane_evaluators; `session`: one lane in that evaluator); returns the plan's rows
    (rows_of). Ctrl-C: the problems in flight are marked stopped and KeyboardInterrupt re-raised."""
    ensure_tables(store)
    work = _Work(plan.items(), plan.jobs)
    lanes = [dict(plan.evaluator)] if session is not None else plan.lane_evaluators()
    if len(lanes) == 1:
        _lane(store, plan, on_event, work, lanes[0], session, _lane_gpu(lanes[0]))
    else:
        _run_lanes(store, plan, on_event, work, lanes)
    return rows_of(store, plan)


def _lane_gpu(evaluator: dict) -> int | None:
    """The GPU a lane with one GPU generates its starters on (None: this process's)."""
    spec = evaluator.get("gpus")
    gpus = runs.gpu_indices(spec) if spec and not evaluator.get("ray") else None
    return gpus[0] if gpus and len(gpus) == 1 else None


class _Work:
    """The plan's items in chunks of `jobs` (their starters are generated together), handed out in plan order."""

    def __init__(self, items: list[tuple[Problem, str]], jobs: int) -> None:
        self.total = len(items)
        self._chunks = iter([(i, items[i:i + jobs]) for i in range(0, len(items), jobs)])
        self._lock = threading.Lock()

    def next_chunk(self) -> tuple[int, list[tuple[Problem, str]]] | None:
        with self._lock:
            return next(self._chunks, None)


def _lane(store: Store, plan: SuitePlan, on_event: Callable[[dict], None], work: _Work, evaluator: dict,
          session=None, gpu: int | None = None, tag: bool = False) -> None:
    """Chunks until none is left: a chunk's problems one after another, in one evaluator session (its planners,
    executors and referees stay warm across problems). First those that need no starter generated (kept by an
    earlier call that was stopped while it generated this chunk's); then the others' starters side by side (on
    `gpu`), and those problems, the ones whose starter was left for later last, each after its starter is
    generated alone. tag: the loop's events carry their problem (lanes side by side interleave them)."""
    own = session is None
    if own:
        first = plan.items()[0]
        session = runs.evaluator_session(plan.run_settings(*first, evaluator))

    def run_one(index: int, problem: Problem, strategy: str) -> None:
        on_event({"kind": "problem", "index": index, "total": work.total, "problem": problem.key,
                  "strategy": strategy, **tally(store, rows_of(store, plan))})
        events = (lambda event, key=problem.key: on_event({**event, "problem": key})) if tag else on_event
        row = _run_problem(store, plan, problem, strategy, events, session, evaluator)
        on_event({"kind": "problem_done", "index": index, "total": work.total, "problem": problem.key,
                  "strategy": strategy, "status": row["status"], "reason": row.get("reason"),
                  "best": _best_of(store, row.get("run_id")), **tally(store, rows_of(store, plan))})

    try:
        while (chunk := work.next_chunk()) is not None:
            begin, items = chunk
            waiting = [pair for pair in enumerate(items, begin) if starter_needed(store, plan, *pair[1])]
            for index, (problem, strategy) in enumerate(items, begin):
                if (index, (problem, strategy)) not in waiting:
                    run_one(index, problem, strategy)
            if not waiting:
                continue
            # starters just before their problems run: a suite stopped by its budget has run problems rather than
            # only generated starters for all of them
            later = prepare_starters(store, plan, on_event, [item for _, item in waiting], gpu)
            for index, (problem, strategy) in sorted(waiting, key=lambda pair: pair[1] in later):
                if (problem, strategy) in later:  # its starter again, alone on the GPU (nothing is timed meanwhile)
                    prepare_starters(store, plan, on_event, [(problem, strategy)], gpu)
                run_one(index, problem, strategy)
    finally:
        if own:
            session.close()


def _run_lanes(store: Store, plan: SuitePlan, on_event: Callable[[dict], None], work: _Work,
               lanes: list[dict]) -> None:
    """Lanes side by side, each a thread with its own database connection and evaluator session (on GPU lanes, its
    own GPU for timing and starters). Ctrl-C, or a lane's error: every lane's next event raises KeyboardInterrupt
    in it, which marks its problem in flight stopped as one lane would; then the interrupt (or the error) is
    raised here."""
    from agent.kernels import inductor

    stopping, lock, errors = threading.Event(), threading.Lock(), []

    def stop() -> None:
        stopping.set()
        inductor.stop_generating()  # lanes generating starters reach their next event now

    def events(event: dict) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt
        with lock:  # one renderer, events whole
            on_event(event)

    def lane(evaluator: dict) -> None:
        own = open_db(store.path)
        try:
            _lane(own, plan, events, work, evaluator, gpu=_lane_gpu(evaluator), tag=True)
        except KeyboardInterrupt:
            pass
        except BaseException as e:
            errors.append(e)
            stop()
        finally:
            own.close()

    threads = [threading.Thread(target=lane, args=(evaluator,), name=f"kloop-suite-lane-{i}", daemon=True)
               for i, evaluator in enumerate(lanes)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)
    except KeyboardInterrupt:
        stop()
        for thread in threads:
            thread.join()
        raise
    if errors:
        raise errors[0]


def _run_problem(store: Store, plan: SuitePlan, problem: Problem, strategy: str,
                 on_event: Callable[[dict], None], session, evaluator: dict | None = None) -> dict:
    """One problem under one strategy: skipped if finished before, resumed if its run was cut off, else started."""
    if not problem.path.is_file():
        return {"status": "skipped", "reason": f"{problem.path} is gone"}
    sha = source_sha256(problem.path)
    key = plan.settings_key(strategy)
    row = problem_row(store, key, problem, sha)
    if row is not None and row["status"] in ("done", "skipped"):
        return row
    spent = (row or {}).get("seconds") or 0.0
    try:
        r = _resume(store, row) if row is not None and row.get("run_id") else None
        if r is None:
            r = _start(store, plan, problem, strategy, sha, evaluator)
    except runs.RunFinished:
        record(store, plan, problem, strategy, sha, status="done", finished_at=now())
        return problem_row(store, key, problem, sha)
    except runs.RunError as e:
        record(store, plan, problem, strategy, sha, status="skipped", reason=str(e), finished_at=now())
        return problem_row(store, key, problem, sha)
    record(store, plan, problem, strategy, sha, status="running", run_id=r.id, reason=None)
    began = time.monotonic()
    try:
        runs.run(r, on_event, session=session)
    except KeyboardInterrupt:
        record(store, plan, problem, strategy, sha, status="stopped", seconds=spent + time.monotonic() - began)
        raise
    except runs.RunFailed as e:
        record(store, plan, problem, strategy, sha, status="failed", reason=str(e),
               seconds=spent + time.monotonic() - began, finished_at=now())
        return problem_row(store, key, problem, sha)
    except Exception as e:  # the evaluator or the loop broke on this problem: recorded, the suite goes on
        message = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        record(store, plan, problem, strategy, sha, status="failed", reason=message,
               seconds=spent + time.monotonic() - began, finished_at=now())
        return problem_row(store, key, problem, sha)
    record(store, plan, problem, strategy, sha, status="done", seconds=spent + time.monotonic() - began,
           finished_at=now())
    return problem_row(store, key, problem, sha)


def _resume(store: Store, row: dict):
    """The problem's run, to continue; None where it cannot be (it is gone, or its target changed)."""
    try:
        return runs.resume(store, row["run_id"])
    except runs.RunFinished:
        raise
    except runs.RunError:
        return None


def _start(store: Store, plan: SuitePlan, problem: Problem, strategy: str, sha: str, evaluator: dict | None = None):
    settings = plan.run_settings(problem, strategy, evaluator)
    runs.check_settings(plan.policy, settings)
    target = runs.load_target(str(problem.path))
    if plan.policy == "offline":
        from agent.policies.offline import no_starter_message
        cached = cached_starter(store, sha)
        if cached is not None and cached["starter"] is None:
            raise runs.RunError(no_starter_message(target.name, cached["error"]))
        if cached is not None:
            settings["inductor_starter"] = cached["starter"]
    return runs.start(store, plan.policy, settings, target=target)


def _best_of(store: Store, run_id: str | None) -> dict | None:
    if not run_id:
        return None
    best = store.best_attempt(run_id)
    if best is None:
        return None
    return {"number": best["number"], "speedup_eager": best["speedup_eager"],
            "speedup_compile": best["speedup_compile"], "sol_fraction": best["sol_fraction"],
            "timed": bool((best.get("time_us") or {}).get("median"))}


def tally(store: Store, rows: list[dict]) -> dict:
    """Progress so far over the plan's rows (tools.records.suite_report's definitions): finished and left, verified, fast_1
    over eager and over torch.compile (None while nothing was timed)."""
    from tools.records.suite_report import collect, summarize

    s = summarize(collect(store, rows))
    return {"done": s["finished"], "left": s["problems"] - s["finished"], "verified": s["verified"],
            "timed": s["timing_is_real"], "fast_1_eager": s["fast_p_counts"]["eager"]["1"],
            "fast_1_compile": s["fast_p_counts"]["compile"]["1"]}
