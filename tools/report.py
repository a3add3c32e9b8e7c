"""Reports on runs: progress and roofline plots (PNG), a markdown summary, and a cross-database leaderboard.

    >>> write_report("a1b2c3d4", "runs/kloop.db", "out/a1b2c3d4")
    [PosixPath('out/a1b2c3d4/progress.png'), PosixPath('out/a1b2c3d4/roofline.png'), PosixPath('out/a1b2c3d4/report.md')]
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tools.store import StoreError, open_db

NO_TIMING_NOTE = "no timing (CPU interpreter run)"
VERDICT_COLORS = {"correct": "tab:green", "incorrect": "tab:orange", "compile_error": "tab:red",
                  "runtime_error": "tab:purple", "timeout": "tab:brown", "rejected": "black"}


class ReportError(Exception):
    """The report cannot be made as asked: one line for the user."""


def _open(db_path):
    try:
        return open_db(db_path, create=False, readonly=True)
    except StoreError as e:
        raise ReportError(str(e)) from None


def _median(attempt: dict) -> float | None:
    timing = attempt.get("time_us")
    return timing.get("median") if isinstance(timing, dict) else None


# -- plots -----------------------------------------------------------------------------------------------------------

def progress_figure(attempts: list[dict]):
    """Speedup over eager, over torch.compile and speed-of-light fraction per attempt; one line per branch,
    failed attempts as crosses on the axis."""
    from matplotlib.figure import Figure  # Figure without pyplot: Agg canvas, no global state, no display

    panels = (("speedup_eager", "speedup vs eager (x)"), ("speedup_compile", "speedup vs torch.compile (x)"),
              ("sol_fraction", "fraction of speed of light"))
    fig = Figure(figsize=(9, 8), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True)
    branches = sorted({a.get("branch") or 0 for a in attempts})
    timed = any(a.get(key) is not None for a in attempts for key, _ in panels)
    for ax, (key, label) in zip(axes, panels):
        for branch in branches:
            own = [a for a in attempts if (a.get("branch") or 0) == branch]
            points = [(a["number"], a[key]) for a in own if a.get("verdict") == "correct" and a.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=f"branch {branch}")
        untimed = [a["number"] for a in attempts if a.get("verdict") == "correct" and a.get(key) is None]
        if untimed:
            ax.plot(untimed, [0] * len(untimed), "o", mfc="none", color="tab:green", label="correct, untimed")
        failed = [a["number"] for a in attempts if a.get("verdict") != "correct"]
        if failed:
            ax.plot(failed, [0] * len(failed), "x", color="tab:red", markersize=8, label="failed")
        if key != "sol_fraction" and timed:
            ax.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
        if not timed:
            ax.text(0.5, 0.75, NO_TIMING_NOTE, transform=ax.transAxes, ha="center", va="center", color="gray",
                    bbox={"facecolor": "white", "edgecolor": "lightgray"})
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small", loc="upper left")
    axes[-1].set_xlabel("attempt")
    return fig


def _peaks(attempts: list[dict]) -> tuple[float | None, float | None]:
    """Device peaks (GB/s, TFLOP/s) the evaluator used for the attempts' speed of light."""
    for attempt in attempts:
        roofline = attempt.get("roofline") or {}
        gpu = (attempt.get("result") or {}).get("gpu") or {}
        gbps = roofline.get("peak_gbps") or gpu.get("peak_gbps")
        tflops = roofline.get("peak_tflops") or gpu.get("peak_tflops_fp32")
        if gbps and tflops:
            return gbps, tflops
    return None, None


