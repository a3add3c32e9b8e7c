"""The report of a suite (`kloop suite`): KernelBench's numbers over a problem set, as markdown, CSV, JSON and PNG.

    >>> results = collect(store, rows)             # rows: agent.suite.rows_of(store, plan), one per problem x strategy
    >>> summary = summarize(results)               # correctness, fast_p, geomeans, SOL fractions, attempts, time, cost
    >>> write_suite_report(store, rows, "out/")    # report.md, problems.csv, report.json, speedups.png, ...

Definitions (KernelBench's): a problem counts as correct when its run has a verified best kernel (Store.best_attempt;
every verdict comes from the trusted evaluator); its speedups are that kernel's logged ones (eager time / kernel
time, and torch.compile time / kernel time, measured interleaved with the kernel). fast_p is the fraction of the
finished problems whose kernel is correct AND more than p times faster (fast_0 is the correctness rate). Finished
problems are those done, skipped (reference fails, no starter: they count as not correct) or failed; problems not
reached yet, or stopped mid-run, are left out and listed. Two geometric means, both stated in the report: over the
problems with a verified kernel only, and over all finished problems with a problem without a verified kernel
counted as 1.0x (its PyTorch reference kept). Without a CUDA GPU nothing is timed: every speedup, fast_p for p > 0,
geomean and SOL fraction is absent (None), never drawn.
"""
from __future__ import annotations

import collections
import csv
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from tools.records.report import markdown_table
from tools.records.store import offline_marker

P_VALUES = (0.0, 1.0, 1.2, 2.0)
BASELINES = ("eager", "compile")
FINISHED = ("done", "skipped", "failed")
SOL_BINS = (0.0, 0.25, 0.5, 0.75, 0.9, 1.0)
NEAR_BEST = 0.98   # attempts to reach 98% of the run's best speedup
NO_TIMING = ("no CUDA GPU: the kernels ran under the Triton interpreter on CPU tensors at small shapes, so no timing "
             "is real: speedups, fast_p for p > 0, geomeans and speed-of-light fractions are not reported")
# A problem skipped for want of an offline starter: agent/policies/offline.py's message around the generator's reason,
# which leads with its class (agent/kernels/inductor.py FAILURE_CLASSES)
NO_STARTER = re.compile(r"^no offline starter for .+?: (?P<kind>[a-z_]+): (?P<why>.*?)(?:; give --seed-kernel .*)?$",
                        re.S)


class SuiteReportError(Exception):
    """The report cannot be written as asked: one line for the user."""


