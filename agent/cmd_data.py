"""`kloop export`, `kloop replay`, `kloop report`: what researchers do with run databases after the runs."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from agent.cmd_eval import fail
from tools.store import DEFAULT_DB



def export_command(
    db: List[Path] = typer.Option([DEFAULT_DB], "--db", help="run database(s) to read; repeat for several"),
    format: str = typer.Option(..., "--format", "-f", help="trl, openai, kernelbook or rl"),
    out: Path = typer.Option(..., "--out", "-o", help="JSONL file to write (replaced atomically)"),
    turns: str = typer.Option("all", help="trl/openai: whole trajectories (all) or one example per submission (last)"),
    min_speedup: Optional[float] = typer.Option(None, help="keep kernels at least this much faster than eager"),
    language: Optional[str] = typer.Option(None, help="keep only triton or ptx kernels"),
    include_rejected: bool = typer.Option(False, "--include-rejected", help="keep trajectories that contain a rejected (rule-breaking) attempt; format errors never taint one"),
    all_verdicts: bool = typer.Option(False, "--all-verdicts", help="keep incorrect and failed submissions too (RL data)"),
    run: List[str] = typer.Option([], "--run", help="export only these run ids (repeatable)"),
) -> None:
    """Write training data from run databases: TRL / OpenAI chat, KernelBook pairs or per-turn RL records."""
    from tools.export import ExportError, ExportOptions, export

    options = ExportOptions(format=format, turns=turns, min_speedup=min_speedup, language=language,
                            include_rejected=include_rejected, all_verdicts=all_verdicts, run_ids=tuple(run))
    try:
        summary = export(db, out, options)
    except ExportError as e:
        fail(str(e))
    Console().print(f"wrote {summary.written} {format} line(s) from {summary.runs} run(s) to {out}"
                    f" ({summary.duplicates} duplicate kernel(s) left out)", highlight=False)


def replay_command(
    run_id: str = typer.Argument(..., help="the run whose attempts to re-verify"),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="run database to read (opened read-only unless --in-place)"),
    attempts: str = typer.Option("best", help="best, correct or all"),
    out_db: Path = typer.Option(DEFAULT_DB, "--out-db", help="run database the new, linked run is written to"),
    in_place: bool = typer.Option(False, "--in-place", help="write the new run into --db itself"),
) -> None:
    """Re-verify and re-time a run's attempts on this machine; store them as a new linked run and compare. The
    database read is never written to unless --in-place (or --out-db names it)."""
    from agent.output import make_console
    from agent.reverify import ReplayError, comparison_table, replay

    console = make_console()

    def progress(row) -> None:
        console.print(f"attempt {row.number}: {row.new['verdict']}", highlight=False)

    try:
        outcome = replay(run_id, db, attempts, on_attempt=progress, out_db=db if in_place else out_db)
    except ReplayError as e:
        fail(str(e))
    console.print(comparison_table(outcome))
    n = len(outcome.disagreements)
    console.print(f"new run {outcome.new_run_id} in {outcome.out_db} (reverify of {run_id} in {db}): "
                  f"{n} disagreement{'' if n == 1 else 's'}", highlight=False)


def report_command(
    run_id: str = typer.Argument(..., help="the run to report on"),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="run database"),
    out: Path = typer.Option(..., "--out", "-o", help="directory for the PNG plots and report.md"),
) -> None:
    """Plots (speedup and speed of light per attempt, roofline) and a markdown summary of one run."""
    from tools.report import ReportError, write_report

    try:
        written = write_report(run_id, db, out)
    except ReportError as e:
        fail(str(e))
    from agent.output import make_console

    make_console().print(f"wrote {', '.join(p.name for p in written)} to {out}", highlight=False)
