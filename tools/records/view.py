"""One attempt in words and two attempts' diff (`kloop show --attempt`, `kloop diff`), and the run viewer: one
self-contained HTML file per run or suite (`kloop view`), readable offline.

The page is a Jinja2 template (tools/records/templates/), the plots are tools.records.report's matplotlib figures inlined as PNG,
sources are highlighted by Pygments and diffed by difflib; nothing is loaded from the network when it is read.
"""
from __future__ import annotations

import base64
import dataclasses
import difflib
import io
from pathlib import Path

from markupsafe import Markup

from tools.records.store import Attempt, offline_marker


def attempt_facts(a: Attempt, parent: Attempt | None) -> list[tuple[str, str]]:
    """An attempt's facts as (name, value) lines: what it was, its parent and why the strategy picked it, its
    timings, correctness, counters and where its time went. Values are plain text (candidate text included)."""
    facts = [("what", ", ".join(x for x in (a.language, f"branch {a.branch}",
                                          f"turn {a.turn}" if a.turn is not None else "",
                                          a.created_at) if x))]
    if parent is not None:
        facts.append(("parent", f"#{parent.number}"))
    elif a.parent_attempt_id is None:
        facts.append(("parent", "none (started from the target alone)"))
    if a.parent_reason:
        facts.append(("strategy", a.parent_reason))
    if a.island is not None:
        facts.append(("island", str(a.island)))
    if a.archive_cell:
        facts.append(("cell", a.archive_cell))
    if a.median_us is not None:
        spread = f", IQR {a.time_us.iqr:.2f} us" if a.time_us.iqr is not None else ""
        calls = f", {a.time_us.n} calls" if a.time_us.n else ""
        facts.append(("time", f"median {a.median_us:.2f} us{spread}{calls}"))
    speed = [f"{value:.2f}x {name}" for value, name in ((a.speedup_eager, "eager"), (a.speedup_compile, "torch.compile"))
             if value is not None]
    if a.sol_fraction is not None:
        bound = a.roofline.bound if a.roofline else None
        speed.append(f"{a.sol_fraction:.0%} of speed-of-light" + (f" ({bound}-bound)" if bound else ""))
    if speed:
        facts.append(("speed", ", ".join(speed)))
    c = a.result.correctness
    if c is not None and c.trials:
        facts.append(("correctness", f"{c.trials} trials over {c.shapes} shapes, max abs error "
                                     f"{c.max_abs_err or 0:.3g}"))
    for res in a.result.resources:
        values = ", ".join(f"{k.replace('_', ' ')} {getattr(res, k)}" for k in (
            "registers", "spills", "shared_bytes", "num_warps", "num_stages", "occupancy") if getattr(res, k) is not None)
        facts.append((f"kernel {res.kernel}", values))
    for kernel, n in (a.result.ncu or {}).items():
        facts.append((f"ncu {kernel}", ", ".join(f"{k} {v}" for k, v in dataclasses.asdict(n).items()
                                                 if not isinstance(v, (list, dict)))))
    durations = a.durations or {}
    spent = [f"{k} {v:.2f} s" for k, v in durations.items() if isinstance(v, (int, float))]
    if spent:
        facts.append(("durations", ", ".join(spent)))
    if a.result.flags:
        facts.append(("flags", ", ".join(a.result.flags)))
    if a.diagnosis:
        facts.append(("diagnosis", "; ".join(a.diagnosis.splitlines())))
    return facts


def source_diff(old: Attempt | None, new: Attempt) -> str:
    """A unified diff of two attempts' sources (old None: from nothing), named by attempt number."""
    before = (old.source if old else None) or ""
    after = new.source or ""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        f"attempt {old.number}" if old else "(nothing)",
                                        f"attempt {new.number}"))


# -- the run viewer ------------------------------------------------------------------------------------------------
TEMPLATES = Path(__file__).parent / "templates"
SOURCE_STYLE = "friendly"   # a Pygments style readable on a white page


class ViewError(Exception):
    """The page cannot be made as asked: one line for the user."""