# -- data -------------------------------------------------------------------------------------------------------
def collect(store, rows: list[dict]) -> list[dict]:
    """Each suite row with its run's numbers: the verified best (language, template, time, eager and compile
    times, speedups, SOL fraction), attempt counts, attempts to 98% of the best, cost and tokens, GPU and versions,
    and the per-attempt curve [(number, correct, speedup_eager)]."""
    out = []
    # the report is the operator's: a hidden variant's failure in full where the attempt kept it
    reasons = "COALESCE(withheld, reasons)" if "withheld" in store.db["attempts"].columns_dict else "reasons"
    for row in rows:
        result = {**{k: row.get(k) for k in ("problem", "level", "strategy", "policy", "status", "reason", "run_id",
                                           "seconds")},
                  "verified": False, "timed": False, "language": None, "template": None, "best_attempt": None,
                  "time_us": None, "eager_us": None, "compile_us": None, "speedup_eager": None,
                  "speedup_compile": None, "sol_fraction": None, "attempts": 0, "correct_attempts": 0,
                  "attempts_to_98": None, "cost_usd": 0.0, "tokens": 0, "gpu": None, "versions": None,
                  "last_failure": None, "curve": []}
        run_id = row.get("run_id")
        runs = list(store.db.query("SELECT gpu_name, driver, cuda, versions FROM runs WHERE id = ?",
                                   [run_id])) if run_id else []
        if runs:
            run = runs[0]
            result["gpu"] = {"name": run["gpu_name"], "driver": run["driver"], "cuda": run["cuda"]} \
                if run["gpu_name"] else None
            result["versions"] = json.loads(run["versions"]) if run["versions"] else None
            attempts = list(store.db.query(
                "SELECT id, number, verdict, language, speedup_eager, speedup_compile, sol_fraction, "
                "json_extract(time_us, '$.median') AS median, "
                "json_extract(result, '$.baselines.eager.median') AS eager, "
                "json_extract(result, '$.baselines.compile.median') AS compile, "
                f"json_extract({reasons}, '$[0]') AS reason, "
                "substr(source, 1, instr(source || char(10), char(10)) - 1) AS head FROM attempts "
                "WHERE run_id = ? ORDER BY number", [run_id]))
            usage = store.usage(run_id)
            result.update(attempts=len(attempts), correct_attempts=sum(a["verdict"] == "correct" for a in attempts),
                          cost_usd=usage["cost_usd"], tokens=usage["tokens"],
                          curve=[(a["number"], a["verdict"] == "correct", a["speedup_eager"]) for a in attempts],
                          last_failure=next((f"#{a['number']} {a['verdict']}" + (f": {a['reason']}" if a["reason"]
                                                                                   else "")
                                             for a in reversed(attempts) if a["verdict"] != "correct"), None))
            best_row = store.best_attempt(run_id)   # the store's one definition of a run's best
            best = next((a for a in attempts if best_row is not None and a["id"] == best_row.id), None)
            if best is not None:
                timed = best["median"] is not None
                result.update(verified=True, timed=timed, language=best["language"], template=_template(best["head"]),
                              best_attempt=best["number"], time_us=best["median"], eager_us=best["eager"],
                              compile_us=best["compile"],
                              speedup_eager=best["speedup_eager"] if timed else None,
                              speedup_compile=best["speedup_compile"] if timed else None,
                              sol_fraction=best["sol_fraction"] if timed else None,
                              attempts_to_98=attempts_to_near_best(result["curve"], best["speedup_eager"]
                                                                   if timed else None))
        out.append(result)
    return out


def attempts_to_near_best(curve: list[tuple[int, bool, float | None]], best: float | None) -> int | None:
    """The first attempt number at which a verified attempt reached NEAR_BEST of `best` (the run's best speedup);
    untimed (best None): the first verified attempt."""
    for number, correct, speedup in curve:
        if correct and (best is None or (speedup is not None and speedup >= NEAR_BEST * best)):
            return number
    return None


def _template(head: str | None) -> str | None:
    return (offline_marker(head) or {}).get("template")


def no_starter_classes(results: list[dict]) -> dict[str, list[dict]]:
    """The skipped problems without an offline starter, by the class of the reason: {class: [{problem, reason}]},
    the most frequent class first."""
    classes: dict[str, list[dict]] = collections.defaultdict(list)
    for r in results:
        m = NO_STARTER.match(r["reason"] or "") if r["status"] == "skipped" else None
        if m:
            classes[m["kind"]].append({"problem": r["problem"], "reason": m["why"]})
    return dict(sorted(classes.items(), key=lambda item: -len(item[1])))


def geomean(values: list[float | None]) -> float | None:
    """Geometric mean of the speedups known (None and 0, no speedup, left out); None when there are none. The one
    geomean of kloop's reports (suite, bench)."""
    values = [v for v in values if v is not None and v > 0]
    return statistics.geometric_mean(values) if values else None


