"""`kloop export`, `kloop reverify`, `kloop report`: what researchers do with run databases after the runs."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from agent.output import fail
from tools.records.store import DEFAULT_DB



def export_command(
    db: List[Path] = typer.Option([DEFAULT_DB], "--db", help="run database(s) to read; repeat for several"),
    format: str = typer.Option(..., "--format", "-f", help="trl, openai, rl, verl (parquet), kernelbook or flashinfer (a folder)"),
    out: Path = typer.Option(..., "--out", "-o", help="file to write (replaced atomically); flashinfer: a folder"),
    train_on: str = typer.Option("final", "--train-on", help="trl/openai: final (the best verified turn of each branch) or all-correct (every verified turn; failed turns stay context)"),
    min_speedup: Optional[float] = typer.Option(None, help="keep kernels at least this much faster than eager"),
    language: Optional[str] = typer.Option(None, help="keep only triton or ptx kernels"),
    include_rejected: bool = typer.Option(False, "--include-rejected", help="keep trajectories that contain a rejected (rule-breaking) attempt; format errors never taint one"),
    all_verdicts: bool = typer.Option(False, "--all-verdicts", help="trl/openai/kernelbook/flashinfer: failed submissions too, each row with label and verdicts (rl/verl always have every verdict)"),
    run: List[str] = typer.Option([], "--run", help="export only these run ids (repeatable)"),
    license: Optional[str] = typer.Option(None, "--license", help="the dataset's license (every row's provenance and the card)"),
    exclude: List[Path] = typer.Option([], "--exclude", help="evaluation problems (KernelBench-style files or folders): rows of matching targets are left out (repeatable)"),
    split_by: Optional[str] = typer.Option(None, "--split-by", help="target: write OUT's .train and .test files, no target in both"),
    test_fraction: float = typer.Option(0.1, "--test-fraction", help="with --split-by: the share of targets in test (by a stable hash of each)"),
    group_by: str = typer.Option("prompt", "--group-by", help="rl/verl group_id: prompt (rows with the same prompt) or target (every attempt at one target, across runs: GRPO groups with contrast)"),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="a tokenizer's local path or installed name (never downloaded): exact token counts; without it they are a conservative estimate"),
) -> None:
    """Write training data from run databases; only verified kernels are trained on (see README, Harvesting)."""
    from agent.prompting import export_prompts
    from tools.records.export import ExportError, ExportOptions, export

    options = ExportOptions(format=format, train_on=train_on, min_speedup=min_speedup, language=language,
                            include_rejected=include_rejected, all_verdicts=all_verdicts, run_ids=tuple(run),
                            license=license, exclude=tuple(map(str, exclude)), split_by=split_by,
                            test_fraction=test_fraction, tokenizer=tokenizer, group_by=group_by,
                            prompts=export_prompts())
    try:
        summary = export(db, out, options)
    except ExportError as e:
        fail(str(e))
    console = Console(soft_wrap=True)
    console.print(f"wrote {summary.written} {format} row(s) from {summary.runs} run(s) to {out}"
                  f" ({summary.duplicates} duplicate kernel(s), {summary.excluded} excluded run(s) left out)",
                  highlight=False)
    for line in summary.lines():
        console.print(line, highlight=False)
    console.print(f"files: {', '.join(summary.files)}", highlight=False)


def reverify_command(
    run_id: str = typer.Argument(..., help="the run whose attempts to re-verify"),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="run database to read (opened read-only unless --in-place)"),
    attempts: str = typer.Option("best", help="best, correct or all"),
    out_db: Path = typer.Option(DEFAULT_DB, "--out-db", help="run database the new, linked run is written to"),
    in_place: bool = typer.Option(False, "--in-place", help="write the new run into --db itself"),
) -> None:
    """Re-verify and re-time a run's attempts on this machine; store them as a new linked run and compare. The
    database read is never written to unless --in-place (or --out-db names it). Formerly `kloop replay`: that name
    still works for one release (replay is now only the policy that re-drives a run from its recorded answers)."""
    from agent.output import make_console
    from agent.reverify import ReverifyError, comparison_table, reverify

    console = make_console()

    def progress(row) -> None:
        console.print(f"attempt {row.number}: {row.new.verdict}", highlight=False)

    try:
        outcome = reverify(run_id, db, attempts, on_attempt=progress, out_db=db if in_place else out_db)
    except ReverifyError as e:
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
    from tools.records.report import ReportError, write_report

    try:
        written = write_report(run_id, db, out)
    except ReportError as e:
        fail(str(e))
    from agent.output import make_console

    make_console().print(f"wrote {', '.join(p.name for p in written)} to {out}", highlight=False)
