"""`kloop optimize`, `kloop resume`, `kloop runs`, `kloop show`: start, continue and look at optimization runs."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from agent.cmd_eval import fail
from agent.output import duration, make_console, plural, print_code
from tools.result import EvalResult
from tools.store import DEFAULT_DB

POLICIES = ("offline", "anthropic", "openai", "replay")
LANGUAGES = ("triton", "ptx", "auto")
console = make_console()


def optimize_command(
    target: str = typer.Argument(..., help="A built-in target name (see `kloop targets`) or a path to a KernelBench-style module."),
    policy: Optional[str] = typer.Option(None, help="offline, anthropic, openai or replay (default: anthropic when ANTHROPIC_API_KEY is set, else offline)."),
    language: str = typer.Option("auto", help="triton, ptx or auto (the policy chooses)."),
    max_attempts: int = typer.Option(20, min=1, help="Stop after this many attempts."),
    hours: Optional[float] = typer.Option(None, help="Stop after this much active wall-clock time."),
    branches: int = typer.Option(1, min=1, help="Parallel lineages sharing the run's best."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="Run database (created if missing)."),
    seed_kernel: Optional[Path] = typer.Option(None, help="A kernel to start from; the offline policy tunes its UPPERCASE constants."),
    target_sol: float = typer.Option(0.9, min=0, help="Stop once the best kernel reaches this fraction of speed-of-light."),
    patience: int = typer.Option(20, min=1, help="Stop after this many attempts without a new best."),
    max_cost: Optional[float] = typer.Option(None, help="Stop once model calls cost this many US dollars."),
    max_tokens: Optional[int] = typer.Option(None, min=1, help="Stop once model calls used this many tokens."),
    model: Optional[str] = typer.Option(None, help="Model id for the anthropic/openai policies."),
    base_url: Optional[str] = typer.Option(None, help="API base URL for the anthropic/openai policies."),
    from_run: Optional[str] = typer.Option(None, "--from", help="replay policy: the run whose proposals to replay."),
    thinking: Optional[str] = typer.Option(None, help="anthropic policy: extended thinking, 'adaptive' (default), 'off' or a token budget."),
    effort: Optional[str] = typer.Option(None, help="anthropic policy: output effort (e.g. low, medium, high; default: the model's)."),
    max_retries: Optional[int] = typer.Option(None, min=0, help="anthropic/openai policies: SDK retries (with backoff) per model call."),
    tools: bool = typer.Option(True, "--tools/--no-tools", help="openai policy: --no-tools for servers without function calling (fenced code answers)."),
    strategy: str = typer.Option("refine", help="Search strategy: refine, best-of-n, metr or evolve (README: Search strategies and memory)."),
    strategy_seed: Optional[int] = typer.Option(None, help="Seed of the strategy's random picks (default: drawn once, stored with the run)."),
    memory: Optional[Path] = typer.Option(None, help="Memory file across runs (default: memory.db beside --db, so runs/memory.db)."),
    no_memory: bool = typer.Option(False, "--no-memory", help="Neither read nor write memory across runs."),
) -> None:
    """Optimize one target's kernel: write, assemble, verify, profile, reflect, log; repeat until a stop rule."""
    from tools.store import StoreError, open_db

    policy = policy or ("anthropic" if os.environ.get("ANTHROPIC_API_KEY") else "offline")
    if policy not in POLICIES:
        fail(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    if language not in LANGUAGES:
        fail(f"unknown language {language!r} (one of {', '.join(LANGUAGES)})")
    if seed_kernel is not None and not seed_kernel.is_file():
        fail(f"no seed kernel file {seed_kernel}")
    if policy == "replay" and not from_run:
        fail("the replay policy needs --from RUN_ID")
    if policy != "anthropic" and (thinking is not None or effort is not None):
        fail("--thinking and --effort are settings of --policy anthropic")
    if policy not in ("anthropic", "openai") and max_retries is not None:
        fail("--max-retries is a setting of --policy anthropic or openai")
    if policy != "openai" and not tools:
        fail("--no-tools is a setting of --policy openai")
    check_budgets(hours, max_cost)
    from agent.strategies import STRATEGIES
    if strategy not in STRATEGIES:
        fail(f"unknown strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
    if language == "ptx" and not _has_gpu():
        fail("--language ptx needs a CUDA GPU: without one PTX is assembled but not run, so no attempt could be "
             "verified or ranked (use --language triton or auto)")
    settings = {
        "target": target if not Path(target).is_file() else str(Path(target).resolve()), "language": language,
        "max_attempts": max_attempts, "hours": hours, "branches": branches, "target_sol": target_sol,
        "patience": patience, "max_cost_usd": max_cost, "max_tokens": max_tokens,
        "seed_kernel": str(seed_kernel.resolve()) if seed_kernel else None, "model": model, "base_url": base_url,
        "from_run": from_run, "thinking": thinking, "effort": effort, "max_retries": max_retries, "tools": tools,
        **strategy_settings(strategy, strategy_seed),
        "memory": None if no_memory else str((memory or _default_memory(db)).resolve()),
    }
    tgt = _load_target(target)
    from agent.learn import prepare
    settings.update(prepare(settings, tgt, policy, _gpu_info()))
    new_db = not db.exists()
    try:
        store = open_db(db)
    except StoreError as e:
        fail(str(e))
    try:
        policy_obj = _make_policy(policy, settings, tgt, store)
    except typer.Exit:  # refused (no API key, no starter kernels): a database made just now is removed again
        if new_db:
            store.close()
            for leftover in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
                leftover.unlink(missing_ok=True)
        raise
    settings["model"] = policy_obj.model or None  # pinned: a resumed run keeps its model if the default changes
    gpu = _gpu_info()
    run_id = store.create_run(target_name=tgt.name, target_source=tgt.source, target_sha256=tgt.sha256,
                              policy=policy, model=policy_obj.model, settings=settings,
                              parent_run_id=from_run, parent_kind="replay-policy" if from_run else None,
                              **_gpu_columns(gpu))
    console.print(f"run [bold]{run_id}[/] in {db}: {tgt.name} with the {policy} policy "
                  f"(resume with `kloop resume {run_id} --db {db}`)", highlight=False)
    _run(store, run_id, settings, tgt, policy_obj)


def resume_command(
    run_id: str = typer.Argument(..., help="The run to continue."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="Run database."),
    max_attempts: Optional[int] = typer.Option(None, min=1, help="New attempt budget for the whole run (extends a finished run)."),
    hours: Optional[float] = typer.Option(None, help="New active-time budget for the whole run, in hours (extends a finished run)."),
    patience: Optional[int] = typer.Option(None, min=1, help="New number of attempts without a new best before stopping."),
) -> None:
    """Continue a stopped, failed or killed run where it left off (same attempt numbering); with new budgets,
    extend a finished one."""
    from tools.store import StoreError, open_db

    check_budgets(hours, None)
    try:
        store = open_db(db, create=False)
        run = store.get_run(run_id)
    except StoreError as e:
        fail(str(e))
    settings = dict(run["settings"])
    changes = {k: v for k, v in (("max_attempts", max_attempts), ("hours", hours), ("patience", patience))
               if v is not None and v != settings.get(k)}
    if run["status"] == "finished" and not changes:
        console.print(f"run {run_id} already finished ({run['notes'] or 'no notes'}); give it more with "
                      f"`kloop resume {run_id} --db {db} --max-attempts N` (or --hours H)", highlight=False)
        _print_best(store, run_id)
        return
    progress = store.progress(run_id)
    if max_attempts is not None and max_attempts <= progress["attempts"]:
        fail(f"run {run_id} already has {plural(progress['attempts'], 'attempt')}; --max-attempts must be more")
    if hours is not None and hours * 3600 <= progress["seconds"]:
        fail(f"run {run_id} already used {duration(progress['seconds'] / 3600)}; --hours must be more")
    tgt = _load_target(settings["target"])
    if tgt.sha256 != run["target_sha256"]:
        fail(f"target {settings['target']} changed since run {run_id} started; start a new run instead")
    if settings.get("language") == "ptx" and not _has_gpu():
        fail(f"run {run_id} writes PTX only, which needs a CUDA GPU to verify; resume it on one")
    settings.update(changes)
    policy_obj = _make_policy(run["policy"], settings, tgt, store)
    if changes:
        store.update_run(run_id, settings=settings)
    budget = ", ".join(_budget_words(settings))
    verb = "extending finished" if run["status"] == "finished" else f"continuing {run['status']}"
    console.print(f"{verb} run [bold]{run_id}[/] in {db}: {run['target_name']} with the {run['policy']} policy, "
                  f"{plural(progress['attempts'], 'attempt')} so far; budget: {budget}", highlight=False)
    _run(store, run_id, settings, tgt, policy_obj, extend=run["status"] == "finished")


def runs_command(
    db: List[Path] = typer.Option([DEFAULT_DB], "--db", help="Run database(s); repeat for several."),
    as_json: bool = typer.Option(False, "--json", help="Print {runs, leaderboard} as one JSON object."),
) -> None:
    """List runs: status, target, policy, attempts and best speedup."""
    from tools.store import StoreError, open_db

    table = Table(title="kloop runs")
    table.add_column("run", no_wrap=True)
    for column in ("created", "status", "target", "policy", "attempts", "best x eager", "notes"):
        table.add_column(column)
    listed = []
    for path in db:
        try:
            store = open_db(path, create=False, readonly=True)
        except StoreError as e:
            fail(str(e))
        for run in store.list_runs():
            listed.append({"db": str(path), **{k: run[k] for k in (
                "id", "created_at", "status", "target_name", "policy", "model", "attempts_count",
                "best_speedup_eager", "notes", "gpu_name", "parent_run_id", "parent_kind")}})
            best = run["best_speedup_eager"]
            table.add_row(run["id"], run["created_at"], run["status"], run["target_name"],
                          run["policy"] + (f" ({run['model']})" if run["model"] else ""), str(run["attempts_count"]),
                          f"{best:.2f}" if best is not None else "-", run["notes"] or "")
    if as_json:
        print(json.dumps({"runs": listed, "leaderboard": _leaderboard(db)}, default=str))
        return
    console.print(table)
    _print_leaderboard(db)


def _leaderboard(db_paths: list[Path]) -> list[dict]:
    from tools.report import ReportError, leaderboard

    try:
        return leaderboard(db_paths)
    except ReportError as e:
        fail(str(e))


def _print_leaderboard(db_paths: list[Path]) -> None:
    """The best verified kernel of each target across all the databases given."""
    rows = _leaderboard(db_paths)
    if not rows:
        return
    board = Table(title="leaderboard: best verified kernel per target")
    for column in ("target", "run", "attempt", "language", "time us", "x eager", "x compile", "SOL", "GPU"):
        board.add_column(column, no_wrap=column in ("target", "run"))
    for r in rows:
        board.add_row(r["target"], r["run"], str(r["attempt"]), r["language"], _num(r["time_us"], "{:.1f}"),
                      _num(r["speedup_eager"], "{:.2f}"), _num(r["speedup_compile"], "{:.2f}"),
                      _num(r["sol_fraction"], "{:.0%}"), r["gpu"] or "no GPU")
    console.print(board)


def show_command(
    run_id: str = typer.Argument(..., help="The run to show."),
    as_json: bool = typer.Option(False, "--json", help="Print the run and all its attempts as one JSON object."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="Run database."),
) -> None:
    """Show one run's attempts: verdicts, speedups, speed-of-light fractions, reasons."""
    from tools.store import StoreError, open_db

    try:
        store = open_db(db, create=False, readonly=True)
        run = store.get_run(run_id)
    except StoreError as e:
        fail(str(e))
    attempts = store.attempts(run_id)
    if as_json:
        print(json.dumps({"run": run, "attempts": attempts}, default=str))
        return
    console.print(f"run {run_id}: {run['target_name']}, {run['policy']}, {run['status']}"
                  + (f" ({run['notes']})" if run["notes"] else ""), highlight=False)
    table = Table("#", "branch", "lang", "what", "verdict", "x eager", "x compile", "SOL", "median us", "why")
    for a in attempts:
        table.add_row(str(a["number"]), str(a["branch"]), a["language"] or "", attempt_label(a["source"] or ""),
                      a["verdict"] or "", _num(a["speedup_eager"], "{:.2f}"), _num(a["speedup_compile"], "{:.2f}"),
                      _num(a["sol_fraction"], "{:.0%}"), _num((a["time_us"] or {}).get("median"), "{:.2f}"),
                      (a["reasons"] or [""])[0][:80])
    console.print(table)
    if attempts and not any((a["time_us"] or {}).get("median") for a in attempts):
        console.print("no attempt was timed (no CUDA GPU): correct attempts are not ranked, the first one stays "
                      "the best", highlight=False)


# -- shared -----------------------------------------------------------------------------------------------------
def _load_target(spec: str):
    from agent.cmd_eval import check_reference
    from tools.target import TargetError, load_target

    try:
        tgt = load_target(spec)
        check_reference(tgt)
    except TargetError as e:
        fail(str(e))
    return tgt


def _make_policy(name: str, settings: dict, tgt, store):
    from agent.policies import make_policy, model_policy_settings
    from agent.policy import PolicyError

    if name == "offline":
        kwargs = {"target": tgt, "seed_kernel": settings.get("seed_kernel"), "store": store,
                  "remembered": settings.get("memory_seeds")}
    elif name == "replay":
        kwargs = {"store": store, "source_run_id": settings["from_run"]}
    else:
        kwargs = model_policy_settings(name, settings)
    try:
        return make_policy(name, **kwargs)
    except PolicyError as e:
        fail(str(e))


def _run(store, run_id: str, settings: dict, tgt, policy, extend: bool = False) -> None:
    from agent.policy import PolicyError
    from tools.store import StoreError
    from tools.target import TargetError

    run = store.get_run(run_id)
    gpu = run.get("gpu")
    if gpu is None:  # a run made before runs.gpu existed, or one started without a GPU: this machine's facts
        gpu = _gpu_info()
        if gpu is not None:
            store.update_run(run_id, **_gpu_columns(gpu))
    progress = ProgressView(settings["max_attempts"])
    try:
        with console.status("starting", spinner="dots") as status:
            progress.status = status
            run_graph(store, run_id, settings, tgt, policy, gpu, progress, extend=extend)
    except KeyboardInterrupt:
        console.print(f"stopped; continue with `kloop resume {run_id} --db {store.path}`", highlight=False)
        raise typer.Exit(130)
    except (TargetError, PolicyError, StoreError) as e:  # the run is marked failed and can be resumed
        fail(f"{e} (run {run_id} failed; `kloop resume {run_id} --db {store.path}` retries)")
    run = store.get_run(run_id)
    console.print(f"run {run_id} finished: {run['notes']}", highlight=False)
    from agent.learn import after_run
    for line in after_run(store, run_id, policy, settings, tgt):
        console.print(line, highlight=False)
    _print_best(store, run_id)


def run_graph(store, run_id: str, settings: dict, tgt, policy, gpu: dict | None, on_event,
              extend: bool = False) -> None:
    """The loop itself, shared by `kloop optimize`, `resume` and `bench`: the evaluator's session, the graph.
    extend: the run had finished and was given new budgets; its graph starts again from its logged attempts.
    Without a GPU, `auto` writes Triton only: PTX would be assembled but never run, an attempt spent unranked."""
    from agent.graph import Loop, LoopSettings, run_loop
    from sandbox.evaluate import DEVICE, EvalSettings, Session

    # A planner takes seconds to start (torch, CUDA, Triton): keep enough started ahead that a candidate rarely
    # waits. The CPU machine has two cores to share. A fresh secret seed per session; it is never stored.
    spares = min(2 * settings["branches"], 8) if DEVICE.type == "cuda" else 1
    with Session(spares=spares, settings=EvalSettings()) as session:
        store.update_run(run_id, isolation=session.isolation)
        if session.weakly_isolated:
            console.print(f"warning: candidates run with weaker isolation: {session.isolation}", highlight=False)
        best = store.best_attempt(run_id)
        if best is not None and (best["time_us"] or {}).get("median"):  # a resumed run: its best is the bar again
            session.restore_best(tgt, best["source"], best["number"], best["time_us"]["median"])
        loop = Loop(store=store, run_id=run_id, policy=policy, gpu=gpu,
                    evaluation=lambda source: session.evaluation(tgt, source),
                    settings=LoopSettings(**{k: settings[k] for k in (
                        "max_attempts", "hours", "branches", "target_sol", "patience", "max_cost_usd", "max_tokens",
                        "language")} | ({"language": "triton"} if settings["language"] == "auto"
                                        and DEVICE.type != "cuda" else {}) | loop_search_settings(settings)),
                    target_name=tgt.name, target_source=shown_source(tgt.source))
        run_loop(loop, Path(f"{store.path}.checkpoints"), on_event, restart=extend)


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


def _default_memory(db: Path) -> Path:
    from agent.learn import default_memory

    return default_memory(db)


class ProgressView:
    """Renders the graph's custom stream events: the current stage on a spinner, one line per attempt."""

    def __init__(self, max_attempts: int):
        self.max_attempts = max_attempts
        self.status = None

    def __call__(self, event: dict) -> None:
        if event["kind"] == "stage" and self.status is not None:
            self.status.update(f"branch {event['branch']}: {event['stage']}")
        elif event["kind"] == "attempt":
            p, left = event["progress"], event["left"]
            color = "green" if event["verdict"] == "correct" else "red"
            speed = f" {event['speedup_eager']:.2f}x eager" if event["speedup_eager"] is not None else ""
            sol = f" SOL {event['sol_fraction']:.0%}" if event["sol_fraction"] is not None else ""
            why = f" ({event['reasons'][0][:100]})" if event["reasons"] and event["verdict"] != "correct" else ""
            best = (f"best #{p['best_number']}" + (f" {p['best_speedup']:.2f}x" if p["best_speedup"] else "")
                    + (f" SOL {p['best_sol']:.0%}" if p["best_sol"] is not None else "")) if p["best_number"] else "no best yet"
            if p["best_number"] and p["best_speedup"] is None:
                best += " (untimed: no GPU to rank by)"
            what = " ".join(x for x in (event.get("language") or "", attempt_label(event.get("source") or "")) if x)
            what = f" {escape(what)}:" if what else ""
            budget = ", ".join(_left_words(left))
            console.print(f"#{event['number']} (branch {event['branch']}){what} [{color}]{event['verdict']}[/]{speed}"
                          f"{sol}{escape(why)} | {best} | left: {budget}", highlight=False)
        elif event["kind"] == "api_error":
            console.print(f"branch {event['branch']}: {event['error']} ({event['failures']} in a row; "
                          "no attempt was spent)", highlight=False)
        elif event["kind"] == "stop":
            console.print(f"branch {event['branch']} stops: {event['reason']}", highlight=False)


def attempt_label(source: str) -> str:
    """What distinguishes an attempt, in a few words: the offline policy's template and values (its first line), else
    the names of the kernels the source defines."""
    import re

    from agent.policies.offline import read_marker

    marker = read_marker(source)
    if marker:
        values = ", ".join(f"{k}={v}" for k, v in (marker.get("values") or {}).items())
        edit = f" ptx_edit={marker['ptx_edit']}" if marker.get("ptx_edit") else ""
        return f"{marker.get('template')}" + (f" {values}" if values else "") + edit
    kernels = re.findall(r"@triton\.jit[^\n]*\n(?:\s*@[^\n]*\n)*\s*def\s+(\w+)", source)
    kernels += re.findall(r"\.entry\s+(\w+)", source)
    return ", ".join(dict.fromkeys(kernels))


def check_budgets(hours: float | None, max_cost: float | None) -> None:
    """An empty budget would make an empty run: refused before anything is created."""
    if hours is not None and not hours > 0:
        fail(f"--hours must be more than 0, got {hours:g}")
    if max_cost is not None and not max_cost > 0:
        fail(f"--max-cost must be more than 0, got {max_cost:g}")


def _has_gpu() -> bool:
    from tools.inputs import DEVICE

    return DEVICE.type == "cuda"


def _left_words(left: dict) -> list[str]:
    words = {"attempts": lambda v: plural(v, "attempt"), "seconds": lambda v: duration(v / 3600),
             "cost_usd": lambda v: f"${v:.2f}", "tokens": lambda v: plural(v, "token")}
    return [words[k](v) if k in words else f"{v} {k}" for k, v in left.items()]


def _budget_words(settings: dict) -> list[str]:
    words = [plural(settings["max_attempts"], "attempt")]
    if settings.get("hours") is not None:
        words.append(duration(settings["hours"]))
    if settings.get("patience") is not None:
        words.append(f"patience {settings['patience']}")
    return words


def _gpu_info() -> dict | None:
    """The GPU facts of this machine (the evaluator's `gpu` dict), None without one: computed once per run."""
    from tools.profile import gpu_info

    return gpu_info()


def _gpu_columns(gpu: dict | None) -> dict:
    if gpu is None:
        return {}
    return {"gpu": gpu, "gpu_name": gpu.get("name"), "driver": gpu.get("driver"), "cuda": gpu.get("cuda")}


def _print_best(store, run_id: str) -> None:
    best = store.best_attempt(run_id)
    if best is None:
        console.print("no attempt verified correct", highlight=False)
        return
    path = store.path.parent / f"{run_id}_best_{best['number']}.py"
    path.write_text(best["source"])
    console.print(f"best verified kernel: attempt {best['number']} ({best['language']}), written to {path}",
                  highlight=False)
    print_code(console, best["source"])  # never wrapped or cropped: valid Python when piped
    result = EvalResult.from_dict(best["result"])
    if result.executed_on != "cuda":
        console.print("no CUDA GPU: this was an interpreter run on CPU tensors, so no timing is real "
                      "(speedups and speed-of-light need a GPU)", highlight=False)
        return
    console.print(f"speedup {_num(best['speedup_eager'], '{:.2f}x')} over eager, "
                  f"{_num(best['speedup_compile'], '{:.2f}x')} over torch.compile, "
                  f"{_num(best['sol_fraction'], '{:.0%}')} of speed-of-light", highlight=False)


def shown_source(source: str) -> str:
    """The target as the policy sees it: hidden shape variants removed (they are checked, never shown)."""
    import ast

    lines = source.split("\n")
    for node in reversed(ast.parse(source).body):
        names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
        if any(name.endswith("VARIANTS") and name.startswith("KLOOP_") for name in names):
            del lines[node.lineno - 1:node.end_lineno]
    return "\n".join(lines)


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
