"""`kloop bench`: the offline policy on each built-in target for a fixed budget, then one table, one JSON file."""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from agent.output import fail, make_console
from agent.progress import ProgressView
from tools.records.store import DEFAULT_DB

console = make_console()


def bench_command(
    targets: Optional[str] = typer.Option(None, help="Comma-separated built-in targets (default: all, in `kloop targets` order)."),
    minutes_per_target: float = typer.Option(5.0, help="Active time budget of each target's loop, in minutes (fractions allowed)."),
    max_attempts: Optional[int] = typer.Option(None, min=1, help="Also stop each target's loop after this many attempts."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the results as JSON here (e.g. results/bench-h200.json); '-': print only the JSON on stdout (the rest goes to stderr)."),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="Run database for the bench's runs (re-verify them with `kloop reverify`)."),
    gpus: Optional[str] = typer.Option(None, help="all, or GPU indices (0,1,...): one executor and referee per GPU (default: this process's GPU)."),
    ray: Optional[str] = typer.Option(None, help="auto, or a Ray cluster address: evaluate on the cluster's GPUs (pip install -e '.\\[ray]')."),
    planners: Optional[int] = typer.Option(None, min=1, help="Candidates planned at once (default: the CPU cores the trusted processes leave)."),
    pipeline: Optional[int] = typer.Option(None, min=1, help="Attempts in flight (default: enough to keep planners and GPUs busy; 1: one candidate at a time)."),
) -> None:
    """Benchmark the loop: offline policy per target, then best kernel vs eager vs torch.compile, ceilings and goals."""
    from tools.records.store import StoreError, open_db
    from tools.targets import BUILTIN_TARGETS

    names = [t.strip() for t in targets.split(",") if t.strip()] if targets is not None else list(BUILTIN_TARGETS)
    unknown = [t for t in names if t not in BUILTIN_TARGETS]
    if unknown or not names:
        fail(f"unknown target {unknown[0]!r} (built-ins: {', '.join(BUILTIN_TARGETS)})" if unknown
             else "--targets names no target")
    if len(set(names)) != len(names):
        fail(f"--targets repeats a target: {targets}")
    if minutes_per_target <= 0:
        fail(f"--minutes-per-target must be positive, got {minutes_per_target:g}")
    to_stdout = json_path is not None and str(json_path) == "-"
    if json_path is not None and not to_stdout:
        _check_writable(json_path)
    from agent import run as runs

    evaluator = {"gpus": gpus, "ray": ray, "planners": planners, "pipeline": pipeline}
    try:
        runs.check_evaluator(evaluator)
    except runs.RunError as e:
        fail(str(e))
    try:
        store = open_db(db)
    except StoreError as e:
        fail(str(e))
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr) if to_stdout else contextlib.nullcontext():
        try:
            report = run_bench(store, names, minutes_per_target, max_attempts, evaluator)
        except KeyboardInterrupt:
            console.print(f"bench stopped; no table or JSON (the runs so far are in {store.path})", highlight=False)
            raise typer.Exit(130)
        console.print(bench_table(report))
        print_goals(report)
    if to_stdout:
        stdout.write(json.dumps(report, indent=1) + "\n")
    elif json_path is not None:
        json_path.write_text(json.dumps(report, indent=1) + "\n")
        console.print(f"wrote {json_path}", highlight=False)