def summarize(results: list[dict]) -> dict:
    """The suite's numbers over its finished problems (module docstring: definitions)."""
    finished = [r for r in results if r["status"] in FINISHED]
    n = len(finished)
    verified = [r for r in finished if r["verified"]]
    timed = any(r["timed"] for r in results) or any(r["gpu"] for r in results)
    fast_p: dict[str, dict[str, float | None]] = {}
    counts: dict[str, dict[str, int | None]] = {}
    for baseline in BASELINES:
        fast_p[baseline], counts[baseline] = {}, {}
        for p in P_VALUES:
            if p == 0:
                hits = len(verified)
            elif timed:
                hits = sum(1 for r in verified if (r[f"speedup_{baseline}"] or 0) > p)
            else:
                hits = None
            counts[baseline][_p(p)] = hits
            fast_p[baseline][_p(p)] = hits / n if n and hits is not None else None
    geomeans = {}
    for baseline in BASELINES:
        speedups = [r[f"speedup_{baseline}"] for r in verified if r[f"speedup_{baseline}"]]
        all_problems = [r[f"speedup_{baseline}"] if r["verified"] and r[f"speedup_{baseline}"] else 1.0
                        for r in finished]
        geomeans[baseline] = {
            "verified_only": geomean(speedups) if timed else None, "verified_timed": len(speedups),
            "all_problems_fallback_1x": geomean(all_problems) if timed and n else None}
    sols = sorted(r["sol_fraction"] for r in verified if r["sol_fraction"] is not None)
    attempts = [r["attempts"] for r in finished if r["status"] == "done"]
    seconds = [r["seconds"] for r in finished if r["seconds"]]
    near = [r["attempts_to_98"] for r in verified if r["attempts_to_98"] is not None]
    return {
        "problems": len(results), "finished": n, "verified": len(verified),
        "correctness_rate": len(verified) / n if n else None,
        "statuses": {s: sum(1 for r in results if (r["status"] or "not reached") == s)
                     for s in ("done", "skipped", "failed", "running", "stopped", "not reached")},
        "timing_is_real": timed, "fast_p": fast_p, "fast_p_counts": counts, "geomean": geomeans,
        "sol_fraction": {"count": len(sols), "quartiles": _quartiles(sols), "histogram": _histogram(sols)},
        "attempts": {"total": sum(r["attempts"] for r in results), "median": _median(attempts),
                     "median_to_98_percent_of_best": _median(near)},
        "seconds": {"total": sum(seconds), "median": _median(seconds)},
        "cost_usd": {"total": sum(r["cost_usd"] for r in results),
                     "median": _median([r["cost_usd"] for r in finished if r["status"] == "done"])},
        "tokens": sum(r["tokens"] for r in results),
        "no_starter": {kind: [p["problem"] for p in problems]
                       for kind, problems in no_starter_classes(results).items()},
    }


def compare(results: list[dict]) -> list[dict]:
    """One row per strategy (an equal budget per problem): problems, verified, geomeans, attempts to 98% of the
    best, attempts, cost, time."""
    rows = []
    for strategy in dict.fromkeys(r["strategy"] for r in results):
        own = [r for r in results if r["strategy"] == strategy]
        s = summarize(own)
        rows.append({"strategy": strategy, "finished": s["finished"], "verified": s["verified"],
                     "geomean_eager": s["geomean"]["eager"]["verified_only"],
                     "geomean_compile": s["geomean"]["compile"]["verified_only"],
                     "geomean_eager_all": s["geomean"]["eager"]["all_problems_fallback_1x"],
                     "median_attempts_to_98": s["attempts"]["median_to_98_percent_of_best"],
                     "attempts": s["attempts"]["total"], "cost_usd": s["cost_usd"]["total"],
                     "seconds": s["seconds"]["total"]})
    return rows


def curve_by_attempt(results: list[dict], attempts: int, timed: bool) -> list[float | None]:
    """Per attempt number k = 1..attempts over the finished problems: timed, the geomean of each problem's best so
    far, the highest verified speedup over eager up to attempt k or the PyTorch reference's 1.0x where that is
    higher (so the curve never falls); untimed, the fraction of problems with a verified attempt by k."""
    finished = [r for r in results if r["status"] in FINISHED]
    if not finished:
        return []
    curve = []
    for k in range(1, attempts + 1):
        if timed:
            values = []
            for r in finished:
                seen = [s for number, correct, s in r["curve"] if correct and s and number <= k]
                values.append(max(seen + [1.0]))
            curve.append(geomean(values))
        else:
            curve.append(sum(1 for r in finished if any(c and number <= k for number, c, _ in r["curve"]))
                         / len(finished))
    return curve


def _p(p: float) -> str:
    return f"{p:g}"


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _quartiles(values: list[float]) -> dict | None:
    if not values:
        return None
    q = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else [values[0]] * 3
    return {"min": values[0], "p25": q[0], "median": q[1], "p75": q[2], "max": values[-1]}


def _histogram(values: list[float]) -> list[dict]:
    edges = list(SOL_BINS) + [math.inf]
    return [{"from": lo, "to": None if hi == math.inf else hi, "count": sum(1 for v in values if lo <= v < hi)}
            for lo, hi in zip(edges, edges[1:])]


