"""`kloop optimize`, `kloop resume`, `kloop runs`, `kloop show`: start, continue and look at optimization runs.

A command-line adapter: options become settings, agent.run starts, resumes and runs the run, agent.progress
renders its events; RunError becomes one line and exit 2 (`fail`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from agent import run as runs
from agent.output import fail, make_console, plural, print_code
from agent.progress import ProgressView, attempt_label, budget_words, shorten
from agent.run import RunError, RunFailed, RunFinished
from tools.records.store import DEFAULT_DB, Attempt

console = make_console()


BUDGET, POLICY, SEARCH, EVALUATOR = "Budget and stop rules", "Policy and model", "Search and memory", "Evaluator"


def optimize_command(
    target: str = typer.Argument(..., help="A built-in target name (see `kloop targets`) or a path to a KernelBench-style module."),
    policy: Optional[str] = typer.Option(None, metavar="NAME", rich_help_panel=POLICY, help="offline, anthropic, openai or replay (default: anthropic when ANTHROPIC_API_KEY is set, else offline)."),
    language: str = typer.Option("auto", metavar="LANG", help="triton, ptx or auto (the policy chooses)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", metavar="PATH", help="Run database (created if missing)."),
    seed_kernel: Optional[Path] = typer.Option(None, metavar="FILE", help="A kernel to start from; the offline policy tunes its UPPERCASE constants."),
    max_attempts: int = typer.Option(20, min=1, metavar="N", rich_help_panel=BUDGET, help="Stop after this many attempts."),
    hours: Optional[float] = typer.Option(None, metavar="H", rich_help_panel=BUDGET, help="Stop after this much active wall-clock time."),
    target_sol: float = typer.Option(0.9, min=0, metavar="F", rich_help_panel=BUDGET, help="Stop once the best kernel reaches this fraction of speed-of-light."),
    patience: int = typer.Option(20, min=1, metavar="N", rich_help_panel=BUDGET, help="Stop after this many attempts without a new best."),
    max_cost: Optional[float] = typer.Option(None, metavar="USD", rich_help_panel=BUDGET, help="Stop once model calls cost this many US dollars."),
    max_tokens: Optional[int] = typer.Option(None, min=1, metavar="N", rich_help_panel=BUDGET, help="Stop once model calls used this many tokens."),
    model: Optional[str] = typer.Option(None, metavar="ID", rich_help_panel=POLICY, help="Model id for the anthropic/openai policies."),
    base_url: Optional[str] = typer.Option(None, metavar="URL", rich_help_panel=POLICY, help="API base URL for the anthropic/openai policies."),
    from_run: Optional[str] = typer.Option(None, "--from", metavar="RUN", rich_help_panel=POLICY, help="replay policy: the run whose proposals to replay."),
    thinking: Optional[str] = typer.Option(None, metavar="MODE", rich_help_panel=POLICY, help="anthropic policy: extended thinking, 'adaptive' (default), 'off' or a token budget."),
    effort: Optional[str] = typer.Option(None, metavar="LEVEL", rich_help_panel=POLICY, help="anthropic policy: output effort (e.g. low, medium, high; default: the model's)."),
    max_retries: Optional[int] = typer.Option(None, min=0, metavar="N", rich_help_panel=POLICY, help="anthropic/openai policies: SDK retries (with backoff) per model call."),
    no_tools: bool = typer.Option(False, "--no-tools", rich_help_panel=POLICY, help="openai policy: for servers without function calling (fenced code answers)."),
    strategy: str = typer.Option("refine", metavar="NAME", rich_help_panel=SEARCH, help="Search strategy: refine, best-of-n, metr or evolve (README: Search strategies and memory)."),
    strategy_seed: Optional[int] = typer.Option(None, metavar="N", rich_help_panel=SEARCH, help="Seed of the strategy's random picks (default: drawn once, stored with the run)."),
    branches: int = typer.Option(1, min=1, metavar="N", rich_help_panel=SEARCH, help="Parallel lineages sharing the run's best."),
    memory: Optional[Path] = typer.Option(None, metavar="PATH", rich_help_panel=SEARCH, help="Memory file across runs (default: memory.db beside --db, so runs/memory.db)."),
    no_memory: bool = typer.Option(False, "--no-memory", rich_help_panel=SEARCH, help="Neither read nor write memory across runs."),
    gpus: Optional[str] = typer.Option(None, metavar="LIST", rich_help_panel=EVALUATOR, help="all, or GPU indices (0,1,...): one executor and referee per GPU, each candidate timed on the first free one (default: this process's GPU)."),
    ray: Optional[str] = typer.Option(None, metavar="ADDRESS", rich_help_panel=EVALUATOR, help="auto, or a Ray cluster address: planners as Ray tasks, one executor actor per GPU of the cluster (pip install -e '.\\[ray]')."),
    planners: Optional[int] = typer.Option(None, min=1, metavar="N", rich_help_panel=EVALUATOR, help="Candidates planned (compiled) at once, each in its own jailed planner (default: the CPU cores the trusted processes leave)."),
    pipeline: Optional[int] = typer.Option(None, min=1, metavar="N", rich_help_panel=EVALUATOR, help="Attempts in flight per branch, proposed ahead and logged in order (default: enough to keep planners and GPUs busy with the offline policy, 1 with a model)."),
    compile_mode: str = typer.Option("max-autotune-no-cudagraphs", metavar="MODE", rich_help_panel=EVALUATOR, help="torch.compile mode of the compile baseline: max-autotune-no-cudagraphs or default."),
) -> None:
    """Optimize one target's kernel: write, assemble, verify, profile, reflect, log; repeat until a stop rule."""
    policy = policy or runs.default_policy()
    _check_early(policy, base_url, model)
    settings = runs.settings_for(
        target, language=language, max_attempts=max_attempts, hours=hours, branches=branches, target_sol=target_sol,
        patience=patience, max_cost_usd=max_cost, max_tokens=max_tokens, seed_kernel=seed_kernel, model=model,
        base_url=base_url, from_run=from_run, thinking=thinking, effort=effort, max_retries=max_retries, tools=not no_tools,
        **runs.strategy_settings(strategy, strategy_seed),
        memory=None if no_memory else str((memory or _default_memory(db)).resolve()),
        gpus=gpus, ray=ray, planners=planners, pipeline=pipeline, compile_mode=compile_mode)
    try:
        run = runs.start_in(db, policy, settings)
    except RunError as e:
        fail(str(e))
    console.print(f"run [bold]{run.id}[/] in {db}: {run.target.name} with the {policy} policy "
                  f"(resume with `kloop resume {run.id} --db {db}`)", highlight=False)
    _run(run)


