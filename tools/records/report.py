"""Reports on runs: progress and roofline plots (PNG), a markdown summary, and a cross-database leaderboard.

    >>> write_report("a1b2c3d4", "runs/kloop.db", "out/a1b2c3d4")
    [PosixPath('out/a1b2c3d4/progress.png'), PosixPath('out/a1b2c3d4/roofline.png'), PosixPath('out/a1b2c3d4/report.md')]
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from tools.records.store import Attempt, StoreError, best_so_far, fastest_key, open_db
from tools.result import Roofline

NO_TIMING_NOTE = "no timing: this run had no CUDA GPU (Triton interpreter on CPU)"
NO_TIMING_SENTENCE = ("No attempt of this run was timed (it ran without a CUDA GPU, under the Triton interpreter), "
                      "so there are no speedups and no roofline to plot.")
VERDICT_COLORS = {"correct": "tab:green", "incorrect": "tab:orange", "compile_error": "tab:red",
                  "runtime_error": "tab:purple", "timeout": "tab:brown", "rejected": "black"}


class ReportError(Exception):
    """The report cannot be made as asked: one line for the user."""


def _open(db_path):
    try:
        return open_db(db_path, create=False, readonly=True)
    except StoreError as e:
        raise ReportError(str(e)) from None


# -- plots -----------------------------------------------------------------------------------------------------------

def _plain(value: float, _pos=None) -> str:
    """Tick labels a person reads at a glance: 0.01, 0.5, 20, 1000 (no 10^5 powers, no offsets)."""
    if value == 0:
        return "0"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:g}"


def _plain_log_axis(axis) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10))
    axis.set_major_formatter(FuncFormatter(_plain))
    axis.set_minor_formatter(NullFormatter())


def is_timed(attempts: list[Attempt]) -> bool:
    return any(a.timed for a in attempts)


def progress_figure(attempts: list[Attempt], target_name: str | None = None, gpu_name: str | None = None,
                    target_sol: float | None = None):
    """Per attempt: speedup over eager, over torch.compile, and the fraction of speed of light, each with the line of
    the run's best so far (as the loop chose it: tools.records.store.best_so_far); one series per branch; failed attempts as crosses along the bottom (they have no speedup). Without any
    timing (CPU interpreter run), the verdict of each attempt instead, and a title that says there is no timing."""
    from matplotlib.figure import Figure  # Figure without pyplot: Agg canvas, no global state, no display
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    name = target_name or "run"
    if not is_timed(attempts):
        fig = Figure(figsize=(9, 3.6), layout="constrained")
        ax = fig.subplots()
        verdicts = [v for v in VERDICT_COLORS if any(a.verdict == v for a in attempts)]
        verdicts += sorted({a.verdict or "none" for a in attempts} - set(verdicts))
        for row, verdict in enumerate(verdicts):
            numbers = [a.number for a in attempts if (a.verdict or "none") == verdict]
            ax.scatter(numbers, [row] * len(numbers), color=VERDICT_COLORS.get(verdict, "tab:gray"), s=40, zorder=3)
        ax.set_yticks(range(len(verdicts)), verdicts)
        ax.set_ylim(-0.7, len(verdicts) - 0.3)
        ax.set_xlabel("attempt")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.set_title(f"{name}: verdict per attempt\n({NO_TIMING_NOTE})", fontsize="medium")
        return fig

    panels = (("speedup_eager", "speedup vs eager (x)"), ("speedup_compile", "speedup vs torch.compile (x)"),
              ("sol_fraction", "speed of light reached"))
    fig = Figure(figsize=(9, 8.5), layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True)
    branches = sorted({a.branch for a in attempts})
    ordered = sorted(attempts, key=lambda a: a.number)
    bests = best_so_far(ordered)
    for ax, (key, label) in zip(axes, panels):
        for branch in branches:
            own = [a for a in ordered if a.branch == branch]
            points = [(a.number, getattr(a, key)) for a in own
                      if a.verdict == "correct" and getattr(a, key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o", linewidth=0.8, markersize=4,
                        label=f"branch {branch}" if len(branches) > 1 else "correct attempt")
        steps = [(a.number, getattr(best, key)) for a, best in zip(ordered, bests)
                 if best and getattr(best, key) is not None]
        # A new best wins by the paired re-measurement against the old one: its own measured ratio to eager can read
        # lower than the old best's did. The line keeps the highest so far, so it never goes down.
        steps = [(number, max(value for _, value in steps[:i + 1])) for i, (number, _) in enumerate(steps)]
        if steps:
            ax.step(*zip(*steps), where="post", color="black", linewidth=1.6, label="best so far")
        failed = [a.number for a in ordered if a.verdict != "correct"]
        if failed:  # along the bottom edge in axes coordinates: a failure has no speedup, not a speedup of 0
            ax.plot(failed, [0.03] * len(failed), "x", color="tab:red", markersize=7,
                    transform=ax.get_xaxis_transform(), label="failed (no speedup)", clip_on=False)
        if key == "sol_fraction":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
            if target_sol is not None and target_sol <= 1:
                ax.axhline(target_sol, color="tab:green", linestyle=":", linewidth=1,
                           label=f"stop at {target_sol:.0%}")
            ax.set_ylim(bottom=0)
        else:
            ax.axhline(1.0, color="gray", linestyle="--", linewidth=0.8, label="1x (as fast)")
            ax.yaxis.set_major_formatter(_plain_formatter())
            if failed:  # a free band along the bottom for the crosses, below every speedup drawn
                lo, hi = ax.get_ylim()
                ax.set_ylim(lo - 0.15 * (hi - lo), hi)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes[-1].set_xlabel("attempt")
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(f"{name}: progress per attempt" + (f" on {gpu_name}" if gpu_name else ""))
    return fig


def _plain_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(_plain)


def _peaks(attempts: list[Attempt]) -> tuple[float | None, float | None]:
    """Device peaks (GB/s, TFLOP/s) the evaluator used for the attempts' speed of light."""
    for attempt in attempts:
        roofline = attempt.roofline or Roofline()
        gpu = attempt.result.gpu or {}
        gbps = roofline.peak_gbps or gpu.get("peak_gbps")
        tflops = roofline.peak_tflops or gpu.get("peak_tflops_fp32")
        if gbps and tflops:
            return gbps, tflops
    return None, None


