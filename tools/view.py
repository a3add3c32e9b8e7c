"""One attempt in words and two attempts' diff (`kloop show --attempt`, `kloop diff`), and the run viewer: one
self-contained HTML file per run or suite (`kloop view`), readable offline.

The page is a Jinja2 template (tools/templates/), the plots are tools.report's matplotlib figures inlined as PNG,
sources are highlighted by Pygments and diffed by difflib; nothing is loaded from the network when it is read.
"""
from __future__ import annotations

import difflib


def attempt_facts(a: dict, parent: dict | None) -> list[tuple[str, str]]:
    """An attempt's facts as (name, value) lines: what it was, its parent and why the strategy picked it, its
    timings, correctness, counters and where its time went. Values are plain text (candidate text included)."""
    facts = [("what", ", ".join(x for x in (a.get("language"), f"branch {a['branch']}", f"turn {a.get('turn')}",
                                          a.get("created_at")) if x))]
    if parent is not None:
        facts.append(("parent", f"#{parent['number']}"))
    elif a.get("parent_attempt_id") is None:
        facts.append(("parent", "none (started from the target alone)"))
    if a.get("parent_reason"):
        facts.append(("strategy", a["parent_reason"]))
    if a.get("island") is not None:
        facts.append(("island", str(a["island"])))
    if a.get("archive_cell"):
        facts.append(("cell", a["archive_cell"]))
    time_us = a.get("time_us") or {}
    if time_us.get("median") is not None:
        spread = f", IQR {time_us['iqr']:.2f} us" if time_us.get("iqr") is not None else ""
        calls = f", {time_us['n']} calls" if time_us.get("n") else ""
        facts.append(("time", f"median {time_us['median']:.2f} us{spread}{calls}"))
    speed = [f"{a[k]:.2f}x {name}" for k, name in (("speedup_eager", "eager"), ("speedup_compile", "torch.compile"))
             if a.get(k) is not None]
    if a.get("sol_fraction") is not None:
        bound = (a.get("roofline") or {}).get("bound")
        speed.append(f"{a['sol_fraction']:.0%} of speed-of-light" + (f" ({bound}-bound)" if bound else ""))
    if speed:
        facts.append(("speed", ", ".join(speed)))
    c = a.get("correctness") or {}
    if c.get("trials"):
        facts.append(("correctness", f"{c['trials']} trials over {c.get('shapes')} shapes, max abs error "
                                     f"{c.get('max_abs_err') or 0:.3g}"))
    for res in a.get("resources") or []:
        values = ", ".join(f"{k.replace('_', ' ')} {res[k]}" for k in (
            "registers", "spills", "shared_bytes", "num_warps", "num_stages", "occupancy") if res.get(k) is not None)
        facts.append((f"kernel {res.get('kernel')}", values))
    for kernel, n in (a.get("ncu") or {}).items():
        facts.append((f"ncu {kernel}", ", ".join(f"{k} {v}" for k, v in n.items() if not isinstance(v, (list, dict)))))
    durations = a.get("durations") or {}
    spent = [f"{k} {v:.2f} s" for k, v in durations.items() if isinstance(v, (int, float))]
    if spent:
        facts.append(("durations", ", ".join(spent)))
    if a.get("flags"):
        facts.append(("flags", ", ".join(a["flags"])))
    if a.get("diagnosis"):
        facts.append(("diagnosis", "; ".join(a["diagnosis"].splitlines())))
    return facts


def source_diff(old: dict | None, new: dict) -> str:
    """A unified diff of two attempts' sources (old None: from nothing), named by attempt number."""
    before = (old or {}).get("source") or ""
    after = new.get("source") or ""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        f"attempt {old['number']}" if old else "(nothing)",
                                        f"attempt {new['number']}"))
