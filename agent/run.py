"""Optimization runs without a command line: start or resume a run from its settings, run it, return its best.

`kloop optimize`, `kloop resume` and `kloop bench` are thin adapters over this module, and any other entry point
(a suite, a server, a notebook) calls it the same way. Nothing here prints or exits: bad input raises `RunError`
(one line for the user, nothing created), and progress goes to the `on_event` callback.

    >>> from agent.run import settings_for, start, resume, run
    >>> store = open_db("runs/kloop.db")
    >>> r = start(store, "offline", settings_for("softmax", max_attempts=8))   # loads, checks, creates the run
    >>> best = run(r, on_event=print)                                           # the loop, to a stop rule
    >>> best.speedup_eager if best else None                                    # the best verified Attempt
    >>> best = run(resume(store, r.id, max_attempts=16))                        # more budget for the same run
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable

from sandbox import placement
from sandbox.placement import has_gpu
from sandbox.seam import EvaluatorSession
from tools.records.store import Attempt, Store, gpu_columns

POLICIES = ("offline", "anthropic", "openai", "replay")
LANGUAGES = ("triton", "ptx", "auto")

# Every run setting (stored as runs.settings) with its default. `policy` is a column of its own, not a setting.
DEFAULT_SETTINGS: dict[str, Any] = {
    "target": None, "language": "auto", "max_attempts": 20, "hours": None, "branches": 1, "target_sol": 0.9,
    "patience": 20, "max_cost_usd": None, "max_tokens": None, "seed_kernel": None, "model": None, "base_url": None,
    "from_run": None, "thinking": None, "effort": None, "max_retries": None, "tools": True,
    # Where and how wide candidates are evaluated (agent.run.evaluator_session, sandbox.placement): GPUs ("all",
    # "0,1"; None: this process's one), Ray ("auto" or an address), parallel planners and attempts in flight per
    # branch (None: auto).
    "gpus": None, "ray": None, "planners": None, "pipeline": None,
    # The torch.compile baseline's mode (sandbox.evaluate.COMPILE_MODES); runs made before it was a setting used this one.
    "compile_mode": "max-autotune-no-cudagraphs",
    # The memory file across runs (agent/learn.py): read by `start`, written by `run` once the loop ends; None: neither.
    # `kloop optimize` names one (runs/memory.db beside --db); a suite, bench and this API leave it off by default,
    # so their runs' results do not depend on what earlier runs left there (docs/design.md, Runs).
    "memory": None,
}


class RunError(Exception):
    """Bad input (unknown target or policy, failing reference, misplaced setting, empty budget, ...): one line for
    the user; nothing was created."""


class RunFailed(RunError):
    """The loop stopped on an error (policy, target, database): the run is marked failed and can be resumed."""

    def __init__(self, run_id: str, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunFinished(RunError):
    """`resume` of a finished run with no new budget: there is nothing to do (not a failure)."""


@dataclass
class Run:
    """A run ready to go: its row's id in `store`, its settings, its target and its policy."""
    store: Store
    id: str
    policy_name: str
    settings: dict
    target: Any                          # tools.target.Target
    policy: Any                          # agent.policy.Policy
    extend: bool = False                 # a finished run given new budgets: its graph starts again
    previous_status: str | None = None   # resume: the status it had ('running' after a kill -9, 'stopped', ...)
    attempts_before: int = 0             # resume: attempts it already had


# -- settings -----------------------------------------------------------------------------------------------------
def default_policy() -> str:
    """anthropic when ANTHROPIC_API_KEY is set, else offline."""
    return "anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "offline"


def settings_for(target: str, **overrides: Any) -> dict:
    """A run's whole settings dict: the defaults, then `overrides` (extra keys, e.g. started_by, are kept). A target
    that is a file is stored by its absolute path, as is a seed kernel."""
    settings = {**DEFAULT_SETTINGS, **overrides}
    settings["target"] = str(Path(target).resolve()) if Path(target).is_file() else target
    if settings["seed_kernel"] is not None and Path(settings["seed_kernel"]).is_file():
        settings["seed_kernel"] = str(Path(settings["seed_kernel"]).resolve())
    return settings


def strategy_settings(strategy: str = "refine", seed: int | None = None) -> dict:
    """The run settings of a search strategy (also for `kloop suite`): the seed is drawn once and stored, so a
    resumed run makes the same picks."""
    import random

    return {"strategy": strategy, "strategy_seed": seed if seed is not None else random.SystemRandom().randrange(2**31)}