def figure_uri(figure, dpi: int = 80) -> str:
    """A matplotlib figure as a PNG data URI: the page carries its plots, nothing is fetched when it is read."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _highlighted(text: str, lexer) -> Markup:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter

    return Markup(highlight(text, lexer, HtmlFormatter(cssclass="code")))


def _number(value, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def run_view(store, run_id: str, anchor: str = "", plots: bool = True) -> dict:
    """Everything the page shows of one run: its facts, plots, attempts (table rows) and each attempt whole."""
    from pygments.lexers import DiffLexer, PythonLexer

    from tools.records.report import progress_figure, roofline_figure

    run = store.get_run(run_id)
    attempts = store.attempts(run_id)
    best = store.best_attempt(run_id)
    by_id = {a.id: a for a in attempts}
    rows = []
    for a in attempts:
        parent = by_id.get(a.parent_attempt_id)
        diff = source_diff(parent, a) if parent is not None else ""
        rows.append({
            "number": a.number, "anchor": f"{anchor}a{a.number}", "branch": a.branch,
            "verdict": a.verdict or "", "language": a.language or "", "label": label_of(a.source),
            "speedup_eager": _number(a.speedup_eager, "{:.2f}"),
            "speedup_compile": _number(a.speedup_compile, "{:.2f}"),
            "sol": _number(a.sol_fraction, "{:.0%}"),
            "median": _number(a.median_us, "{:.1f}"),
            "counters": "; ".join(f"{r.registers} regs, {r.spills} spills" for r in a.result.resources
                                  if r.registers is not None),
            "parent": parent.number if parent else None,
            "parent_anchor": f"{anchor}a{parent.number}" if parent else None,
            "pick": a.parent_reason or "", "island": a.island, "cell": a.archive_cell or "",
            "reasons": a.reasons or [], "withheld": a.withheld or [],
            "facts": attempt_facts(a, parent),
            "source": _highlighted(a.source or "", PythonLexer()),
            "diff": _highlighted(diff, DiffLexer()) if diff else None,
            "diff_lines": sum(line[:1] in "+-" for line in diff.splitlines()[2:]),
            "best": best is not None and a.id == best.id,
        })
    figures = []
    if plots and attempts:
        target_sol = (run.get("settings") or {}).get("target_sol")
        figures.append(("progress", figure_uri(progress_figure(
            attempts, run.get("target_name"), run.get("gpu_name"),
            target_sol if isinstance(target_sol, (int, float)) else None))))
        roofline = roofline_figure(attempts, run.get("gpu_name"), run.get("target_name"))
        if roofline is not None:
            figures.append(("roofline", figure_uri(roofline)))
    verified = sum(a.verdict == "correct" for a in attempts)
    timed = any(a.timed for a in attempts)
    return {"id": run["id"], "anchor": anchor, "target": run.get("target_name"), "policy": run.get("policy"),
            "model": run.get("model"), "status": run.get("status"), "notes": run.get("notes") or "",
            "created": run.get("created_at"), "gpu": run.get("gpu_name"),
            "strategy": (run.get("settings") or {}).get("strategy") or "refine",
            "attempts": rows, "verified": verified, "timed": timed, "figures": figures,
            "best": best.number if best else None, "best_anchor": f"{anchor}a{best.number}" if best else None}


def label_of(source: str | None) -> str:
    """The offline policy's template and values, from its first line (agent.progress.attempt_label without agent:
    tools imports nothing above it)."""
    marker = offline_marker(source)
    if marker is None:
        return ""
    values = ", ".join(f"{k}={v}" for k, v in (marker.get("values") or {}).items())
    return " ".join(x for x in (str(marker.get("template") or ""), values,
                                f"ptx_edit={marker['ptx_edit']}" if marker.get("ptx_edit") else "") if x)


def render(context: dict) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined
    from pygments.formatters import HtmlFormatter

    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True)
    styles = HtmlFormatter(style=SOURCE_STYLE).get_style_defs(".code")
    return env.get_template("view.html.j2").render(**context, code_styles=Markup(styles))


def write_run_view(db_path, run_id: str, out) -> Path:
    """One run's page (plots, attempts, sources, diffs) as one HTML file at `out`."""
    from tools.records.store import StoreError, open_db

    try:
        store = open_db(db_path, create=False, readonly=True)
        run = run_view(store, run_id)
    except StoreError as e:
        raise ViewError(str(e)) from None
    return _write(out, render({"title": f"kloop run {run_id}: {run['target']}", "suite": None, "runs": [run]}))


def write_suite_view(db_path, rows: list[dict], out, title: str) -> Path:
    """A suite's page: its problems table, each row linked to its run's section (attempts, sources, diffs and the
    run's progress plot) further down the same file. rows: the suite's problem rows (agent.suite's table)."""
    from tools.records.store import StoreError, open_db
    from tools.records.suite_report import collect

    try:
        store = open_db(db_path, create=False, readonly=True)
        results = collect(store, rows)
        runs = [run_view(store, r["run_id"], anchor=f"r{r['run_id']}-") for r in results if r.get("run_id")]
    except StoreError as e:
        raise ViewError(str(e)) from None
    problems = [{"problem": r["problem"], "strategy": r["strategy"], "status": r["status"] or "not reached",
                 "reason": r.get("reason") or "", "verified": r["verified"], "attempts": r["attempts"],
                 "best": r["best_attempt"], "speedup_eager": _number(r["speedup_eager"], "{:.2f}"),
                 "speedup_compile": _number(r["speedup_compile"], "{:.2f}"), "sol": _number(r["sol_fraction"], "{:.0%}"),
                 "run": r.get("run_id"), "anchor": f"r{r['run_id']}-" if r.get("run_id") else None}
                for r in results]
    suite = {"problems": problems, "verified": sum(p["verified"] for p in problems),
             "finished": sum(p["status"] in ("finished", "skipped", "failed") for p in problems)}
    return _write(out, render({"title": title, "suite": suite, "runs": runs}))


def _write(out, page: str) -> Path:
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page)
    except OSError as e:
        raise ViewError(f"cannot write {out}: {e.strerror or e}") from None
    return out