# -- figures ----------------------------------------------------------------------------------------------------
def speedup_figure(results: list[dict], gpu_name: str | None, strategy: str | None = None):
    """Timed: per problem the verified kernel's speedup over eager and over torch.compile (log scale, sorted),
    problems without one marked along the bottom; below, fast_p against p for both baselines."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, PercentFormatter

    finished = [r for r in results if r["status"] in FINISHED]
    fig = Figure(figsize=(11, 8.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[3, 2])
    order = sorted(finished, key=lambda r: (not r["verified"], -(r["speedup_compile"] or r["speedup_eager"] or 0)))
    xs = range(len(order))
    # eager as rings over the squares: where torch.compile calls the same library as eager (a matmul) they coincide
    for baseline, style in (("eager", {"marker": "o", "s": 40, "facecolors": "none", "edgecolors": "tab:blue",
                                       "linewidths": 1.3, "zorder": 4}),
                            ("compile", {"marker": "s", "s": 22, "color": "tab:orange", "zorder": 3})):
        points = [(i, r[f"speedup_{baseline}"]) for i, r in zip(xs, order) if r[f"speedup_{baseline}"]]
        if points:
            top.scatter(*zip(*points), label=f"vs {'torch.compile' if baseline == 'compile' else 'eager'}", **style)
    missing = [i for i, r in zip(xs, order) if not r["verified"]]
    if missing:
        top.plot(missing, [0.03] * len(missing), "x", color="tab:red", transform=top.get_xaxis_transform(),
                 clip_on=False, label="no verified kernel")
    top.set_yscale("log")
    top.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
    lo, hi = top.get_ylim()
    # within a decade 1-2-5 leaves a lone "1x": 1.54x could not be read off the axis (nor 1.44x off 1-1.2-1.5
    # between 0.98x and 1.47x)
    subs = (1.0, 2.0, 5.0) if hi / lo > 10 else (1.0, 1.2, 1.5, 2.0, 3.0, 5.0, 7.0) if hi / lo > 2 else \
        (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0)
    top.yaxis.set_major_locator(LogLocator(base=10, subs=subs))
    top.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    top.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    top.set_ylim(lo / 1.6 if missing else lo, hi)     # a band below every speedup for the crosses
    top.xaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_xlabel("problem (sorted by speedup over torch.compile)")
    top.set_ylabel("speedup of the verified kernel")
    top.grid(alpha=0.3, which="major")
    top.legend(fontsize="small", loc="upper right")
    count = f"{len(finished)} problems" if len(finished) == len(results) else \
        f"{len(finished)} of {len(results)} problems finished"
    top.set_title(count + (f" on {gpu_name}" if gpu_name else "")
                  + (f", strategy {strategy}" if strategy else ""))
    ps = [i / 20 for i in range(0, 61)]
    n = len(finished) or 1
    for baseline, color in (("eager", "tab:blue"), ("compile", "tab:orange")):
        fractions = [sum(1 for r in finished if r["verified"] and (r[f"speedup_{baseline}"] or 0) > p) / n
                     for p in ps]
        fractions[0] = sum(1 for r in finished if r["verified"]) / n  # fast_0: every verified kernel
        bottom.step(ps, fractions, where="post", color=color,
                    label=f"vs {'torch.compile' if baseline == 'compile' else 'eager'}")
    for p in P_VALUES[1:]:
        bottom.axvline(p, color="lightgray", linestyle=":", linewidth=1)
    bottom.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    bottom.set_ylim(0, 1.02)
    bottom.set_xlim(0, 3)
    bottom.set_xlabel("p (speedup threshold)")
    bottom.set_ylabel("fast_p: correct and faster than p")
    bottom.grid(alpha=0.3)
    bottom.legend(fontsize="small")
    return fig


def outcome_figure(results: list[dict]):
    """Untimed: how each finished problem ended (verified kernel, none verified, skipped, failed), per strategy."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    kinds = (("verified kernel", "tab:green", lambda r: r["verified"]),
             ("ran, none verified", "tab:orange", lambda r: r["status"] == "done" and not r["verified"]),
             ("skipped", "tab:gray", lambda r: r["status"] == "skipped"),
             ("failed", "tab:red", lambda r: r["status"] == "failed"))
    fig = Figure(figsize=(9, 1.6 + 0.6 * len(strategies)), layout="constrained")
    ax = fig.subplots()
    for row, strategy in enumerate(strategies):
        own = [r for r in results if r["strategy"] == strategy and r["status"] in FINISHED]
        left = 0
        for label, color, test in kinds:
            count = sum(1 for r in own if test(r))
            if count:
                ax.barh(row, count, left=left, color=color, label=label if row == 0 else None)
                ax.text(left + count / 2, row, str(count), ha="center", va="center", color="white", fontsize="small")
            left += count
    ax.set_yticks(range(len(strategies)), strategies)
    ax.invert_yaxis()   # the first strategy on top
    ax.set_ylabel("strategy")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("problems")
    fig.legend(fontsize="small", loc="outside lower center", ncols=4)
    ax.set_title("outcome per problem\n(no CUDA GPU: Triton interpreter on CPU, no timing is real)", fontsize="medium")
    return fig