def loop_search_settings(settings: dict) -> dict:
    """LoopSettings fields from a run's settings (runs made before strategies existed are refine runs)."""
    search = {k: settings[k] for k in ("strategy", "strategy_seed", "islands", "migrate_every")
              if settings.get(k) is not None}
    return search | {"lessons": tuple(settings.get("memory_lessons") or ())}


def check_settings(policy: str, settings: dict) -> None:
    """Refuse what cannot make a useful run, before anything is loaded or created."""
    if policy not in POLICIES:
        raise RunError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    check_strategy(settings.get("strategy") or "refine")
    if settings["language"] not in LANGUAGES:
        raise RunError(f"unknown language {settings['language']!r} (one of {', '.join(LANGUAGES)})")
    if settings["seed_kernel"] is not None and not Path(settings["seed_kernel"]).is_file():
        raise RunError(f"no seed kernel file {settings['seed_kernel']}")
    if policy == "replay" and not settings["from_run"]:
        raise RunError("the replay policy needs --from RUN_ID")
    if policy != "anthropic" and (settings["thinking"] is not None or settings["effort"] is not None):
        raise RunError("--thinking and --effort are settings of --policy anthropic")
    if policy not in ("anthropic", "openai") and settings["max_retries"] is not None:
        raise RunError("--max-retries is a setting of --policy anthropic or openai")
    if policy != "openai" and not settings["tools"]:
        raise RunError("--no-tools is a setting of --policy openai")
    check_budgets(settings["hours"], settings["max_cost_usd"])
    check_evaluator(settings)
    if settings["language"] == "ptx" and not has_gpu():
        raise RunError("--language ptx needs a CUDA GPU: without one PTX is assembled but not run, so no attempt "
                       "could be verified or ranked (use --language triton or auto)")


def check_strategy(name: str) -> None:
    """A search strategy's name (agent/strategies), checked here only: every entry point's settings pass through
    check_settings, and a suite names its strategies through this before it makes any settings."""
    from agent.strategies import STRATEGIES

    if name not in STRATEGIES:
        raise RunError(f"unknown strategy {name!r} (one of {', '.join(STRATEGIES)})")


def check_evaluator(settings: dict) -> None:
    """--gpus, --ray, --planners, --pipeline and --compile-mode, checked before anything is created."""
    from sandbox.evaluate import COMPILE_MODES

    if settings.get("compile_mode", COMPILE_MODES[0]) not in COMPILE_MODES:
        raise RunError(f"unknown --compile-mode {settings['compile_mode']!r} (one of {', '.join(COMPILE_MODES)})")
    if settings.get("gpus") is not None and settings.get("ray"):
        raise RunError("give --gpus or --ray, not both (with Ray every GPU of the cluster gets an executor)")
    for name in ("planners", "pipeline"):
        value = settings.get(name)
        if value is not None and (not isinstance(value, int) or value < 1):
            raise RunError(f"--{name} must be a whole number of at least 1, got {value!r}")
    try:
        placement.gpu_list(settings.get("gpus"))
    except placement.PlacementError as e:
        raise RunError(str(e)) from None
    if settings.get("ray"):
        try:
            import ray  # noqa: F401
        except ImportError:
            raise RunError("--ray needs the ray extra: pip install -e '.[ray]'") from None


def check_budgets(hours: float | None, max_cost: float | None) -> None:
    """An empty budget would make an empty run: refused before anything is created."""
    if hours is not None and not hours > 0:
        raise RunError(f"--hours must be more than 0, got {hours:g}")
    if max_cost is not None and not max_cost > 0:
        raise RunError(f"--max-cost must be more than 0, got {max_cost:g}")


# -- the pieces of a run --------------------------------------------------------------------------------------------
def load_target(spec: str):
    """A built-in name or a KernelBench-style file, whose reference must run at every checked shape."""
    from tools.target import TargetError, check_reference
    from tools.target import load_target as load

    try:
        target = load(spec)
        check_reference(target)
    except TargetError as e:
        raise RunError(str(e)) from None
    return target


def make_policy(name: str, settings: dict, target, store: Store):
    from agent.policies import make_policy as make
    from agent.policies import model_policy_settings
    from agent.policy import PolicyError

    if name == "offline":
        kwargs = {"target": target, "seed_kernel": settings.get("seed_kernel"), "store": store,
                  "remembered": settings.get("memory_seeds"), "inductor_starter": settings.get("inductor_starter")}
    elif name == "replay":
        kwargs = {"store": store, "source_run_id": settings["from_run"]}
    else:
        kwargs = model_policy_settings(name, settings)
    try:
        return make(name, **kwargs)
    except PolicyError as e:
        raise RunError(str(e)) from None