def _flops_unit(peak_tflops: float | None, achieved_tflops: list[float]) -> tuple[str, float]:
    """TFLOP/s when the numbers are at least about 1 TFLOP/s, else GFLOP/s: (unit, factor from TFLOP/s)."""
    top = max(achieved_tflops + ([peak_tflops] if peak_tflops else []))
    return ("TFLOP/s", 1.0) if top >= 1 else ("GFLOP/s", 1e3)


def roofline_figure(attempts: list[Attempt], gpu_name: str | None, target_name: str | None = None):
    """The roofline: arithmetic intensity (FLOP/byte) against achieved FLOP/s, under the GPU's memory roof (slope:
    bandwidth) and compute roof, one dot per timed attempt and the best one named. For an op with no FLOPs counted
    (a pure copy or add counted as traffic) a roofline has no x position: achieved bandwidth per attempt instead,
    under the memory roof, titled as what it is. None when no attempt was timed (there is nothing to draw)."""
    from matplotlib.figure import Figure

    timed = [(a, a.roofline or Roofline(), a.median_us) for a in attempts if a.timed]
    if not timed:
        return None
    gbps, tflops = _peaks(attempts)
    with_flops = [(a, r, t) for a, r, t in timed if r.flops and r.bytes]
    with_bytes = [(a, r, t) for a, r, t in timed if r.bytes]
    name = target_name or "run"
    on = f" on {gpu_name}" if gpu_name else ""
    fig = Figure(figsize=(8.5, 6), layout="constrained")
    ax = fig.subplots()
    if with_flops:
        _roofline_axes(fig, ax, with_flops, gbps, tflops, f"{name}: roofline{on}")
    elif with_bytes:
        _bandwidth_axes(fig, ax, with_bytes, gbps, f"{name}: achieved memory bandwidth per attempt{on}")
    else:
        fig.text(0.5, 0.5, "no byte or FLOP counts were logged for these attempts, so there is no roofline",
                 ha="center", va="center")
        ax.set_axis_off()
        return fig
    ax.grid(alpha=0.3, which="major")
    return fig