def sol_figure(results: list[dict], gpu_name: str | None, strategy: str | None = None):
    """The distribution of the verified kernels' speed-of-light fractions (None when there are none)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    sols = [r["sol_fraction"] for r in results if r["status"] in FINISHED and r["sol_fraction"] is not None]
    if not sols:
        return None
    fig = Figure(figsize=(8, 4.2), layout="constrained")
    ax = fig.subplots()
    top = max(1.0, max(sols))
    ax.hist(sols, bins=[i / 20 for i in range(0, int(top * 20) + 2)], color="tab:green", edgecolor="white")
    ax.axvline(statistics.median(sols), color="black", linestyle="--", linewidth=1,
               label=f"median {statistics.median(sols):.0%}")
    ax.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlabel("speed-of-light fraction of the verified kernel (roofline time / kernel time)")
    ax.set_ylabel("problems")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize="small")
    ax.set_title(f"speed of light reached: {len(sols)} verified, timed kernels"   # the GPU on a line of its own:
                 + (f"\non {gpu_name}" if gpu_name else "")                         # a mixed suite names two
                 + (f", strategy {strategy}" if strategy else ""))
    return fig


def strategy_figure(results: list[dict], timed: bool):
    """Strategies at an equal budget: the best so far per attempt (geomean over problems, 1.0x before a first
    verified kernel; untimed: problems verified so far), and the attempts each needed to reach 98% of its best."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, PercentFormatter

    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    budget = max([r["attempts"] for r in results] + [1])
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[3, 2])
    for i, strategy in enumerate(strategies):   # line styles and markers differ, so equal curves stay visible
        own = [r for r in results if r["strategy"] == strategy]
        curve = curve_by_attempt(own, budget, timed)
        if curve:
            left.plot(range(1, len(curve) + 1), curve, marker="osD^"[i % 4], markersize=7 - 1.5 * (i % 4),
                      linestyle=("-", "--", ":", "-.")[i % 4], label=strategy)
    left.set_xlabel("attempt")
    left.xaxis.set_major_locator(MaxNLocator(integer=True))
    if timed:
        left.set_ylabel("geomean best-so-far speedup over eager\n(the reference's 1.0x where higher)")
        left.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
    else:
        left.set_ylabel("problems with a verified kernel")
        left.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        left.set_ylim(0, 1.02)
    left.grid(alpha=0.3)
    left.legend(fontsize="small")
    left.set_title("best so far" if timed else "verified so far (no timing: CPU interpreter)", fontsize="medium")
    data = [[r["attempts_to_98"] for r in results if r["strategy"] == s and r["attempts_to_98"] is not None]
            for s in strategies]
    positions = range(len(strategies))
    for i, values in zip(positions, data):
        if values:
            right.scatter([i] * len(values), values, alpha=0.5, color="tab:blue", s=18)
            right.plot([i - 0.3, i + 0.3], [statistics.median(values)] * 2, color="black", linewidth=2)
    right.set_xticks(list(positions), strategies)
    right.set_xlim(-0.6, len(strategies) - 0.4)
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylim(0, budget + 1)
    right.set_ylabel("attempt" if not timed else "attempts to 98% of the run's best")
    right.set_title("attempts to 98% of each run's best (bar: median)" if timed
                    else "attempts to the first verified kernel (bar: median)", fontsize="medium")
    right.grid(alpha=0.3, axis="y")
    return fig


