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
  generator makes them again).

Starters (StarterPool) come first from the starter cache on disk (agent/kernels/starter_cache.py: per source, GPU
architecture, torch and Triton versions and generator code, shared by every suite and database), so a second suite
over the same problems generates none. The others are generated in the background, `jobs` at a time per lane in
warm child processes (agent/kernels/warm_generator.py), in plan order, while lanes run the problems whose starters
have arrived (a generating child on a GPU is stopped while a lane times a kernel there); a suite stopped by its
budget keeps what was generated, in the cache.

Lanes: with --gpus naming several GPUs, problems run side by side, one per GPU (each lane a thread with its own
evaluator session and database connection, taking the next problem whose starter is ready when it is done with
its own); `lanes` sets their number (one GPU lane per GPU, or CPU lanes). A lane with nothing left to take lends
its GPU to a lane still running, so the last problems' attempts spread over every GPU (_Lending).

A problem's run is recorded as `running` before its loop starts, so after `kill -9` the next call resumes that run
(agent.run.resume: at most the attempt in flight is lost); Ctrl-C marks it `stopped` (resumed the same way) and
re-raises. A problem that cannot run (its reference fails, no starter, a file that is no KernelBench module) is
`skipped` with its one-line reason (one skipped for want of a starter runs again once the starter generator,
the device kind or torch changed); a run that fails (RunFailed) is `failed` and tried again by the next call, as is
a reference that ran out of GPU memory, which its lane also takes again once after the others.
Neither stops the suite. Nothing here prints: progress goes to `on_event` as dicts (kinds: starters (cache hits
and misses), starter, starter_later, problem, problem_done, and the loop's own events).
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import re
import sqlite3
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agent import run as runs
from sandbox import placement
from tools.records.store import Store, now, open_db

PROBLEMS_TABLE = "suite_problems"
STARTERS_TABLE = "suite_starters"
DEFAULT_MAX_ATTEMPTS = 8


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
    starter_cache: str | None = None    # folder of the starter cache (None: agent.kernels.starter_cache's default)
    # globs of problems to run again even where finished before this plan was made (--rerun: after a fix); their
    # earlier runs stay in the database
    rerun: str | None = None
    # seconds one starter generation may take (None: agent.kernels.inductor.TIMEOUT_S, 300): level 3's whole networks
    # take longer beside other generations; a problem whose generation ran out of a shorter limit is tried again
    starter_timeout_s: float | None = None
    made_at: str = field(default_factory=now)

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.minutes is not None:
            raise SuiteError("give --minutes-per-problem or --max-attempts, not both")
        if self.minutes is None and self.max_attempts is None:
            self.max_attempts = DEFAULT_MAX_ATTEMPTS
        if self.minutes is not None and not self.minutes > 0:
            raise SuiteError(f"--minutes-per-problem must be more than 0, got {self.minutes:g}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise SuiteError(f"--max-attempts must be at least 1, got {self.max_attempts}")
        if not self.strategies:
            raise SuiteError("--strategy names no strategy")
        for strategy in self.strategies:
            try:
                runs.check_strategy(strategy)
            except runs.RunError as e:
                raise SuiteError(str(e)) from None
        if len(set(self.strategies)) != len(self.strategies):
            raise SuiteError(f"--strategy repeats a strategy: {','.join(self.strategies)}")
        if self.jobs < 1:
            raise SuiteError(f"--jobs must be at least 1, got {self.jobs}")
        if self.lanes is not None and self.lanes < 1:
            raise SuiteError(f"--lanes must be at least 1, got {self.lanes}")
        if self.starter_timeout_s is not None and not self.starter_timeout_s > 0:
            raise SuiteError(f"--starter-timeout must be more than 0 seconds, got {self.starter_timeout_s:g}")

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

    def runs_again(self, problem: Problem, row: dict | None) -> bool:
        """Whether --rerun names the problem and its row finished before this plan was made (a rerun cut off and
        resumed is not started over)."""
        return bool(self.rerun and row is not None and row.get("finished_at") and row["finished_at"] < self.made_at
                    and matches(problem, self.rerun))

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
        gpus = placement.gpu_indices(spec) if spec and not ray else None
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
        if placement.has_gpu():
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
    if plan.policy == "offline" and plan.starter_cache is not None:
        folder = Path(plan.starter_cache)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SuiteError(f"--starter-cache {folder}: cannot make the folder ({e.strerror})") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise SuiteError(f"--starter-cache {folder}: the folder is not writable")
    if plan.policy != "offline":
        runs.make_policy(plan.policy, settings, None, None)


# -- problems ---------------------------------------------------------------------------------------------------
_LEVEL = re.compile(r"^level(\d+)$")


def matches(problem: Problem, pattern: str) -> bool:
    """Whether one of the comma-separated globs matches the problem's file name, stem or key."""
    globs = [g.strip() for g in pattern.split(",") if g.strip()]
    return any(fnmatch.fnmatch(name, g) for g in globs for name in (problem.path.name, problem.path.stem, problem.key))


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
        found = [p for p in found if matches(p, pattern)]
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


def other_settings_note(store: Store, plan: SuitePlan) -> str | None:
    """One line where the database finished some of the plan's problems under other settings and these settings have
    not: a changed --max-attempts (policy, strategy, ...) starts a suite of its own, which runs them all anew (a
    level-1 rerun given 3 attempts where its database had 2 ran 32 problems again). None where there is nothing to
    say."""
    mine = {plan.settings_key(strategy) for strategy in plan.strategies}
    keys = {problem.key for problem in plan.problems}
    rows = [r for r in store.db.query(f"SELECT problem, settings_key, settings FROM {PROBLEMS_TABLE} "
                                      "WHERE status IN ('done', 'skipped')") if r["problem"] in keys]
    finished_here = {r["problem"] for r in rows if r["settings_key"] in mine}
    others: dict[str, set] = {}
    for r in rows:
        if r["settings_key"] not in mine and r["problem"] not in finished_here:
            others.setdefault(r["settings"], set()).add(r["problem"])
    if not others:
        return None
    settings, problems = max(others.items(), key=lambda item: len(item[1]))
    theirs, ours = json.loads(settings), plan.describe(plan.strategies[0])
    differ = [name for name in sorted(set(theirs) | set(ours)) if theirs.get(name) != ours.get(name)]

    def show(values: dict) -> str:
        return ", ".join(f"{name} {values.get(name)}" for name in differ)
    return (f"{len(problems)} of these problems finished in this database under other settings ({show(theirs)}); "
            f"with these ({show(ours)}) they run anew: give the same settings to continue that suite")


# -- starters ---------------------------------------------------------------------------------------------------
def device_kind() -> tuple[str, str]:
    """(device, torch version) a starter is generated for: Inductor's GPU Triton on a CUDA machine, its CPU
    Triton at the CPU sizes otherwise."""
    import torch

    return ("cuda" if placement.has_gpu() else "cpu-small"), torch.__version__


# The modules whose code makes a starter: a starter another version of them made is made again.
# warm_generator.py among them: how a warm child is retried decides whether a failure is the problem's or the child's
GENERATOR_MODULES = ("inductor.py", "inductor_conv.py", "inductor_gemm.py", "inductor_rnn.py", "starter_tune.py",
                     "warm_generator.py")


@functools.cache
def generator_version() -> str:
    """A hash of the starter generator's source (GENERATOR_MODULES, agent/kernels/)."""
    folder = Path(__file__).parent / "kernels"
    digest = hashlib.sha256()
    for name in GENERATOR_MODULES:
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def starter_device() -> str:
    """The device a starter is made for, as the starter cache keys it: the GPU's architecture ("sm_90"; a suite's
    GPUs are of one kind), or "cpu-small" (Inductor's CPU Triton at the CPU sizes)."""
    if not placement.has_gpu():
        return "cpu-small"
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def cache_key(sha: str) -> dict:
    """The starter cache's key of a problem source on this machine (agent/kernels/starter_cache.py)."""
    import torch
    import triton

    from agent.kernels.starter_cache import starter_key

    return starter_key(sha, starter_device(), torch.__version__, triton.__version__, generator_version())


# Reasons that tell of the machine at the time, not of the problem: kept in the suite's database, not in the cache
TRANSIENT_ERRORS = ("out of memory", "did not finish")


def cached_starter(store: Store, sha: str, timeout_s: float | None = None) -> dict | None:
    """The run database's starter entry for a source on this device kind, torch and generator; None where there is
    none, or its generation ran out of time and timeout_s allows more than it had."""
    from agent.kernels.inductor import NoStarter

    device, torch_version = device_kind()
    rows = list(store.db.query(f"SELECT * FROM {STARTERS_TABLE} WHERE target_sha256 = ? AND device = ? AND "
                               "torch = ? AND generator = ?", [sha, device, torch_version, generator_version()]))
    if not rows:
        return None
    row = rows[0]
    if timeout_s is not None and row["starter"] is None and NoStarter(row["error"] or "").kind == "timeout" \
            and (row["seconds"] or 0.0) < timeout_s:
        return None
    return {"starter": json.loads(row["starter"]) if row["starter"] else None, "error": row["error"],
            "seconds": row["seconds"]}


def keep_starter(store: Store, sha: str, entry: dict) -> None:
    """A starter (or the reason there is none) in the run database, where the problem's run reads it."""
    device, torch_version = device_kind()
    with store.transaction():
        store.db[STARTERS_TABLE].upsert({"target_sha256": sha, "device": device, "torch": torch_version,
                                         "starter": json.dumps(entry["starter"]) if entry["starter"] else None,
                                         "error": entry["error"], "seconds": entry["seconds"], "created_at": now(),
                                         "generator": generator_version()},
                                        pk=("target_sha256", "device", "torch"))


# of the GPU memory free when a suite begins: generations run beside the lanes' planners (PLANNER_MEMORY_SHARE) and
# trusted processes
GENERATION_MEMORY_SHARE = 0.4
GENERATION_CONTEXT_BYTES = 1 << 30


def generation_memory(gpu: int | None = None) -> int | None:
    """GPU memory the starter generations may hold at once (on GPU index `gpu`, default this process's); None
    without a GPU."""
    if not placement.has_gpu():
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
    timeout_s = plan.starter_timeout_s
    if (not finished(store, row, timeout_s) or plan.runs_again(problem, row)) and \
            cached_starter(store, sha, timeout_s) is None:
        return sha
    return None


def finished(store: Store, row: dict | None, starter_timeout_s: float | None = None) -> bool:
    """Whether a problem's row needs no more work: done, or skipped for a reason that still holds. A problem skipped
    for want of a starter runs again once that verdict is no longer current (the generator, the device kind or torch
    changed, or its generation ran out of time and starter_timeout_s allows more): a fixed generator retries what it
    could not start."""
    from agent.policies.offline import NO_STARTER_PREFIX

    if row is None or row["status"] not in ("done", "skipped"):
        return False
    if row["status"] == "skipped" and (row["reason"] or "").startswith(NO_STARTER_PREFIX):
        cached = cached_starter(store, row["target_sha256"], starter_timeout_s)
        return cached is not None and cached["starter"] is None
    return True


class StarterPool:
    """The offline policy's Inductor starters for a suite's items, made while lanes run the problems whose starters
    are ready. Each comes from the starter cache (agent/kernels/starter_cache.py) where it is there: no generation;
    the others are generated in the background, in plan order, by `plan.jobs` threads per lane (`gpus`: each lane's
    GPU, the threads spread over them), each driving a warm generating child of its own
    (agent/kernels/warm_generator.py: the imports and Inductor's set-up paid once), each starter kept in the cache and
    in the run database as it arrives, and handed to the lane that takes its problem. (A suite resumed on another
    machine, without the cache, generates only the starters that had not arrived; when the database got them only as
    lanes took them, level 2's second call on a fresh node generated 65 again.) On a GPU, generations side by side
    hold at most GENERATION_MEMORY_SHARE of its free memory (each its reference's full-size inputs and outputs, three
    times, and weights: a level-1 ReLU moves 12.8 GB), and one that ran out of memory beside others is generated
    again alone. A generating child is listed as a user of its GPU (sandbox/pool.py), so a lane timing a kernel there
    stops it meanwhile, as it stops planners. `hits` and `misses` count the starters found in the cache and those to
    generate."""

    def __init__(self, store: Store, plan: SuitePlan, on_event: Callable[[dict], None],
                 items: list[tuple[Problem, str]], gpus: list[int | None] | None = None, cache=None) -> None:
        from sandbox.pipeline import MemoryGate

        self.cache = cache
        self._timeout_s = plan.starter_timeout_s
        self._on_event = on_event
        self._store, self._owner = store, threading.get_ident()
        self._connections = threading.local()   # each generating thread writes through a connection of its own
        self._cond = threading.Condition()
        self._waits: dict[tuple[Problem, str], str] = {}   # item -> the source sha256 whose starter it waits for
        self._ready: dict[str, dict | None] = {}          # sha -> its entry (None: nothing kept, the run makes one)
        todo: dict[str, Problem] = {}
        for item in items:
            if (sha := starter_needed(store, plan, *item)) is not None:
                self._waits[item] = sha
                todo.setdefault(sha, item[0])
        self.total, self.done = len(todo), 0
        self._queue: list[tuple[str, Problem]] = []   # to generate, in plan order
        for sha, problem in todo.items():
            entry = cache.get(cache_key(sha)) if cache is not None else None
            if entry is None:
                self._queue.append((sha, problem))
            else:
                self._arrived(sha, problem, entry, cached=True)
        self.hits, self.misses = self.total - len(self._queue), len(self._queue)
        gpus = gpus or [None]
        self._gates = {gpu: MemoryGate(generation_memory(gpu)) for gpu in set(gpus)}
        self._beside = {gpu: 0 for gpu in self._gates}   # generations running on each GPU
        self._closing = False
        self._generators: list = []
        # --jobs per lane, as when each lane generated its own problems' starters; no more than there is to make
        count = min(plan.jobs * len(gpus), len(self._queue))
        self._threads = [threading.Thread(target=self._generating, args=(gpus[i % len(gpus)],), daemon=True,
                                          name=f"kloop-starter-{i}") for i in range(count)]
        for thread in self._threads:
            thread.start()

    def ready(self, item: tuple[Problem, str]) -> bool:
        """Whether the item can run: it needs no starter, or its starter has arrived."""
        sha = self._waits.get(item)
        with self._cond:
            return sha is None or sha in self._ready

    def entry(self, item: tuple[Problem, str]) -> dict | None:
        """The item's starter entry to keep in the run database ({target_sha256, starter, error, seconds}); None
        where it needs none or none was kept (a killed generation: its run makes its own)."""
        sha = self._waits.get(item)
        with self._cond:
            return self._ready.get(sha) if sha is not None else None

    def wait(self, timeout: float) -> None:
        """Until the next starter arrives (or timeout)."""
        with self._cond:
            self._cond.wait(timeout)

    def close(self) -> None:
        """No more generations: those queued are dropped, the warm children end (any still generating is killed,
        its starter kept nowhere)."""
        with self._cond:
            self._closing = True
            self._queue.clear()
            generators = list(self._generators)
        for generator in generators:
            generator.kill()
        for thread in self._threads:
            thread.join()

    def _generating(self, gpu: int | None) -> None:
        """One generating thread: the next problem in the queue, in its warm child on `gpu`, until none is left."""
        from agent.kernels.warm_generator import WarmGenerator

        visible = None if gpu is None else placement.gpu_list(str(gpu))[0]
        generator = WarmGenerator(visible, started=_gpu_user(visible),
                                  **({"timeout_s": self._timeout_s} if self._timeout_s is not None else {}))
        with self._cond:
            self._generators.append(generator)
        try:
            while True:
                with self._cond:
                    if self._closing or not self._queue:
                        return
                    sha, problem = self._queue.pop(0)
                self._generate(generator, sha, problem, gpu)
        finally:
            generator.close()
            if getattr(self._connections, "store", self._store) is not self._store:
                self._connections.store.close()

    def _generate(self, generator, sha: str, problem: Problem, gpu: int | None) -> None:
        from agent.kernels import inductor

        gate, alone, entry = self._gates[gpu], False, None
        began = time.monotonic()
        try:
            while True:
                need = 0 if gate.budget is None else gate.budget if alone else \
                    min(gate.budget, generation_bytes(problem))
                gate.take(need)
                with self._cond:
                    self._beside[gpu] += 1
                    crowded = self._beside[gpu] > 1
                began = time.monotonic()
                try:
                    entry = {"starter": generator.generate(str(problem.path)).to_dict(), "error": None}
                except inductor.GenerationStopped as e:   # killed: nothing is known about the problem
                    entry = {"starter": None, "error": str(e), "stopped": True}
                except inductor.NoStarter as e:
                    entry = {"starter": None, "error": str(e)}
                except Exception as e:  # noqa: BLE001 (ours, e.g. listing the child: this thread goes on)
                    entry = {"starter": None, "error": f"generation failed: {type(e).__name__}: {e}", "stopped": True}
                finally:
                    with self._cond:
                        self._beside[gpu] -= 1
                    gate.give(need)
                if crowded and not alone and "out of memory" in (entry["error"] or "").lower():
                    alone = True
                    self._event({"kind": "starter_later", "problem": problem.key,
                                 "seconds": time.monotonic() - began, "why": "out of memory beside others"})
                    continue
                break
        finally:   # whatever happened, the lane waiting for it goes on
            if entry is None:
                entry = {"starter": None, "error": "generation failed", "stopped": True}
            entry = {"target_sha256": sha, **entry, "seconds": time.monotonic() - began}
            # a killed generation is kept nowhere (the problem's run generates its own starter); one that failed for
            # the machine's state at the time only in this suite's database
            kept = not entry.pop("stopped", False)
            if kept and self.cache is not None and \
                    not any(e in (entry["error"] or "").lower() for e in TRANSIENT_ERRORS):
                self.cache.put(cache_key(sha), entry)
            self._arrived(sha, problem, entry, cached=False, kept=kept)

    def _arrived(self, sha: str, problem: Problem, entry: dict, cached: bool, kept: bool = True) -> None:
        if kept:
            self._keep(sha, entry)
        with self._cond:
            self._ready[sha] = {"target_sha256": sha, "starter": entry["starter"], "error": entry["error"],
                                "seconds": entry.get("seconds")} if kept else None
            self.done += 1
            done = self.done
            self._cond.notify_all()
        self._event({"kind": "starter", "problem": problem.key, "done": done, "total": self.total,
                     "ok": entry["starter"] is not None, "cached": cached, "error": entry["error"], "kept": kept,
                     "seconds": entry.get("seconds") or 0.0})

    def _keep(self, sha: str, entry: dict) -> None:
        """The entry in the run database, where a resumed suite finds it. Where that write fails (the database
        busy past its timeout), the lane taking the problem writes it."""
        from tools.records.store import StoreError

        try:
            if not hasattr(self._connections, "store"):
                self._connections.store = self._store if threading.get_ident() == self._owner else \
                    open_db(self._store.path)
            keep_starter(self._connections.store, sha, {"starter": entry["starter"], "error": entry["error"],
                                                        "seconds": entry.get("seconds")})
        except (StoreError, sqlite3.Error):
            pass

    def _event(self, event: dict) -> None:
        try:
            self._on_event(event)
        except KeyboardInterrupt:   # lanes are stopping (their events raise it): nothing to tell
            pass


def _gpu_user(visible: str | None) -> Callable | None:
    """What lists a generating child as a user of GPU `visible` (None without a GPU)."""
    if not placement.has_gpu():
        return None
    from sandbox import pool
    from tools.profile import gpu_uuid

    uuid = gpu_uuid(visible)
    if not uuid:
        return None
    return lambda child: pool.register(types.SimpleNamespace(proc=child), uuid)


# -- the suite --------------------------------------------------------------------------------------------------
def run_suite(store: Store, plan: SuitePlan, on_event: Callable[[dict], None] = lambda event: None,
              session=None) -> list[dict]:
    """Every (problem, strategy) of the plan not yet finished with the same settings, in plan order as their
    starters are ready, by one lane or several side by side (plan.lane_evaluators; `session`: one lane in that
    evaluator); returns the plan's rows (rows_of). Ctrl-C: the problems in flight are marked stopped and
    KeyboardInterrupt re-raised."""
    from agent.kernels.starter_cache import StarterCache

    ensure_tables(store)
    lanes = [dict(plan.evaluator)] if session is not None else plan.lane_evaluators()
    lock = threading.Lock()

    def emit(event: dict) -> None:   # starters arrive on the pool's threads, beside the lanes' events
        with lock:
            on_event(event)

    starters = StarterPool(store, plan, emit, plan.items(), [_lane_gpu(lane) for lane in lanes],
                           StarterCache(plan.starter_cache) if plan.starter_cache else StarterCache.default())
    emit({"kind": "starters", "hits": starters.hits, "misses": starters.misses, "cache": str(starters.cache.folder)})
    work = _Work(plan.items(), starters)
    try:
        if len(lanes) == 1:
            _lane(store, plan, emit, work, lanes[0], session)
        else:
            _run_lanes(store, plan, emit, work, lanes)
    finally:
        starters.close()
    return rows_of(store, plan)


def _lane_gpu(evaluator: dict) -> int | None:
    """The GPU a lane with one GPU generates its starters on (None: this process's)."""
    spec = evaluator.get("gpus")
    gpus = placement.gpu_indices(spec) if spec and not evaluator.get("ray") else None
    return gpus[0] if gpus and len(gpus) == 1 else None


class _Work:
    """The plan's items for lanes, each handed out once: the first in plan order whose starter is ready (or that
    needs none); while every item left waits for its starter, until the next one arrives."""

    def __init__(self, items: list[tuple[Problem, str]], starters: StarterPool) -> None:
        self.total = len(items)
        self._left = list(enumerate(items))
        self._starters = starters
        self._lock = threading.Lock()

    def next_item(self) -> tuple[int, tuple[Problem, str], dict | None] | None:
        """(index in the plan, item, its starter entry to keep) or None when every item was handed out."""
        while True:
            with self._lock:
                if not self._left:
                    return None
                for k, (index, item) in enumerate(self._left):
                    if self._starters.ready(item):
                        del self._left[k]
                        return index, item, self._starters.entry(item)
            self._starters.wait(1.0)

    def later(self, index: int, item: tuple[Problem, str]) -> None:
        """Hand `item` out again after every item now left (its starter, if any, is kept in the database)."""
        with self._lock:
            self._left.append((index, item))


def _lane(store: Store, plan: SuitePlan, on_event: Callable[[dict], None], work: _Work, evaluator: dict,
          session=None, tag: bool = False, lending: "_Lending | None" = None, lane: int = 0) -> None:
    """Items from `work` until none is left, in one evaluator session (its planners, executors and referees stay
    warm across problems; `session`: the caller's, else one of the lane's own). tag: the loop's events carry their
    problem (lanes side by side interleave them). lending: lanes side by side, where this lane's devices go to a lane
    still running once this one has nothing left (the caller closes the sessions then)."""
    own = session is None
    if own:
        session = runs.evaluator_session(plan.run_settings(*plan.items()[0], evaluator))
    if lending is not None:
        lending.running(lane, session)

    def run_one(index: int, problem: Problem, strategy: str) -> dict:
        on_event({"kind": "problem", "index": index, "total": work.total, "problem": problem.key,
                  "strategy": strategy, **tally(store, rows_of(store, plan))})
        events = (lambda event, key=problem.key: on_event({**event, "problem": key})) if tag else on_event
        row = _run_problem(store, plan, problem, strategy, events, session, evaluator)
        on_event({"kind": "problem_done", "index": index, "total": work.total, "problem": problem.key,
                  "strategy": strategy, "status": row["status"], "reason": row.get("reason"),
                  "best": _best_of(store, row.get("run_id")), **tally(store, rows_of(store, plan))})
        return row

    retried = set()
    try:
        while (taken := work.next_item()) is not None:
            index, (problem, strategy), starter = taken
            if starter is not None:
                keep_starter(store, starter["target_sha256"], starter)
            row = run_one(index, problem, strategy)
            if row["status"] == "failed" and out_of_memory(row.get("reason")) and index not in retried:
                retried.add(index)   # once, after the others: by then fewer starters generate beside it
                work.later(index, (problem, strategy))
        if lending is not None:
            lending.idle(lane)
    finally:
        if own and lending is None:
            session.close()


class _Lending:
    """Lanes side by side share their GPUs at the end: a lane with nothing left to take gives its devices (its own
    and those lent to it) to the running lane that has fewest, whose problem's attempts then spread over them (its
    pipeline's queue feeds every device it has: sandbox/pipeline.py lend). One candidate still runs at a time per
    device (Device.lock), the owner's lane being idle; timings stay compared on one GPU (a would-be best is paired
    against the standing best on the device that profiled it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[int, Any] = {}         # every lane's session, closed by the caller at the end
        self._devices: dict[int, list] = {}         # the devices each running lane's session uses
        self.lent: list[tuple[str, int]] = []       # (device name, lane it went to), in order

    def running(self, lane: int, session) -> None:
        with self._lock:
            self._sessions[lane] = session
            self._devices[lane] = list(session.devices)

    def idle(self, lane: int) -> None:
        from sandbox.pipeline import lend

        with self._lock:
            devices = self._devices.pop(lane, [])
            for device in devices:
                for other in sorted(self._devices, key=lambda k: (len(self._devices[k]), k)):
                    if lend(self._sessions[other], device):
                        self._devices[other].append(device)
                        self.lent.append((device.name, other))
                        break

    def interrupt(self) -> None:
        """Every lane's waits for its candidates raise KeyboardInterrupt (sandbox.pipeline.Pipeline.interrupt)."""
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.interrupt()

    def close(self) -> None:
        for session in self._sessions.values():
            session.close()


def _run_lanes(store: Store, plan: SuitePlan, on_event: Callable[[dict], None], work: _Work,
               lanes: list[dict]) -> None:
    """Lanes side by side, each a thread with its own database connection and evaluator session (on GPU lanes, its
    own GPU for timing), lending its devices to the lanes still running once it has nothing left (_Lending).
    Ctrl-C, or a lane's error: every lane's next event, or its wait for a candidate in flight, raises
    KeyboardInterrupt in it, which marks its problem in flight stopped as one lane would; then the interrupt (or the
    error) is raised here."""
    from agent.kernels import inductor

    stopping, lock, errors = threading.Event(), threading.Lock(), []
    lending = _Lending()

    def stop() -> None:
        stopping.set()
        inductor.stop_generating()  # lanes waiting for starters reach their next event now
        lending.interrupt()         # lanes waiting for a candidate's stage stop waiting now

    def events(event: dict) -> None:
        if stopping.is_set():
            raise KeyboardInterrupt
        with lock:  # one renderer, events whole
            on_event(event)

    def lane(index: int, evaluator: dict) -> None:
        own = open_db(store.path)
        try:
            _lane(own, plan, events, work, evaluator, tag=True, lending=lending, lane=index)
        except KeyboardInterrupt:
            pass
        except BaseException as e:
            errors.append(e)
            stop()
        finally:
            own.close()

    threads = [threading.Thread(target=lane, args=(i, evaluator), name=f"kloop-suite-lane-{i}", daemon=True)
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
    finally:
        lending.close()
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
    again = plan.runs_again(problem, row)
    if finished(store, row, plan.starter_timeout_s) and not again:
        return row
    spent = 0.0 if again else (row or {}).get("seconds") or 0.0
    try:
        r = _resume(store, row) if row is not None and row.get("run_id") and not again else None
        if r is None:
            r = _start(store, plan, problem, strategy, sha, evaluator)
    except runs.RunFinished:
        record(store, plan, problem, strategy, sha, status="done", finished_at=now())
        return problem_row(store, key, problem, sha)
    except runs.RunError as e:
        # out of GPU memory beside the starters generating there (level 1's 6 GB ReLU beside 8 of them): not the
        # problem's own verdict, so failed, and run again (the lane later in this suite, else a resumed suite)
        status = "failed" if out_of_memory(str(e)) else "skipped"
        record(store, plan, problem, strategy, sha, status=status, reason=str(e), finished_at=now())
        return problem_row(store, key, problem, sha)
    record(store, plan, problem, strategy, sha, status="running", run_id=r.id, reason=None,
           **({"started_at": now(), "finished_at": None} if again else {}))
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


def out_of_memory(reason: str | None) -> bool:
    """Whether a problem's reason is its GPU running out of memory (torch's OutOfMemoryError)."""
    return reason is not None and ("OutOfMemoryError" in reason or "CUDA out of memory" in reason)


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
        cached = cached_starter(store, sha, plan.starter_timeout_s)
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
    return {"number": best.number, "speedup_eager": best.speedup_eager,
            "speedup_compile": best.speedup_compile, "sol_fraction": best.sol_fraction, "timed": best.timed}


def tally(store: Store, rows: list[dict]) -> dict:
    """Progress so far over the plan's rows (tools.records.suite_report's definitions): finished and left, verified, fast_1
    over eager and over torch.compile (None while nothing was timed)."""
    from tools.records.suite_report import collect, summarize

    s = summarize(collect(store, rows))
    return {"done": s["finished"], "left": s["problems"] - s["finished"], "verified": s["verified"],
            "timed": s["timing_is_real"], "fast_1_eager": s["fast_p_counts"]["eager"]["1"],
            "fast_1_compile": s["fast_p_counts"]["compile"]["1"]}