def _roofline_axes(fig, ax, timed: list[tuple[Attempt, Roofline, float]], gbps: float | None, tflops: float | None,
                   title: str) -> None:
    """The roofline proper: (attempt, roofline counts, median us) of attempts with FLOPs and bytes counted."""
    # FLOP/us * 1e-6 = TFLOP/s
    points = [(r.flops / r.bytes, r.flops / t / 1e6, a) for a, r, t in timed]
    unit, scale = _flops_unit(tflops, [p[1] for p in points])
    ax.set_title(title)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel(f"achieved {unit}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs_points = [p[0] for p in points]
    lo, hi = min(xs_points) / 30, max(xs_points) * 30
    if gbps and tflops:
        ridge = tflops * 1e3 / gbps                                   # FLOP/byte where the roofs meet
        lo, hi = min(lo, ridge / 30), max(hi, ridge * 30)
        xs = [lo, ridge, hi]
        ax.plot(xs, [min(gbps * x / 1e3, tflops) * scale for x in xs], color="dimgray", linewidth=2,
                label=f"roofs: memory {gbps:,.0f} GB/s, compute {tflops * scale:,.0f} {unit}")
        ax.axvline(ridge, color="lightgray", linestyle=":", linewidth=1)
        ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, tflops * scale), textcoords="offset points",
                    xytext=(6, -14), fontsize="small", color="dimgray")
    ax.set_xlim(lo, hi)
    good = [p for p in points if _correct(p[2])]
    bad = [p for p in points if not _correct(p[2])]
    if good:
        ax.scatter([p[0] for p in good], [p[1] * scale for p in good], color=VERDICT_COLORS["correct"],
                   alpha=0.6, zorder=3, label="correct attempt")
    if bad:
        ax.scatter([p[0] for p in bad], [p[1] * scale for p in bad], marker="x", color="tab:red", zorder=3,
                   label="not correct (timed)")
    if good:
        x, y, best = max(good, key=lambda p: p[1])
        roof = min(gbps * x / 1e3, tflops) if gbps and tflops else None
        share = f", {y / roof:.0%} of the roof" if roof else ""
        ax.scatter([x], [y * scale], marker="*", s=220, color="gold", edgecolor="black", zorder=4,
                   label=f"best: #{best.number}, {y * scale:.3g} {unit}{share}")
    _plain_log_axis(ax.xaxis)
    _plain_log_axis(ax.yaxis)
    fig.legend(fontsize="small", loc="outside lower center", ncols=2)   # below the axes: covers no point


def _bandwidth_axes(fig, ax, timed: list[tuple[Attempt, Roofline, float]], gbps: float | None, title: str) -> None:
    """Achieved bandwidth per attempt, under the memory roof, for attempts with bytes but no FLOPs counted."""
    from matplotlib.ticker import MaxNLocator

    points = [(a.number, r.bytes / t / 1e3, a) for a, r, t in timed]
    ax.set_title(f"{title}\n(no FLOPs counted, so no roofline: bytes moved / kernel time)",
                 fontsize="medium")
    ax.set_xlabel("attempt")
    ax.set_ylabel("achieved GB/s")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(_plain_formatter())
    good = [p for p in points if _correct(p[2])]
    bad = [p for p in points if not _correct(p[2])]
    if good:
        ax.scatter([p[0] for p in good], [p[1] for p in good], color=VERDICT_COLORS["correct"], zorder=3,
                   label="correct attempt")
    if bad:
        ax.scatter([p[0] for p in bad], [p[1] for p in bad], marker="x", color="tab:red", zorder=3,
                   label="not correct (timed)")
    if gbps:
        ax.axhline(gbps, color="dimgray", linewidth=2, label=f"memory roof: {gbps:,.0f} GB/s")
    ax.set_ylim(0, max([p[1] for p in points] + [gbps or 0]) * 1.1)
    fig.legend(fontsize="small", loc="outside lower center", ncols=3)


def _correct(attempt: Attempt) -> bool:
    return attempt.verdict == "correct"


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