def run_bench(store, names: list[str], minutes_per_target: float, max_attempts: int | None,
              evaluator: dict | None = None) -> dict:
    """Measure the ceilings, run each target's loop, re-time each best kernel with its baselines; the JSON report.
    evaluator: gpus / ray / planners / pipeline settings; one evaluator session serves every target's run."""
    import torch

    from agent import run as runs
    from agent.run import gpu_facts
    from sandbox.evaluate import NO_GPU_NOTE, versions
    from tools.records import bench
    from tools.records.store import now

    evaluator = {k: v for k, v in (evaluator or {}).items() if v is not None}
    timing_is_real = torch.cuda.is_available()
    gpu = gpu_facts()
    started = now()
    with console.status("measuring the device copy bandwidth", spinner="dots"):
        copy = bench.copy_bandwidth()
    rows = []
    try:
        session = runs.evaluator_session(runs.settings_for(names[0], **evaluator))
    except runs.RunError as e:
        fail(str(e))
    with session:
        with console.status("starting the evaluator", spinner="dots"):
            session.start()
        for name in names:
            rows.append(_bench_one(store, name, minutes_per_target, max_attempts, evaluator, session, copy,
                                   timing_is_real))
    settings = {"targets": names, "minutes_per_target": minutes_per_target, "max_attempts": max_attempts,
                "policy": "offline", "db": str(store.path), **evaluator,
                "planners_used": session.planners, "devices": [d.name for d in session.devices]}
    return {
        "date": started, "finished": now(), "gpu": gpu, "versions": versions(), "settings": settings,
        "timing_is_real": timing_is_real, "timing_note": None if timing_is_real else NO_GPU_NOTE,
        "copy_bandwidth": copy, "targets": rows,
        "geomean": {"eager": bench.geomean([r["speedup_eager"] for r in rows]),
                    "compile": bench.geomean([r["speedup_compile"] for r in rows])},
        "goals": bench.goals(rows, minutes_per_target, timing_is_real),
        "notes": ["eager_us, compile_us, best_us, the speedups, sol_fraction and the rates come from one interleaved "
                  "measurement per target after its loop (best kernel, eager, torch.compile "
                  "max-autotune-no-cudagraphs); best_triton and best_ptx times are from the loop's own attempts",
                  "attempts_per_minute: attempts over the loop's wall time (the evaluator, started once before the "
                  "first target, not included); overhead_beyond_compile_s: per evaluation, its busy time less the "
                  "planner's compile and the kernel's own time",
                  f"re-verify a target's run: kloop reverify RUN_ID --db {store.path} (targets[].run_id)"],
    }


def _bench_one(store, name: str, minutes_per_target: float, max_attempts: int | None, evaluator: dict, session,
               copy: dict | None, timing_is_real: bool) -> dict:
    """One target's loop in the shared session, then its best kernel re-timed with eager and torch.compile."""
    import torch

    from sandbox.evaluate import EvalSettings, evaluate
    from tools.records import bench

    target, run_id, loop_seconds = optimize_one(store, name, minutes_per_target, max_attempts, evaluator, session)
    attempts = store.attempts(run_id)
    best = store.best_attempt(run_id)
    final = cublas = None
    with console.status(f"{name}: re-timing the best kernel with eager and torch.compile", spinner="dots"):
        if best is not None:
            final = evaluate(target, best.source, EvalSettings(baselines=("eager", "compile"),
                                                                  compile_baseline="measure"))
        if bench.kind_of(name) == "matmul":
            m, n, k = bench.matmul_shape(target, small=not timing_is_real)
            cublas = bench.cublas_matmul(m, n, k, torch.bfloat16)
    return bench.target_row(name, run_id, attempts, best, final, loop_seconds, copy, cublas)


def optimize_one(store, name: str, minutes: float, max_attempts: int | None, evaluator: dict | None = None,
                 session=None):
    """One target's run through agent.run, as `kloop optimize` makes it (offline policy, same graph, same evaluator);
    the budget is fixed: no early stop for speed-of-light or patience. Returns (target, run id, loop seconds)."""
    from agent import run as runs

    attempts_cap = max_attempts or sys.maxsize
    settings = runs.settings_for(name, max_attempts=attempts_cap, hours=minutes / 60, target_sol=sys.float_info.max,
                                 patience=attempts_cap, started_by="kloop bench", **(evaluator or {}))
    try:
        run = runs.start(store, "offline", settings)
    except runs.RunError as e:
        fail(str(e))
    console.print(f"[bold]{name}[/]: run {run.id} in {store.path}, {minutes:g} min"
                  + (f", at most {max_attempts} attempts" if max_attempts else ""), highlight=False)
    view = ProgressView(attempts_cap, console)

    def on_event(event: dict) -> None:  # an unlimited attempt budget is not worth a "left" count
        if event["kind"] == "attempt" and max_attempts is None:
            event = {**event, "left": {k: v for k, v in event["left"].items() if k != "attempts"}}
        view(event)

    began = time.monotonic()
    try:
        with console.status("starting", spinner="dots") as status:
            view.status = status
            runs.run(run, on_event, session=session)
    except runs.RunFailed as e:
        fail(f"{name}: {e} (run {run.id} failed)")
    return run.target, run.id, time.monotonic() - began