def roofline_figure(attempts: list[dict], gpu_name: str | None):
    """Arithmetic intensity against achieved FLOP/s under the device's memory and compute roofs; for ops with no
    FLOPs (copies, adds counted as pure traffic) achieved bandwidth per attempt under the memory roof."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 6), layout="constrained")
    ax = fig.subplots()
    ax.set_title(f"roofline{f' ({gpu_name})' if gpu_name else ''}")
    timed = [(a, a.get("roofline") or {}, _median(a)) for a in attempts if _median(a)]
    gbps, tflops = _peaks(attempts)
    with_flops = [(a, r, t) for a, r, t in timed if r.get("flops") and r.get("bytes")]
    with_bytes = [(a, r, t) for a, r, t in timed if r.get("bytes")]
    if with_flops:
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        points = [(r["flops"] / r["bytes"], r["flops"] / t / 1e3, a) for a, r, t in with_flops]
        lo, hi = min(p[0] for p in points) / 10, max(p[0] for p in points) * 10
        if gbps and tflops:
            ridge = tflops * 1e3 / gbps
            xs = sorted({lo, hi, min(max(ridge, lo), hi)})
            ax.plot(xs, [min(gbps * x, tflops * 1e3) for x in xs], color="gray",
                    label=f"roof: {gbps:.0f} GB/s, {tflops:.0f} TFLOP/s")
    elif with_bytes:
        ax.set_xlabel("attempt")
        ax.set_ylabel("achieved GB/s (no FLOPs counted: memory traffic only)")
        points = [(a["number"], r["bytes"] / t / 1e3, a) for a, r, t in with_bytes]
        if gbps:
            ax.axhline(gbps, color="gray", label=f"memory roof: {gbps:.0f} GB/s")
    else:
        ax.text(0.5, 0.5, NO_TIMING_NOTE if not timed else "no byte or FLOP counts to plot",
                transform=ax.transAxes, ha="center", va="center", color="gray")
        return fig
    for verdict in sorted({p[2].get("verdict") or "" for p in points}):
        own = [p for p in points if (p[2].get("verdict") or "") == verdict]
        ax.scatter([p[0] for p in own], [p[1] for p in own], color=VERDICT_COLORS.get(verdict, "tab:blue"),
                   label=verdict, zorder=3)
        for x, y, attempt in own:
            ax.annotate(f"#{attempt['number']}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize="x-small")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


# -- markdown --------------------------------------------------------------------------------------------------------

def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _json_block(value: Any) -> str:
    return f"```json\n{json.dumps(value, indent=2, default=str)}\n```"


def summary_markdown(run: dict, attempts: list[dict], best: dict | None, images: list[str]) -> str:
    settings_rows = [[k, run.get(k)] for k in ("id", "target_name", "status", "policy", "model", "created_at",
                                              "finished_at", "gpu_name", "driver", "cuda", "parent_run_id",
                                              "parent_kind")]
    settings_rows.append(["versions", json.dumps(run.get("versions"))])
    baselines = run.get("baselines") or {}
    for name in ("eager", "compile"):
        settings_rows.append([f"baseline {name} (us)", (baselines.get(name) or {}).get("median")])
    parts = [f"# kloop run {run['id']}: {run.get('target_name')}", "",
             markdown_table(["setting", "value"], settings_rows), "",
             "Settings:", _json_block(run.get("settings") or {}), "",
             "Numeric flags:", _json_block(run.get("numeric_flags") or {}), ""]
    parts += [f"![{Path(image).stem}]({image})" for image in images] + [""]
    if best is None:
        parts += ["## Best kernel", "", "No attempt of this run was verified correct.", ""]
    else:
        timing_note = (best.get("result") or {}).get("timing_note")
        parts += [f"## Best kernel: attempt {best['number']} ({best.get('language')})", "",
                  markdown_table(["time (us)", "vs eager", "vs compile", "speed of light"],
                                 [[_median(best), best.get("speedup_eager"), best.get("speedup_compile"),
                                   best.get("sol_fraction")]]), ""]
        if timing_note:
            parts += [f"_{timing_note}_", ""]
        parts += [f"```python\n{best.get('source') or ''}\n```", ""]
        resources = best.get("resources") or []
        if resources:
            keys = list(dict.fromkeys(k for r in resources for k in r))
            parts += ["Resources:", "", markdown_table(keys, [[r.get(k) for k in keys] for r in resources]), ""]
        for name in ("ncu", "nvml", "roofline"):
            if best.get(name):
                parts += [f"{name}:", _json_block(best[name]), ""]
    parts += ["## Attempts", "", markdown_table(
        ["#", "branch", "turn", "language", "verdict", "time (us)", "vs eager", "vs compile", "SoL", "reason"],
        [[a["number"], a.get("branch"), a.get("turn"), a.get("language"), a.get("verdict"), _median(a),
          a.get("speedup_eager"), a.get("speedup_compile"), a.get("sol_fraction"),
          ((a.get("reasons") or [""])[0] or "")[:120]] for a in attempts]), ""]
    return "\n".join(parts)


def write_report(run_id: str, db_path: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """progress.png, roofline.png and report.md for one run, in out_dir (created if needed)."""
    store = _open(db_path)
    try:
        try:
            run = store.get_run(run_id)
        except StoreError as e:
            raise ReportError(str(e)) from None
        attempts = store.attempts(run_id)
        best = store.get_attempt(run["best_attempt_id"]) if run.get("best_attempt_id") else store.best_attempt(run_id)
    finally:
        store.close()
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name, figure in (("progress.png", progress_figure(attempts)),
                             ("roofline.png", roofline_figure(attempts, run.get("gpu_name")))):
            figure.savefig(out_dir / name, dpi=110)
            written.append(out_dir / name)
        report = out_dir / "report.md"
        report.write_text(summary_markdown(run, attempts, best, [p.name for p in written]))
    except OSError as e:
        raise ReportError(f"cannot write the report to {out_dir}: {e.strerror or e}") from None
    return written + [report]


# -- leaderboard -----------------------------------------------------------------------------------------------------

def leaderboard(db_paths: list[str | os.PathLike]) -> list[dict]:
    """The best verified kernel per target across databases (fastest over eager; untimed ones rank last)."""
    best_by_target: dict[str, dict] = {}
    for db_path in db_paths:
        store = _open(db_path)
        try:
            for run in store.list_runs():
                attempt = store.best_attempt(run["id"])
                if attempt is None:
                    continue
                entry = {"target": run.get("target_name"), "db": str(db_path), "run": run["id"],
                         "attempt": attempt["number"], "attempt_id": attempt["id"], "language": attempt.get("language"),
                         "time_us": _median(attempt), "speedup_eager": attempt.get("speedup_eager"),
                         "speedup_compile": attempt.get("speedup_compile"),
                         "sol_fraction": attempt.get("sol_fraction"), "gpu": run.get("gpu_name")}
                current = best_by_target.get(entry["target"])
                if current is None or _rank(entry) > _rank(current):
                    best_by_target[entry["target"]] = entry
        finally:
            store.close()
    return [best_by_target[t] for t in sorted(best_by_target, key=str)]


def _rank(entry: dict) -> tuple:
    speedup = entry["speedup_eager"]
    return (speedup is not None, speedup or 0.0)