# -- the report -------------------------------------------------------------------------------------------------
def _num(value: Any, fmt: str = "{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def report_markdown(summaries: dict[str, dict], results: list[dict], context: dict, images: list[str],
                    comparison: list[dict]) -> str:
    """summaries: per strategy, the first one primary (its speed-of-light and effort sections; the others are in the
    comparison table)."""
    primary, summary = next(iter(summaries.items()))
    several = len(summaries) > 1
    timed = any(s["timing_is_real"] for s in summaries.values())
    gpu = context.get("gpu") or {}
    versions = context.get("versions") or {}
    lines = [f"# kloop suite: {context.get('title') or 'report'}", ""]
    machine = [["GPU", gpu.get("name") or "none (CPU, Triton interpreter)"], ["driver", gpu.get("driver")],
               ["CUDA (driver)", gpu.get("cuda")]] + [[f"{k} (torch's)" if k == "cuda" else k, v]
                                                       for k, v in versions.items()]
    machine += [[k, v] for k, v in (context.get("settings") or {}).items()]
    lines += [markdown_table(["", ""], machine), ""]
    if not timed:
        lines += [f"**{NO_TIMING}.**", ""]
    if len(context.get("gpus") or {}) > 1:
        lines += ["**The problems ran on more than one kind of GPU** (a suite resumed on another machine). Each "
                  "speedup is against baselines timed beside the kernel on its own GPU; problems.csv's `gpu` column "
                  "names it. The times in microseconds compare only within one GPU.", ""]
    lines += _numbers_sections(summaries, several)
    sol = summary["sol_fraction"]
    if sol["count"]:
        q = sol["quartiles"]
        lines += [f"## Speed of light{f' (strategy {primary})' if several else ''}", "",
                  f"{sol['count']} verified, timed kernels: min {q['min']:.0%}, quartiles {q['p25']:.0%} / "
                  f"{q['median']:.0%} / {q['p75']:.0%}, max {q['max']:.0%} of speed-of-light (roofline time / "
                  "kernel time).", "",
                  markdown_table(["SOL fraction", "problems"],
                                 [[f"{b['from']:.0%}–{b['to']:.0%}" if b["to"] is not None else f"≥ {b['from']:.0%}",
                                   b["count"]] for b in sol["histogram"]]), ""]
    a, s, c = summary["attempts"], summary["seconds"], summary["cost_usd"]
    lines += [f"## Effort{f' (strategy {primary}; the others below)' if several else ''}", "", markdown_table(["", "total", "median per problem"], [
        ["attempts", a["total"], _num(a["median"], "{:g}")],
        ["attempts to 98% of the run's best" if timed else "attempts to the first verified kernel", "",
         _num(a["median_to_98_percent_of_best"], "{:g}")],
        ["wall time (s)", _num(s["total"], "{:.0f}"), _num(s["median"], "{:.0f}")],
        ["model cost (USD)", _num(c["total"], "{:.2f}"), _num(c["median"], "{:.3f}")],
        ["tokens", summary["tokens"], ""]]), ""]
    if several:
        lines += ["## Strategies at an equal budget", "", markdown_table(
            ["strategy", "verified", "geomean x eager (verified)", "geomean x compile (verified)",
             "geomean x eager (all, 1.0x fallback)",
             "median attempts to 98% of best" if timed else "median attempts to first verified", "attempts",
             "cost USD", "time s"],
            [[r["strategy"], f"{r['verified']}/{r['finished']}", _num(r["geomean_eager"], "{:.2f}x"),
              _num(r["geomean_compile"], "{:.2f}x"), _num(r["geomean_eager_all"], "{:.2f}x"),
              _num(r["median_attempts_to_98"], "{:g}"), r["attempts"], _num(r["cost_usd"], "{:.2f}"),
              _num(r["seconds"], "{:.0f}")] for r in comparison]), ""]
    lines += [f"![{Path(image).stem}]({image})" for image in images] + [""]
    lines += _problem_sections(results, timed)
    return "\n".join(lines)