def bench_table(report: dict) -> Table:
    copy = report["copy_bandwidth"]
    ceiling = f"device copy {copy['gbps']:.0f} GB/s (read+write, 1 GiB)" if copy else "no device copy ceiling"
    table = Table(title=f"kloop bench: {(report['gpu'] or {}).get('name') or 'no CUDA GPU'}; {ceiling}",
                  show_footer=True)
    geomean = report["geomean"]
    columns = [("target", "geomean"), ("eager us", ""), ("compile us", ""), ("best us", ""),
               ("x eager", _num(geomean["eager"], "{:.2f}")), ("x compile", _num(geomean["compile"], "{:.2f}")),
               ("SOL", ""), ("achieved (of ceiling)", ""), ("attempts (/min)", ""), ("overhead s", ""), ("GPU s", ""),
               ("best Triton us", ""), ("best PTX us", "")]
    table.add_column(*columns[0], min_width=max([len(r["target"]) for r in report["targets"]] + [7]))  # never cut
    for header, footer in columns[1:]:
        table.add_column(header, footer, justify="right")
    for r in report["targets"]:
        if r["kind"] == "matmul":
            achieved = _num(r["achieved_tflops"], "{:.0f} TFLOP/s")
            if r["cublas_fraction"] is not None:
                achieved += f" ({r['cublas_fraction']:.0%} of cuBLAS {r['cublas_tflops']:.0f})"
        else:
            achieved = _num(r["achieved_gbps"], "{:.0f} GB/s")
            if r["copy_fraction"] is not None:
                achieved += f" ({r['copy_fraction']:.0%} of copy)"
        table.add_row(
            r["target"], _num(r["eager_us"], "{:.1f}"), _num(r["compile_us"], "{:.1f}"),
            f"{_num(r['best_us'], '{:.1f}')} {r['best_language'] or ''}".strip(),
            _num(r["speedup_eager"], "{:.2f}"), _num(r["speedup_compile"], "{:.2f}"),
            _num(r["sol_fraction"], "{:.0%}"), achieved,
            f"{r['attempts']}" + _num(r["attempts_per_minute"], " ({:.0f})", ""),
            _num(r["beyond_compile_s_median"], "{:.2f}"), _num(r["device_s_median"], "{:.2f}"),
            _language_cell(r["best_triton"]), _language_cell(r["best_ptx"]))
    return table


def print_goals(report: dict) -> None:
    for r in report["targets"]:
        if r["best_attempt"] is None:
            console.print(f"[red]{r['target']}: no attempt verified correct[/]", highlight=False)
        elif r["final_verdict"] != "correct":
            console.print(f"[red]{r['target']}: the best attempt #{r['best_attempt']} was {r['final_verdict']} when "
                          f"re-verified[/] ({escape('; '.join(r['final_reasons'])[:200])})", highlight=False)
    console.print("goals:")
    for goal in report["goals"]:
        mark = {True: "[green]PASS[/]", False: "[red]FAIL[/]", None: "[yellow]n/a [/]"}[goal["passed"]]
        console.print(f"  {mark} {goal['goal']}: {goal['detail']}", highlight=False)
    if not report["timing_is_real"]:
        console.print(f"[bold yellow]{report['timing_note']}[/]: every time, speedup and rate above is missing "
                      "on purpose; run on a GPU for real numbers", highlight=False)


def _check_writable(path: Path) -> None:
    """Refuse an unwritable --json path before spending the budget (its folder is created if missing)."""
    if path.is_dir():
        fail(f"--json {path} is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        fail(f"--json {path}: its folder {path.parent} cannot be made (a file is in the way)")
    except OSError as e:
        fail(f"--json {path}: cannot create {path.parent}: {e.strerror}")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        fail(f"--json {path} is not writable")


def _language_cell(best: dict | None) -> str:
    if best is None:
        return "-"
    return f"#{best['attempt']}" + (f" {best['time_us']:.1f}" if best["time_us"] is not None else "")


def _num(value, fmt: str, missing: str = "-") -> str:
    return missing if value is None else fmt.format(value)