def summary_markdown(run: dict, attempts: list[Attempt], best: Attempt | None, images: list[str]) -> str:
    settings_rows = [[k, run.get(k)] for k in ("id", "target_name", "status", "policy", "model", "created_at",
                                              "finished_at", "gpu_name", "driver", "cuda", "parent_run_id",
                                              "parent_kind")]
    settings_rows.append(["versions", json.dumps(run.get("versions"))])
    baselines = run.get("baselines") or {}
    for name in ("eager", "compile"):
        settings_rows.append([f"baseline {name} (us)", (baselines.get(name) or {}).get("median")])
    parts = [f"# kloop run {run['id']}: {run.get('target_name')}", "",
             f"{run.get('status')}, {len(attempts)} attempts, {run.get('policy')} policy"
             + (f" ({run['notes']})" if run.get("notes") else "")
             + f"; on {run.get('gpu_name') or 'no GPU'}. The run's settings are at the end.", ""]
    if not is_timed(attempts):
        parts += [NO_TIMING_SENTENCE, ""]
    parts += [f"![{Path(image).stem}]({image})" for image in images] + [""]
    if best is None:
        parts += ["## Best kernel", "", "No attempt of this run was verified correct.", ""]
    else:
        timing_note = best.result.timing_note
        parts += [f"## Best kernel: attempt {best.number} ({best.language})", "",
                  markdown_table(["time (us)", "vs eager", "vs compile", "speed of light"],
                                 [[best.median_us, best.speedup_eager, best.speedup_compile,
                                   best.sol_fraction]]), ""]
        if timing_note:
            parts += [f"_{timing_note}_", ""]
        parts += [f"```python\n{best.source or ''}\n```", ""]
        resources = [dataclasses.asdict(r) for r in best.result.resources]
        if resources:
            keys = list(dict.fromkeys(k for r in resources for k in r))
            parts += ["Resources:", "", markdown_table(keys, [[r.get(k) for k in keys] for r in resources]), ""]
        ncu = {kernel: dataclasses.asdict(counters) for kernel, counters in (best.result.ncu or {}).items()}
        roofline = dataclasses.asdict(best.roofline) if best.roofline else None
        for name, value in (("ncu", ncu), ("nvml", best.result.nvml), ("roofline", roofline)):
            if value:
                parts += [f"{name}:", _json_block(value), ""]
    parts += ["## Attempts", "", markdown_table(
        ["#", "branch", "turn", "language", "verdict", "time (us)", "vs eager", "vs compile", "SoL", "reason"],
        [[a.number, a.branch, a.turn, a.language, a.verdict, a.median_us,
          a.speedup_eager, a.speedup_compile, a.sol_fraction,
          ((a.reasons or [""])[0] or "")[:120]] for a in attempts]), ""]
    parts += ["## Run settings", "", markdown_table(["setting", "value"], settings_rows), "",
              "Settings:", _json_block(run.get("settings") or {}), "",
              "Numeric flags:", _json_block(run.get("numeric_flags") or {}), ""]
    return "\n".join(parts)


def write_report(run_id: str, db_path: str | os.PathLike, out_dir: str | os.PathLike) -> list[Path]:
    """progress.png, roofline.png (only when some attempt was timed) and report.md for one run, in out_dir (created if
    needed)."""
    store = _open(db_path)
    try:
        try:
            run = store.get_run(run_id)
        except StoreError as e:
            raise ReportError(str(e)) from None
        attempts = store.attempts(run_id)
        best = store.best_attempt(run_id)
    finally:
        store.close()
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        target_sol = (run.get("settings") or {}).get("target_sol")
        figures = (("progress.png", progress_figure(attempts, run.get("target_name"), run.get("gpu_name"),
                                                    target_sol if isinstance(target_sol, (int, float)) else None)),
                   ("roofline.png", roofline_figure(attempts, run.get("gpu_name"), run.get("target_name"))))
        for name, figure in figures:
            if figure is None:      # nothing to draw: report.md says why in a sentence
                continue
            figure.savefig(out_dir / name, dpi=110)
            written.append(out_dir / name)
        report = out_dir / "report.md"
        report.write_text(summary_markdown(run, attempts, best, [p.name for p in written]))
    except OSError as e:
        raise ReportError(f"cannot write the report to {out_dir}: {e.strerror or e}") from None
    return written + [report]


# -- leaderboard -----------------------------------------------------------------------------------------------------

def leaderboard(db_paths: list[str | os.PathLike]) -> list[dict]:
    """Per target across databases, the fastest of the runs' best kernels (tools.records.store.fastest_key: untimed ones
    last; of equals, the first met: the newest run of the first database)."""
    best_by_target: dict[str, tuple[Attempt, dict]] = {}
    for db_path in db_paths:
        store = _open(db_path)
        try:
            for run in store.list_runs():
                attempt = store.best_attempt(run["id"])
                if attempt is None:
                    continue
                entry = {"target": run.get("target_name"), "db": str(db_path), "run": run["id"],
                         "attempt": attempt.number, "attempt_id": attempt.id, "language": attempt.language,
                         "time_us": attempt.median_us, "speedup_eager": attempt.speedup_eager,
                         "speedup_compile": attempt.speedup_compile,
                         "sol_fraction": attempt.sol_fraction, "gpu": run.get("gpu_name")}
                current = best_by_target.get(entry["target"])
                if current is None or fastest_key(attempt) < fastest_key(current[0]):
                    best_by_target[entry["target"]] = attempt, entry
        finally:
            store.close()
    return [best_by_target[t][1] for t in sorted(best_by_target, key=str)]