def gpu_facts() -> dict | None:
    """This machine's GPU facts (the evaluator's `gpu` dict), None without one: read once per run, and written to
    the run only here (start, or run for a run made without them) and by agent.reverify for the run it makes."""
    from tools.profile import gpu_info

    return gpu_info()


# -- where candidates are evaluated (sandbox.placement) -------------------------------------------------------------
def pipeline_depth(settings: dict, policy: str, planners: int, devices: int) -> int:
    """Attempts in flight per branch: settings["pipeline"], else enough to keep every planner and device busy for
    the offline policy (its proposals cost nothing), and 1 for model policies (each proposal is a model call, which
    should see the results before it)."""
    if settings.get("pipeline"):
        return int(settings["pipeline"])
    if policy != "offline":
        return 1
    return max(1, -(-(planners + 2 * devices) // max(1, settings.get("branches") or 1)))


def evaluator_session(settings: dict, target=None) -> EvaluatorSession:
    """The evaluator a run evaluates in (sandbox.placement): a `sandbox.evaluate.Session` with one device per GPU of
    settings["gpus"] (this process's own GPU, or the CPU, when None) and settings["planners"] parallel planners, its
    scratch folder claimed for this process, or with settings["ray"] a `sandbox.ray_backend.RaySession` over a Ray
    cluster's nodes. Anything that runs several runs (kloop suite, kloop bench) may make one and pass it to
    `run(..., session=)` for each; RunError for bad settings."""
    try:
        if settings.get("ray"):
            return placement.ray_session(settings)
        session = placement.local_session(settings, target)
    except placement.PlacementError as e:
        raise RunError(str(e)) from None
    claim_scratch(session.directory)
    return session


# -- scratch folders left by killed processes ----------------------------------------------------------------------
SCRATCH_OWNER = "kloop-owner.json"   # in a session's scratch folder: the process that made it (owner_record)
CHILD_FOLDER = re.compile(r"kloop-[a-z0-9_]{8}")   # a child's working folder (sandbox.process.Child: mkdtemp)
IDLE_CHILD_S = 600.0   # a child's folder no process works in and nothing touched for this long is left over


def claim_scratch(directory: Path) -> None:
    """Mark an evaluator session's scratch folder (plans, and weights on a GPU: in RAM under /dev/shm) with this
    process, so that a later start can tell the folder of a killed session from a live one's (clean_scratch)."""
    (Path(directory) / SCRATCH_OWNER).write_text(json.dumps(owner_record()))


def clean_scratch(root: Path | None = None) -> list[Path]:
    """Remove what killed kloop processes left in the scratch root (sandbox.process.scratch_root(): /dev/shm when
    it is large): session folders whose owner (host, pid and the pid's start time) is gone, and children's working
    folders (planners, executors) in which no live process works (by working directory) and nothing changed for
    IDLE_CHILD_S. A session folder without an owner mark (made by a caller that never claimed it) is left alone,
    as is the node's GPU registry. Returns the folders removed."""
    import shutil

    from sandbox.process import scratch_root

    root = Path(root) if root is not None else scratch_root()
    try:
        entries = [p for p in root.iterdir() if p.name.startswith("kloop-") and p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
    working = _working_folders()
    removed = []
    for folder in entries:
        if folder.name.startswith("kloop-session-"):
            stale = _owner_gone(folder / SCRATCH_OWNER)
        elif CHILD_FOLDER.fullmatch(folder.name) and (folder / "stdout.txt").exists():
            stale = _inode(folder) not in working and time.time() - _last_change(folder) > IDLE_CHILD_S
        else:
            stale = False
        if stale:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _owner_gone(mark: Path) -> bool:
    try:
        owner = json.loads(mark.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname() or owner.get("started") is None:
        return False   # another host's, or made where /proc could not tell
    return _start_time(owner.get("pid") or 0) != owner["started"]


def _working_folders() -> set[tuple[int, int]]:
    """(device, inode) of every live process's working directory that can be read (a jailed child's too: the
    inode is the host folder's whatever path the jail shows it at)."""
    found = set()
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if pid.isdigit():
            try:
                st = os.stat(f"/proc/{pid}/cwd")
            except OSError:
                continue
            found.add((st.st_dev, st.st_ino))
    return found


def _inode(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


def _last_change(folder: Path) -> float:
    """The latest modification time of the folder and of what is directly in it."""
    times = [folder.stat().st_mtime]
    for entry in folder.iterdir():
        try:
            times.append(entry.lstat().st_mtime)
        except OSError:
            pass
    return max(times)


def loop_settings(settings: dict, pipeline: int | None = None):
    """The graph's LoopSettings from a run's settings: every setting that names one of its fields (pipeline: the
    depth chosen for this session when the setting is auto). Without a GPU, `auto` writes Triton only: PTX would be
    assembled but never run, an attempt spent unranked."""
    from agent.graph import LoopSettings

    names = {f.name for f in fields(LoopSettings)}
    chosen = {k: v for k, v in settings.items() if k in names and v is not None}
    chosen.update(loop_search_settings(settings))
    if pipeline is not None:
        chosen["pipeline"] = pipeline
    if chosen.get("language") == "auto" and not has_gpu():
        chosen["language"] = "triton"
    return LoopSettings(**chosen)


# -- start, resume, run ---------------------------------------------------------------------------------------------
def start(store: Store, policy: str, settings: dict, target=None, **columns: Any) -> Run:
    """Check the settings, load the target (unless given, already loaded), read memory (settings["memory"]: what it
    remembers for this target goes into the settings, so a resume is shown the same), make the policy and create
    the run. columns: more runs columns (parent_run_id, notes, ...). RunError before anything is written."""
    from agent.learn import prepare

    check_settings(policy, settings)
    target = target if target is not None else load_target(settings["target"])
    gpu = gpu_facts()
    settings = {**settings, **prepare(settings, target, policy, gpu)}
    policy_obj = make_policy(policy, settings, target, store)
    # pinned: a resumed run keeps its model, and the offline policy's generated starter (policy.pinned)
    settings = {**settings, "model": policy_obj.model or None, **getattr(policy_obj, "pinned", {})}
    from_run = settings.get("from_run")
    run_id = store.create_run(target_name=target.name, target_source=target.source, target_sha256=target.sha256,
                              policy=policy, model=policy_obj.model, settings=settings,
                              **({"parent_run_id": from_run, "parent_kind": "replay-policy"} if from_run else {}),
                              **gpu_columns(gpu), **columns)
    return Run(store, run_id, policy, settings, target, policy_obj)


def start_in(db: Path, policy: str, settings: dict, target=None, **columns: Any) -> Run:
    """`start` in the run database at `db`, made if missing. The settings and the target are checked before the file
    is made, and a database made here is removed again if the start is still refused (no API key, no starter
    kernel): a refused command leaves nothing behind. RunError, one line."""
    from tools.records.store import StoreError, open_db

    check_settings(policy, settings)
    target = target if target is not None else load_target(settings["target"])
    made = not Path(db).exists()
    try:
        store = open_db(db)
    except StoreError as e:
        raise RunError(str(e)) from None
    try:
        return start(store, policy, settings, target=target, **columns)
    except RunError:
        store.close()
        if made:
            for leftover in (Path(db), Path(f"{db}-wal"), Path(f"{db}-shm")):
                leftover.unlink(missing_ok=True)
        raise


def resume(store: Store, run_id: str, max_attempts: int | None = None, hours: float | None = None,
           patience: int | None = None) -> Run:
    """A stopped, failed or killed run, to continue where it left off; new budgets (for the whole run) also extend a
    finished one. RunFinished for a finished run given no new budget; RunError for budgets already spent, a target
    that changed since, or PTX without a GPU."""
    from tools.records.store import StoreError

    check_budgets(hours, None)
    try:
        row = store.get_run(run_id)
    except StoreError as e:
        raise RunError(str(e)) from None
    settings = dict(row["settings"])
    changes = {k: v for k, v in (("max_attempts", max_attempts), ("hours", hours), ("patience", patience))
               if v is not None and v != settings.get(k)}
    if row["status"] == "finished" and not changes:
        raise RunFinished(f"run {run_id} already finished ({row['notes'] or 'no notes'})")
    progress = store.progress(run_id)
    from agent.output import duration, plural

    if max_attempts is not None and max_attempts <= progress["attempts"]:
        raise RunError(f"run {run_id} already has {plural(progress['attempts'], 'attempt')}; --max-attempts must "
                       "be more")
    if hours is not None and hours * 3600 <= progress["seconds"]:
        raise RunError(f"run {run_id} already used {duration(progress['seconds'] / 3600)}; --hours must be more")
    target = load_target(settings["target"])
    if target.sha256 != row["target_sha256"]:
        raise RunError(f"target {settings['target']} changed since run {run_id} started; start a new run instead")
    if settings.get("language") == "ptx" and not has_gpu():
        raise RunError(f"run {run_id} writes PTX only, which needs a CUDA GPU to verify; resume it on one")
    try:
        check_evaluator(settings)
    except RunError as e:
        raise RunError(f"run {run_id} was started with settings this machine cannot give: {e}") from None
    settings.update(changes)
    policy_obj = make_policy(row["policy"], settings, target, store)
    if changes:
        store.update_run(run_id, settings=settings)
    return Run(store, run_id, row["policy"], settings, target, policy_obj, extend=row["status"] == "finished",
               previous_status=row["status"], attempts_before=progress["attempts"])


def run(r: Run, on_event: Callable[[dict], None] = lambda event: None,
        session: EvaluatorSession | None = None) -> Attempt | None:
    """Run the loop to a stop rule, keep what it taught in memory (settings["memory"]), and return the run's best
    verified attempt, or None. Events: the graph's (stage, attempt, api_error, stop),
    {"kind": "warning", "message"} and, after the loop, {"kind": "memory", "message"} per thing kept. Ctrl-C marks
    the run stopped and re-raises KeyboardInterrupt; a policy, target or database error marks it failed: RunFailed
    (memory is written only after a loop that ended by a stop rule). session: an evaluator to run in
    (`evaluator_session`; kept warm across runs by its maker, as a suite does), else one of its own."""
    from agent.learn import after_run
    from agent.policy import PolicyError
    from tools.records.store import StoreError
    from tools.target import TargetError

    r.store.update_run(r.id, owner=owner_record())
    gpu = r.store.get_run(r.id).get("gpu")
    if gpu is None:  # a run made before runs.gpu existed, or one started without a GPU: this machine's facts
        gpu = gpu_facts()
        if gpu is not None:
            r.store.update_run(r.id, **gpu_columns(gpu))
    try:
        run_graph(r.store, r.id, r.settings, r.target, r.policy, gpu, on_event, extend=r.extend, session=session)
    except (TargetError, PolicyError, StoreError) as e:
        raise RunFailed(r.id, str(e)) from e
    for line in after_run(r.store, r.id, r.policy, r.settings, r.target):
        on_event({"kind": "memory", "message": line})
    return r.store.best_attempt(r.id)


def owner_record(pid: int | None = None) -> dict:
    """The process running a run: host, pid and the pid's start time (a pid alone is reused after a reboot)."""
    pid = pid or os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": _start_time(pid)}


def liveness(row: dict) -> str:
    """Why a run's status says `running` when no process runs it any more ('' otherwise): a killed run (kill -9, a
    lost machine) keeps `running` until it is resumed. Judged by its owner's pid on this host; a run on another host,
    or one from before runs.owner, is taken as it says."""
    owner = row.get("owner")
    if row.get("status") != "running" or not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return ""
    started = _start_time(owner.get("pid") or 0)
    if started is not None and started == owner.get("started"):
        return ""
    return f"no live process; `kloop resume {row['id']}`"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, from /proc (None: no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[19].decode()


def run_graph(store: Store, run_id: str, settings: dict, target, policy, gpu: dict | None,
              on_event: Callable[[dict], None], extend: bool = False,
              session: EvaluatorSession | None = None) -> None:
    """The loop itself in one evaluator session (a fresh secret seed per session, never stored); the lower level of
    `run`. extend: the run had finished and was given new budgets; its graph starts again from its logged attempts.
    Candidates go to the session's pipeline (Session.submit): planned in parallel, timed one at a time per device,
    `pipeline` of them in flight per branch."""
    import contextlib

    from agent.graph import Loop, run_loop
    from tools.target import shown_source

    own = session is None
    if own:
        session = evaluator_session(settings, target)
    else:
        session.forget_best()  # another run's best is no bar for this one
    with session if own else contextlib.nullcontext(session):
        store.update_run(run_id, isolation=session.isolation)
        if session.weakly_isolated:
            on_event({"kind": "warning", "message": f"candidates run with weaker isolation: {session.isolation}"})
        if target.degenerate:
            on_event({"kind": "warning", "message": f"target {target.name} is degenerate: {target.degenerate}; "
                      "kernels are judged, but no speedup is reported"})
        on_event({"kind": "stage", "branch": 0, "stage": "starting the evaluator"})
        session.start()
        best = store.best_attempt(run_id)
        if best is not None and best.timed:  # a resumed run: its best is the bar again
            session.restore_best(target, best.source, best.number, best.median_us)
        depth = pipeline_depth(settings, policy.name, session.planners, len(session.devices))
        loop = Loop(store=store, run_id=run_id, policy=policy, gpu=gpu,
                    evaluation=lambda source: session.submit(target, source),
                    settings=loop_settings(settings, depth), target_name=target.name,
                    target_source=shown_source(target.source))
        run_loop(loop, Path(f"{store.path}.checkpoints"), on_event, restart=extend)