def _numbers_sections(summaries: dict[str, dict], several: bool) -> list[str]:
    """Each strategy's correctness, fast_p and geomeans, then how they are defined."""
    lines = []
    for strategy, own in summaries.items():
        finished, n = own["finished"], own["problems"]
        lines += [f"## Numbers{f': strategy {strategy}' if several else ''}", "",
                  f"{finished} of {n} problems finished"
                  + (f" ({n - finished} not reached or stopped mid-run: left out of every number below)"
                     if finished < n else "") + ".", "", markdown_table(
            ["", "vs eager", "vs torch.compile"],
            [["correct (fast_0)", f"{own['verified']}/{finished} ({_percent(own['correctness_rate'])})", ""]]
            + [[f"fast_{_p(p)}", _fast(own, "eager", p, finished), _fast(own, "compile", p, finished)]
               for p in P_VALUES[1:]]
            + [["geomean speedup, verified kernels only",
                _num(own["geomean"]["eager"]["verified_only"], "{:.2f}x"),
                _num(own["geomean"]["compile"]["verified_only"], "{:.2f}x")],
               ["geomean speedup, all problems (no verified kernel = 1.0x)",
                _num(own["geomean"]["eager"]["all_problems_fallback_1x"], "{:.2f}x"),
                _num(own["geomean"]["compile"]["all_problems_fallback_1x"], "{:.2f}x")]]), ""]
    lines += ["How the numbers are defined (KernelBench's): a problem is correct when its run has a verified best "
              "kernel (trusted evaluator, main shape and hidden variants); fast_p counts the problems whose kernel "
              "is correct **and** more than p times faster than the baseline, divided by all finished problems "
              "(skipped and failed ones included, as not correct). The first geomean is over the problems with a "
              "verified, timed kernel only (the same problems for both baselines); the second is over all finished "
              "problems, where a problem without a verified kernel counts as 1.0x (its PyTorch reference is kept) "
              "and a verified kernel counts at its measured speedup, also when below 1.", ""]
    return lines


def _problem_sections(results: list[dict], timed: bool) -> list[str]:
    """The problems below torch.compile, those without a verified kernel, the skipped and failed, then every one."""
    lines = []
    below = [r for r in results if r["speedup_compile"] is not None and r["speedup_compile"] < 1]
    if below:
        lines += ["## Below torch.compile", "", "Verified kernels slower than torch.compile, with the starter they "
                  "were tuned from (an `inductor/...` starter is torch.compile's own Triton: below 1.0x it lost to "
                  "Inductor's autotuned configuration or to its cuBLAS/cuDNN calls).", "",
                  markdown_table(["problem", "strategy", "x compile", "x eager", "starter", "attempts"],
                                 [[r["problem"], r["strategy"], _num(r["speedup_compile"]), _num(r["speedup_eager"]),
                                   r["template"] or "model-written", r["attempts"]] for r in below]), ""]
    unverified = [r for r in results if r["status"] == "done" and not r["verified"]]
    if unverified:
        lines += ["## Runs without a verified kernel", "", markdown_table(
            ["problem", "strategy", "attempts", "last failed attempt"],
            [[r["problem"], r["strategy"], r["attempts"], (r["last_failure"] or "")[:300]] for r in unverified]), ""]
    classes = no_starter_classes(results)
    if classes:
        lines += ["## Without a starter, by class", "", "Problems the offline policy could not start (the generator's "
                  "class of failure, agent/kernels/inductor.py), with the first problem's reason.", "",
                  markdown_table(["class", "problems", "count", "reason (first)"],
                                 [[kind, ", ".join(p["problem"] for p in problems), len(problems),
                                   problems[0]["reason"][:200]] for kind, problems in classes.items()]), ""]
    not_ok = [r for r in results if r["status"] in ("skipped", "failed")]
    if not_ok:
        lines += ["## Skipped and failed", "", markdown_table(
            ["problem", "strategy", "status", "reason"],
            [[r["problem"], r["strategy"], r["status"], (r["reason"] or "")[:300]] for r in not_ok]), ""]
    lines += ["## Problems", "", markdown_table(
        ["problem", "strategy", "status", "verified", "language", "starter", "x eager", "x compile", "SOL",
         "attempts", "to 98%" if timed else "to 1st verified", "time s", "USD"],
        [[r["problem"], r["strategy"], r["status"] or "not reached", "yes" if r["verified"] else "no",
          r["language"], r["template"], _num(r["speedup_eager"]), _num(r["speedup_compile"]),
          _percent(r["sol_fraction"]), r["attempts"], r["attempts_to_98"], _num(r["seconds"], "{:.0f}"),
          _num(r["cost_usd"], "{:.3f}")] for r in results]), ""]
    return lines


