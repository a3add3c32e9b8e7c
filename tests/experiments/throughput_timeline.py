"""The picture of a throughput run (not a test): where each GPU's time per candidate goes, attempt by attempt, from
the timeline.csv that tests/experiments/throughput.py writes.

    python tests/experiments/throughput_timeline.py results/throughput-h200x2/timeline.csv timeline.png

One column per target, two rows:
- top: attempts logged against seconds into the target's loop, for each phase (N GPUs, one GPU): the slope is the
  rate; the first attempt's wait (the reference's first run, the baselines' first timing) is the offset at the start.
- bottom: each attempt's seconds on its device, stacked by stage (load, verify, profile: the timed rounds), against
  when it was logged, one marker shape per device and a dashed line for each phase's median after the first: a
  device busier per candidate is what a phase with fewer candidates a minute shows.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

# A device's time per candidate, as tools/records/bench.py's evaluation_seconds counts it (its "device")
STAGES = (("load_s", "load"), ("verify_s", "verify"), ("profile_s", "profile: the timed rounds"))
PHASES = {"pipelined": "{n} GPUs", "scaling_one_gpu": "one GPU", "sequential": "one at a time"}


def _float(value: str) -> float:
    return float(value) if value not in ("", None) else 0.0


def _label(phase: str, rows: list[dict]) -> str:
    """The phase as the legend names it: the pipelined one by the number of devices its attempts ran on."""
    return PHASES.get(phase, phase).format(n=len({r["device"] for r in rows}))


def read(path: Path) -> dict[str, dict[str, list[dict]]]:
    """{target: {phase: [rows in logged order]}}."""
    runs: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            runs[row["target"]][row["phase"]].append(row)
    return runs


def draw(runs: dict[str, dict[str, list[dict]]], out: Path, title: str) -> None:
    from matplotlib.figure import Figure   # no pyplot: no display, no global state

    targets = sorted(runs)
    fig = Figure(figsize=(5 * len(targets), 8), layout="constrained")
    axes = fig.subplots(2, len(targets), squeeze=False, sharey="row")
    colors = dict(zip(PHASES, ("tab:blue", "tab:orange", "tab:green")))
    shades = ("tab:gray", "tab:purple", "tab:red")
    for column, target in enumerate(targets):
        top, bottom = axes[0][column], axes[1][column]
        for phase, rows in runs[target].items():
            logged = [_float(r["logged_s"]) for r in rows]
            rate = 60 * (len(rows) - 1) / (logged[-1] - logged[0]) if len(rows) > 1 and logged[-1] > logged[0] else 0
            top.step(logged, range(1, len(rows) + 1), where="post", color=colors.get(phase),
                     label=f"{_label(phase, rows)}: {len(rows)} ({rate:.0f}/min after the first)")
            devices = sorted({r["device"] for r in rows})
            for device, marker in zip(devices, ("o", "s", "^", "v")):
                mine = [r for r in rows if r["device"] == device]
                x = [_float(r["logged_s"]) for r in mine]
                base = [0.0] * len(mine)
                for (key, stage), shade in zip(STAGES, shades):
                    heights = [_float(r[key]) for r in mine]
                    first = column == 0 and phase == next(iter(runs[target])) and device == devices[0]
                    bottom.bar(x, heights, bottom=base, width=0.25, color=shade, alpha=0.5,
                               label=stage if first else None)
                    base = [b + h for b, h in zip(base, heights)]
                bottom.scatter(x, base, marker=marker, s=14, color=colors.get(phase),
                               label=f"{_label(phase, rows)}, {device}")
            device_s = [sum(_float(r[key]) for key, _ in STAGES) for r in rows[1:]]
            if device_s:
                bottom.axhline(statistics.median(device_s), color=colors.get(phase), lw=1, ls="--")
        top.set_title(target)
        top.set_xlabel("seconds into the target's loop")
        top.legend(fontsize=8, loc="upper left")
        top.grid(alpha=0.3)
        bottom.set_xlabel("seconds into the target's loop (when the attempt was logged)")
        bottom.legend(fontsize=7, loc="upper right")
        bottom.grid(alpha=0.3)
    axes[0][0].set_ylabel("attempts logged")
    axes[1][0].set_ylabel("device seconds per attempt\n(--: each phase's median after the first)")
    fig.suptitle(title)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("timeline", type=Path, help="a timeline.csv of tests/experiments/throughput.py")
    parser.add_argument("out", type=Path, help="the picture to write (.png)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args()
    if not args.timeline.is_file():
        sys.exit(f"error: no such file: {args.timeline}")
    runs = read(args.timeline)
    if not runs:
        sys.exit(f"error: {args.timeline} has no attempts")
    draw(runs, args.out, args.title or f"where each candidate's device time goes ({args.timeline})")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