def _check_early(policy: str, base_url: str | None, model: str | None) -> None:
    """What a typo or a missing key gets wrong, refused at once: the rest of the checks import torch (seconds)."""
    import os

    if policy not in runs.POLICIES:
        fail(f"unknown policy {policy!r} (one of {', '.join(runs.POLICIES)})")
    if policy == "anthropic" and not os.environ.get("ANTHROPIC_API_KEY"):
        fail("no Anthropic API key: set ANTHROPIC_API_KEY (or use --policy offline)")
    if policy == "openai" and not model:
        fail("--policy openai needs --model (the name the server serves)")
    if policy == "openai" and not base_url and not os.environ.get("OPENAI_API_KEY"):
        fail("no OpenAI API key: set OPENAI_API_KEY, or pass --base-url for a local server")


def resume_command(
    run_id: str = typer.Argument(..., help="The run to continue."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="Run database."),
    max_attempts: Optional[int] = typer.Option(None, min=1, help="New attempt budget for the whole run (extends a finished run)."),
    hours: Optional[float] = typer.Option(None, help="New active-time budget for the whole run, in hours (extends a finished run)."),
    patience: Optional[int] = typer.Option(None, min=1, help="New number of attempts without a new best before stopping."),
) -> None:
    """Continue a stopped, failed or killed run where it left off (same attempt numbering); with new budgets,
    extend a finished one."""
    from tools.records.store import StoreError, open_db

    try:
        store = open_db(db, create=False)
        run = runs.resume(store, run_id, max_attempts=max_attempts, hours=hours, patience=patience)
    except RunFinished as e:
        console.print(f"{e}; give it more with `kloop resume {run_id} --db {db} --max-attempts N` (or --hours H)",
                      highlight=False)
        _print_best(store, run_id)
        return
    except (RunError, StoreError) as e:
        fail(str(e))
    verb = "extending finished" if run.extend else f"continuing {run.previous_status}"
    console.print(f"{verb} run [bold]{run.id}[/] in {db}: {run.target.name} with the {run.policy_name} policy, "
                  f"{plural(run.attempts_before, 'attempt')} so far; budget: {', '.join(budget_words(run.settings))}",
                  highlight=False)
    _run(run)


