"""`kloop suite`: the loop on every problem of a KernelBench-style problem set, then the report.

A command-line adapter: options become an agent.suite.SuitePlan, agent.suite runs it (through agent.run), its events
are rendered here, tools.records.suite_report writes the report; SuiteError / RunError become one line and exit 2.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from agent.output import fail, make_console, plural
from agent.progress import ProgressView, clock_words
from tools.records.store import DEFAULT_DB

console = make_console()
DEFAULT_OUT = Path("runs/suite-report")


def suite_command(
    paths: List[Path] = typer.Argument(..., help="A KernelBench checkout (its level1, level2, ... folders), folders of KernelBench-style files, or single files."),
    levels: Optional[str] = typer.Option(None, metavar="LIST", help="Comma-separated levels to run, e.g. 1,2 (default: every level found)."),
    problems: Optional[str] = typer.Option(None, metavar="GLOBS", help="Only problems whose file name or key matches one of these comma-separated globs, e.g. '1_*,2*_*' or '*Softmax*'."),
    rerun: Optional[str] = typer.Option(None, metavar="GLOBS", help="Run these problems again even where finished (after a fix; their earlier runs stay in the database), e.g. '17_*,34_*'."),
    policy: Optional[str] = typer.Option(None, metavar="NAME", help="offline, anthropic or openai (default: anthropic when ANTHROPIC_API_KEY is set, else offline)."),
    strategy: str = typer.Option("refine", metavar="NAMES", help="Search strategy, or several comma-separated to compare at an equal budget: refine, best-of-n, metr, evolve."),
    minutes_per_problem: Optional[float] = typer.Option(None, metavar="M", help="Active time budget of each problem's run, in minutes."),
    max_attempts: Optional[int] = typer.Option(None, min=1, metavar="N", help="Attempts per problem (default 8 unless --minutes-per-problem is given)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", metavar="PATH", help="Run database: every problem's run, and the suite's own bookkeeping (created if missing)."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", metavar="DIR", help="Folder for the report (report.md, problems.csv, report.json, PNGs)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report's JSON on stdout (progress goes to stderr)."),
    language: str = typer.Option("auto", metavar="LANG", help="triton, ptx or auto."),
    model: Optional[str] = typer.Option(None, metavar="ID", help="Model id for the anthropic/openai policies."),
    base_url: Optional[str] = typer.Option(None, metavar="URL", help="API base URL for the anthropic/openai policies."),
    jobs: Optional[int] = typer.Option(None, min=1, metavar="N", help="Offline policy: starters generated in parallel per lane, in the background while problems run (default: half the CPU cores, at most 8)."),
    report_only: bool = typer.Option(False, "--report-only", help="Write the report from the database; run nothing."),
    gpus: Optional[str] = typer.Option(None, metavar="LIST", help="all, or GPU indices (0,1,...): one executor and referee per GPU, and one problem per GPU at a time (default: this process's GPU)."),
    lanes: Optional[int] = typer.Option(None, min=1, metavar="N", help="Problems run side by side, each with an evaluator of its own (default: one per GPU of --gpus; 1 spreads each problem over all of them; several without --gpus only on a CPU)."),
    ray: Optional[str] = typer.Option(None, metavar="ADDRESS", help="auto, or a Ray cluster address: planners as Ray tasks, one executor actor per GPU (pip install -e '.\\[ray]')."),
    planners: Optional[int] = typer.Option(None, min=1, metavar="N", help="Candidates planned at once (default: the CPU cores the trusted processes leave)."),
    pipeline: Optional[int] = typer.Option(None, min=1, metavar="N", help="Attempts in flight per problem (default: enough to keep planners and GPUs busy with the offline policy, 1 with a model)."),
    starter_cache: Optional[Path] = typer.Option(None, "--starter-cache", metavar="DIR", help="Offline policy: the folder where Inductor starters are kept across suites, per problem source, GPU architecture and torch/Triton versions (default: $KLOOP_STARTER_CACHE, else ~/.cache/kloop/starters)."),
    starter_timeout: Optional[float] = typer.Option(None, "--starter-timeout", metavar="S", help="Offline policy: seconds one starter generation may take (default 300); a problem whose generation ran out of a shorter limit is tried again."),
    compile_mode: str = typer.Option("default", metavar="MODE", help="torch.compile mode of the compile baseline: default (KernelBench's published baselines) or max-autotune-no-cudagraphs (the stronger bar)."),
) -> None:
    """Run the loop on every problem of a KernelBench-style set (one run per problem and strategy, one database,
    resumable), then report correctness, fast_p, geomean speedups, speed-of-light fractions and effort."""
    import os

    from agent import run as runs
    from agent import suite
    from tools.records.store import StoreError, open_db

    policy = policy or runs.default_policy()
    try:
        level_list = _levels(levels)
        found = suite.discover(paths, level_list, problems)
        plan = suite.SuitePlan(found, policy=policy, strategies=[s.strip() for s in strategy.split(",") if s.strip()],
                               max_attempts=max_attempts, minutes=minutes_per_problem, language=language, model=model,
                               base_url=base_url, jobs=jobs or max(1, min(8, (os.cpu_count() or 2) // 2)),
                               compile_mode=compile_mode, lanes=lanes, rerun=rerun, starter_timeout_s=starter_timeout,
                               starter_cache=str(starter_cache) if starter_cache is not None else None,
                               evaluator={"gpus": gpus, "ray": ray, "planners": planners, "pipeline": pipeline})
        if not report_only:
            suite.check_plan(plan)
    except (suite.SuiteError, runs.RunError) as e:
        fail(str(e))
    _check_out(out)
    if report_only and not db.exists():
        fail(f"no run database at {db}")
    try:
        store = open_db(db)
        suite.ensure_tables(store)
    except StoreError as e:
        fail(str(e))
    to_stdout = contextlib.redirect_stdout(sys.stderr) if as_json else contextlib.nullcontext()
    stopped = False
    with to_stdout:
        if not report_only:
            _announce(store, plan, db)
            view = SuiteView(plan)
            try:
                with console.status("starting", spinner="dots") as status:
                    view.status = status
                    suite.run_suite(store, plan, view)
            except KeyboardInterrupt:
                stopped = True
                console.print("suite stopped; the same command continues it (finished problems are skipped)",
                              highlight=False)
        paths_written = _report(store, plan, out, None if report_only else view.starters)
    if as_json:
        print((out / "report.json").read_text().rstrip())
    else:
        for line in _summary_lines(out / "report.json"):
            console.print(line, highlight=False)
        console.print(f"report: {', '.join(str(p) for p in paths_written)}", highlight=False)
    if stopped:
        raise typer.Exit(130)


class SuiteView:
    """Renders the suite's events: starters as they are generated, a line per problem with the suite's progress,
    the loop's attempt lines (agent.progress.ProgressView), and each problem's outcome."""

    def __init__(self, plan, clock=time.monotonic):
        self.attempts = ProgressView(plan.max_attempts or 0, console, clock=clock)
        self.status = None
        self.clock = clock
        self.started = clock()
        self.finished_here = 0   # problems finished since this command started (a resumed suite skips the rest)
        self.starters: dict | None = None   # the starter cache's hits and misses (the `starters` event)

    def __call__(self, event: dict) -> None:
        kind = event["kind"]
        line = lambda text: console.print(text, highlight=False, markup=False)  # noqa: E731
        if kind == "starters":
            self.starters = event
            if event["hits"] or event["misses"]:
                line(f"starters: {event['hits']} from the cache, {event['misses']} to generate ({event['cache']})")
        elif kind == "starter":
            made = "from the cache" if event.get("cached") else f"in {event['seconds']:.0f} s"
            what = f"starter {made}" if event["ok"] else f"no starter: {event['error']}" if event.get("kept", True) \
                else f"generation stopped, nothing kept (the problem's run generates its own): {event['error']}"
            line(f"starter {event['done']}/{event['total']} {event['problem']}: {what}")
            if self.status is not None:
                self.status.update(f"generating starters {event['done']}/{event['total']}")
        elif kind == "starter_later":
            line(f"starter of {event['problem']} left for later after {event['seconds']:.0f} s ({event['why']}): "
                 "generated again alone")
        elif kind == "problem":
            fast = "untimed" if not event["timed"] else \
                f"{event['fast_1_eager']} vs eager, {event['fast_1_compile']} vs torch.compile"
            line(f"[{event['index'] + 1}/{event['total']}] {event['problem']} ({event['strategy']}) | done "
                 f"{event['done']}, left {event['left']} | verified {event['verified']} | fast_1 {fast} | "
                 f"{self.time_words(event['left'])}")
            if self.status is not None:
                self.status.update(f"{event['problem']} ({event['strategy']})")
                self.attempts.status = self.status
        elif kind == "problem_done":
            self.finished_here += 1
            best = event["best"]
            if event["status"] in ("skipped", "failed"):
                outcome = f"{event['status']}: {event['reason']}"
            elif best is None:
                outcome = "no verified kernel"
            elif best["timed"]:   # a degenerate target's kernel (its output constant) gets no speedup
                speedups = [f"{best[key]:.2f}x {name}" for key, name in (("speedup_eager", "eager"),
                                                                         ("speedup_compile", "torch.compile"))
                            if best[key] is not None]
                outcome = f"verified (attempt {best['number']}): {', '.join(speedups) or 'no speedup recorded'}"
            else:
                outcome = f"verified (attempt {best['number']}; untimed: no GPU)"
            line(f"  -> {event['problem']}: {outcome}")
        else:
            self.attempts(event)


    def time_words(self, left: int) -> str:
        """`12 min elapsed, ~40 min left`: the problems left at the pace of those finished by this command."""
        elapsed = self.clock() - self.started
        words = f"{clock_words(elapsed)} elapsed"
        if self.finished_here and left:
            words += f", ~{clock_words(elapsed / self.finished_here * left)} left"
        return words


def _announce(store, plan, db: Path) -> None:
    """What the suite runs, and a note where the database finished its problems under other settings."""
    from agent import suite

    strategies = ", ".join(plan.strategies)
    console.print(f"suite of {plural(len(plan.problems), 'problem')} x "
                  f"{plural(len(plan.strategies), 'strategy', 'strategies')} ({strategies}) with the {plan.policy} "
                  f"policy, {_budget(plan)} each, in {db}", highlight=False)
    if (note := suite.other_settings_note(store, plan)) is not None:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def _report(store, plan, out: Path, starters: dict | None = None) -> list[Path]:
    from agent import suite
    from tools.records.suite_report import SuiteReportError, write_suite_report

    title = ", ".join(dict.fromkeys(p.key.split("/")[0] if p.level is not None else "problems"
                                    for p in plan.problems))
    context = {"title": f"{len(plan.problems)} problems ({title}), {plan.policy} policy",
               "settings": {"policy": plan.policy, "model": plan.model, "strategies": ",".join(plan.strategies),
                            "budget per problem": _budget(plan), "torch.compile mode": plan.compile_mode,
                            "database": str(store.path)}}
    if starters is not None and (starters["hits"] or starters["misses"]):
        context["settings"]["starter cache"] = (f"{starters['hits']} hits, {starters['misses']} misses "
                                                f"({starters['cache']})")
    try:
        return write_suite_report(store, suite.rows_of(store, plan), out, context)
    except SuiteReportError as e:
        fail(str(e))


def _summary_lines(report_json: Path) -> list[str]:
    document = json.loads(report_json.read_text())
    s = document["summary"]
    lines = [f"{s['verified']}/{s['finished']} problems with a verified kernel"
             + (f" ({s['problems'] - s['finished']} not finished)" if s["finished"] < s["problems"] else "")]
    if s["timing_is_real"]:
        counts = s["fast_p_counts"]
        lines.append("fast_1 " + f"{counts['eager']['1']} vs eager, {counts['compile']['1']} vs torch.compile; "
                     + "geomean (verified) " + ", ".join(
                         f"{(s['geomean'][b]['verified_only'] or 0):.2f}x {b}" for b in ("eager", "compile")))
    elif s["finished"] == 0:
        lines.append("no problem finished yet: nothing to time")
    else:
        lines.append("no CUDA GPU: nothing was timed (no speedups)")
    return lines


def _levels(text: str | None) -> list[int] | None:
    from agent.suite import SuiteError

    if text is None:
        return None
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SuiteError(f"--levels takes comma-separated numbers such as 1,2, not {text!r}") from None
    if not levels:
        raise SuiteError("--levels names no level")
    return levels


def _budget(plan) -> str:
    return f"{plan.minutes:g} min" if plan.minutes is not None else f"{plan.max_attempts} attempts"


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        fail(f"--out {out} is a file, not a folder")