def _fast(summary: dict, baseline: str, p: float, finished: int) -> str:
    count = summary["fast_p_counts"][baseline][_p(p)]
    if count is None:
        return "– (not timed)"
    return f"{count}/{finished} ({_percent(summary['fast_p'][baseline][_p(p)])})"


CSV_COLUMNS = ("problem", "level", "strategy", "policy", "status", "reason", "run_id", "verified", "language",
               "template", "best_attempt", "time_us", "eager_us", "compile_us", "speedup_eager", "speedup_compile",
               "sol_fraction", "attempts", "correct_attempts", "attempts_to_98", "seconds", "cost_usd", "tokens",
               "gpu")


def gpu_counts(results: list[dict]) -> dict[str, int]:
    """The GPUs the problems' runs were timed on, with how many problems each, most first."""
    names = collections.Counter((r["gpu"] or {}).get("name") for r in results if r["gpu"])
    return dict(names.most_common())


def write_suite_report(store, rows: list[dict], out_dir, context: dict | None = None) -> list[Path]:
    """report.md, problems.csv, report.json and the PNGs (speedups.png and sol.png when timed, outcome.png
    when not, strategies.png with more than one strategy) in out_dir (created if needed)."""
    context = dict(context or {})
    results = collect(store, rows)
    strategies = list(dict.fromkeys(r["strategy"] for r in results))
    summaries = {s: summarize([r for r in results if r["strategy"] == s]) for s in strategies} or \
        {"-": summarize([])}
    primary = strategies[0] if strategies else None
    own = [r for r in results if r["strategy"] == primary]
    named = primary if len(strategies) > 1 else None
    comparison = compare(results)
    first = next((r for r in results if r["gpu"] or r["versions"]), {})
    context.setdefault("gpu", first.get("gpu"))
    context.setdefault("versions", first.get("versions"))
    context["gpus"] = per_gpu = gpu_counts(results)
    if len(per_gpu) > 1:   # a suite resumed on another kind of GPU: say so wherever the GPU is named
        context["gpu"] = {**(context.get("gpu") or {}),
                          "name": ", ".join(f"{name} ({count} problems)" for name, count in per_gpu.items())}
    gpu_name = " / ".join(per_gpu) or (context.get("gpu") or {}).get("name")
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        figures = []
        timed = any(s["timing_is_real"] for s in summaries.values())
        if timed:
            figures += [("speedups.png", speedup_figure(own, gpu_name, named)),
                        ("sol.png", sol_figure(own, gpu_name, named))]
        else:
            figures.append(("outcome.png", outcome_figure(results)))
        if len(strategies) > 1:
            figures.append(("strategies.png", strategy_figure(results, timed)))
        written = []
        for name, figure in figures:
            if figure is not None:
                figure.savefig(out / name, dpi=110)
                written.append(out / name)
        (out / "report.md").write_text(report_markdown(summaries, results, context, [p.name for p in written],
                                                      comparison))
        with open(out / "problems.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**r, "gpu": (r["gpu"] or {}).get("name")} for r in results)
        document = {"context": context, "definitions": __doc__.split("Definitions (KernelBench's): ", 1)[1].strip(),
                    "summary": summaries.get(primary), "summaries": summaries, "strategies": comparison,
                    "problems": [{k: v for k, v in r.items() if k != "curve"} for r in results]}
        (out / "report.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    except OSError as e:
        raise SuiteReportError(f"cannot write the suite report to {out}: {e.strerror or e}") from None
    return written + [out / "report.md", out / "problems.csv", out / "report.json"]