def runs_command(
    db: List[Path] = typer.Option([DEFAULT_DB], "--db", help="Run database(s); repeat for several."),
    as_json: bool = typer.Option(False, "--json", help="Print {runs, leaderboard} as one JSON object."),
) -> None:
    """List runs: status, target, policy, attempts and best speedup."""
    from tools.records.store import StoreError, open_db

    table = Table(title="kloop runs", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in ("run", "created", "status", "target", "policy", "tries", "best x"):
        table.add_column(column, no_wrap=column != "policy")
    narrow = _narrow()
    if not narrow:
        table.add_column("notes")
    listed, notes = [], []
    for path in db:
        try:
            store = open_db(path, create=False, readonly=True)
        except StoreError as e:
            fail(str(e))
        for run in store.list_runs():
            listed.append({"db": str(path), **{k: run.get(k) for k in (
                "id", "created_at", "status", "target_name", "policy", "model", "attempts_count",
                "best_speedup_eager", "notes", "gpu_name", "parent_run_id", "parent_kind")},
                "stale": runs.liveness(run) or None})
            best = run["best_speedup_eager"]
            stale = runs.liveness(run)
            note = " ".join(x for x in (f"({stale})" if stale else "", run["notes"] or "") if x)
            table.add_row(run["id"], _when(run["created_at"]), run["status"], escape(run["target_name"]),
                          escape(run["policy"] + (f" ({run['model']})" if run["model"] else "")),
                          str(run["attempts_count"]), f"{best:.2f}" if best is not None else "-",
                          *([] if narrow else [escape(note)]))
            if note:
                notes.append(f"{run['id']}: {note}")
    if as_json:
        print(json.dumps({"runs": listed, "leaderboard": _leaderboard(db)}, default=str))
        return
    console.print(table)
    for line in notes if narrow else []:   # a narrow terminal: notes under the table, not squeezed into a column
        console.print(line, highlight=False, markup=False)
    _print_leaderboard(db)


def _narrow() -> bool:
    """A terminal too narrow for a free-text column beside the others (80 columns): that text goes under the table."""
    return console.is_terminal and console.width < 120


def _when(created_at: str | None) -> str:
    """`2026-11-21 21:38` (UTC) from the stored ISO time: the seconds and the zone cost a narrow terminal a column."""
    return (created_at or "")[:16].replace("T", " ")


def _leaderboard(db_paths: list[Path]) -> list[dict]:
    from tools.records.report import ReportError, leaderboard

    try:
        return leaderboard(db_paths)
    except ReportError as e:
        fail(str(e))


def _print_leaderboard(db_paths: list[Path]) -> None:
    """The best verified kernel of each target across all the databases given."""
    rows = _leaderboard(db_paths)
    if not rows:
        return
    board = Table(title="leaderboard: best verified kernel per target", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in ("target", "run", "#", "lang", "us", "x eager", "x comp", "SOL", "GPU"):
        board.add_column(column, no_wrap=column != "GPU")
    for r in rows:
        board.add_row(r["target"], r["run"], str(r["attempt"]), r["language"], _num(r["time_us"], "{:.1f}"),
                      _num(r["speedup_eager"], "{:.2f}"), _num(r["speedup_compile"], "{:.2f}"),
                      _num(r["sol_fraction"], "{:.0%}"), (r["gpu"] or "no GPU").removeprefix("NVIDIA "))
    console.print(board)


def show_command(
    run_id: str = typer.Argument(..., help="The run to show."),
    attempt: Optional[int] = typer.Option(None, "--attempt", "-a", help="Show this attempt whole: source, verdict, every reason, counters, timings, its parent and why the strategy picked it."),
    diff: bool = typer.Option(False, "--diff", help="With --attempt: the attempt's source as a diff against its parent's, in place of the whole source."),
    as_json: bool = typer.Option(False, "--json", help="Print the run and all its attempts (or the one --attempt) as one JSON object."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="Run database."),
) -> None:
    """Show one run's attempts (verdicts, speedups, speed-of-light fractions, reasons), or one attempt whole."""
    if diff and attempt is None:
        fail("--diff needs --attempt N (or use `kloop diff RUN A [B]`)")
    store, run = _open_run(db, run_id)
    attempts = store.attempts(run_id)
    if attempt is not None:
        row = _attempt(attempts, run_id, attempt)
        if as_json:
            print(json.dumps({"run": run, "attempt": row.to_dict()}, default=str))
        elif diff:
            _print_diff(_parent(attempts, row), row)
        else:
            _print_attempt(run, attempts, row)
        return
    if as_json:
        print(json.dumps({"run": run, "attempts": [a.to_dict() for a in attempts]}, default=str))
        return
    stale = runs.liveness(run)
    console.print(f"run {run_id}: {run['target_name']}, {run['policy']}, {run['status']}"
                  + (f" ({stale})" if stale else "") + (f" ({run['notes']})" if run["notes"] else ""),
                  highlight=False, markup=False)
    branched = len({a.branch for a in attempts}) > 1
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("#", no_wrap=True, justify="right")
    if branched:
        table.add_column("br", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for column in ("x eager", "x comp", "SOL", "us"):
        table.add_column(column, no_wrap=True, justify="right")
    table.add_column("what")
    # In a terminal a reason is cut to a line (`--attempt N` has them all), beside the attempt, or under the table
    # in a narrow one; piped, the table holds the first line of the first reason and every reason follows whole.
    narrow, cut = _narrow(), 100 if console.is_terminal else None
    if not narrow:
        table.add_column("why")
    whys = []
    for a in attempts:
        reasons = a.reasons or []
        first = reasons[0] if reasons else ""
        why = shorten(first, cut) if cut else first.splitlines()[0] if first else ""
        if why and narrow:
            whys.append(f"#{a.number}: {why}")
        table.add_row(str(a.number), *([str(a.branch)] if branched else []),
                      _verdict(a.verdict), _num(a.speedup_eager, "{:.2f}"), _num(a.speedup_compile, "{:.2f}"),
                      _num(a.sol_fraction, "{:.0%}"), _num(a.median_us, "{:.1f}"),
                      escape(" ".join(x for x in (a.language or "", attempt_label(a.source or "")) if x)),
                      *([] if narrow else [escape(why)]))   # escaped: candidate text is no markup
    console.print(table)
    for line in whys:
        console.print(line, highlight=False, markup=False)
    if not console.is_terminal:
        for a in attempts:
            if len(a.reasons or []) > 1 or "\n" in "".join(a.reasons or []):
                for reason in a.reasons:
                    console.print(f"#{a.number}: {reason}", highlight=False, markup=False)
    for a in attempts:
        for reason in a.withheld or []:   # the operator's own view of what the policy was not told
            console.print(f"#{a.number} withheld from the policy: {reason}", highlight=False, markup=False)
    if attempts and not any(a.timed for a in attempts):
        console.print("no attempt was timed (no CUDA GPU): correct attempts are not ranked, the first one stays "
                      "the best", highlight=False)
    if console.is_terminal and any(a.reasons for a in attempts):
        console.print(f"[dim]one attempt whole: kloop show {escape(run_id)} --attempt N (--diff: against its "
                      "parent)[/]", highlight=False)


def diff_command(
    run_id: str = typer.Argument(..., help="The run."),
    a: int = typer.Argument(..., help="An attempt number."),
    b: Optional[int] = typer.Argument(None, help="Another attempt number (default: A against its parent)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="Run database."),
) -> None:
    """Diff two attempts' sources, or one attempt against its parent (the attempt its strategy built on)."""
    store, run = _open_run(db, run_id)
    attempts = store.attempts(run_id)
    first = _attempt(attempts, run_id, a)
    if b is None:
        _print_diff(_parent(attempts, first), first)
    else:
        _print_diff(first, _attempt(attempts, run_id, b))


def _open_run(db: Path, run_id: str):
    from tools.records.store import StoreError, open_db

    try:
        store = open_db(db, create=False, readonly=True)
        return store, store.get_run(run_id)
    except StoreError as e:
        fail(str(e))


def _attempt(attempts: list[Attempt], run_id: str, number: int) -> Attempt:
    for row in attempts:
        if row.number == number:
            return row
    span = f"1 to {attempts[-1].number}" if attempts else "none"
    fail(f"run {run_id} has no attempt {number} (its attempts: {span})")


def _parent(attempts: list[Attempt], row: Attempt) -> Attempt | None:
    return next((a for a in attempts if a.id == row.parent_attempt_id), None)


def _verdict(verdict: str | None) -> str:
    return f"[{'green' if verdict == 'correct' else 'red'}]{verdict}[/]" if verdict else ""


def _print_attempt(run: dict, attempts: list[Attempt], a: Attempt) -> None:
    """One attempt whole: what it was, its verdict and every reason, its numbers, its parent and the strategy's
    reason for that parent, then its source as it is."""
    from tools.records.view import attempt_facts

    say = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731  (candidate text: no markup)
    console.print(f"attempt [bold]{a.number}[/] of run {escape(run['id'])} ({escape(run['target_name'])}): "
                  f"{_verdict(a.verdict)}", highlight=False)
    for name, value in attempt_facts(a, _parent(attempts, a)):
        say(f"{name}: {value}")
    if a.reasons:
        say("reasons:")
        for reason in a.reasons:
            say("  - " + reason.replace("\n", "\n    "))
    for reason in a.withheld or []:
        say(f"withheld from the policy: {reason}")
    say("source:")
    print_code(console, a.source or "")


def _print_diff(old: Attempt | None, new: Attempt) -> None:
    """A unified diff (difflib) of two attempts' sources; from nothing when the attempt had no parent."""
    from tools.records.view import source_diff

    if old is None:
        console.print(f"attempt {new.number} has no parent (it started from the target alone): the whole source "
                      "is new", highlight=False)
    text = source_diff(old, new)
    if not text:
        console.print(f"attempts {old.number} and {new.number} have the same source", highlight=False)
    elif console.is_terminal:
        from rich.syntax import Syntax

        console.print(Syntax(text, "diff", theme="ansi_dark"), soft_wrap=True)
    else:
        console.out(text.rstrip("\n"), highlight=False)


# -- shared -----------------------------------------------------------------------------------------------------
def _run(run) -> None:
    """Run it with a spinner and one line per attempt (and per thing memory kept), then where the best kernel was
    written; Ctrl-C says how to resume. Exit status 1 when no attempt was verified correct (as `kloop eval` on a
    failing kernel)."""
    progress = ProgressView(run.settings["max_attempts"], console)
    try:
        with console.status("starting", spinner="dots") as status:
            progress.status = status
            runs.run(run, progress)
    except KeyboardInterrupt:
        console.print(f"stopped; continue with `kloop resume {run.id} --db {run.store.path}`", highlight=False)
        raise typer.Exit(130)
    except RunFailed as e:  # the run is marked failed and can be resumed
        fail(f"{e} (run {run.id} failed; `kloop resume {run.id} --db {run.store.path}` retries)")
    row = run.store.get_run(run.id)
    console.print(f"run {run.id} finished: {row['notes']}", highlight=False, markup=False)
    if not _print_best(run.store, run.id):
        raise typer.Exit(1)


def _default_memory(db: Path) -> Path:
    from agent.learn import default_memory

    return default_memory(db)


def _print_best(store, run_id: str) -> bool:
    """Write the best verified kernel beside the database and say where, with its numbers (the kernel itself is in
    that file, and `kloop show RUN --attempt N` prints it); False when no attempt was verified."""
    best = store.best_attempt(run_id)
    if best is None:
        console.print(f"no attempt verified correct (why: `kloop show {run_id} --db {store.path}`)", highlight=False,
                      markup=False)
        return False
    path = store.path.parent / f"{run_id}_best_{best.number}.py"
    path.write_text(best.source)
    label = attempt_label(best.source or "")
    console.print(f"best verified kernel: attempt {best.number} ({best.language}"
                  + (f", {label}" if label else "") + f"), {len(best.source.splitlines())} lines written to {path}",
                  highlight=False, markup=False)
    if best.result.executed_on != "cuda":
        verified = sum(a.verdict == "correct" for a in store.attempts(run_id))
        console.print(f"no CUDA GPU: {plural(verified, 'attempt')} verified correct, none timed (the Triton "
                      "interpreter runs on CPU tensors, so no timing is real); untimed attempts cannot be ranked, so "
                      "the first verified one stays the best. Speedups and speed-of-light need a GPU", highlight=False)
        return True
    console.print(f"speedup {_num(best.speedup_eager, '{:.2f}x')} over eager, "
                  f"{_num(best.speedup_compile, '{:.2f}x')} over torch.compile, "
                  f"{_num(best.sol_fraction, '{:.0%}')} of speed-of-light", highlight=False)
    return True


def _num(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
