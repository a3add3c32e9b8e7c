"""Throughput of the loop on one node (not a test): candidates per minute per target, the evaluator's overhead and
where it goes, and the bench's own figures, pipelined against one candidate at a time, side by side in one run.

    python tests/experiments/throughput.py --out "$OUT"                       # one GPU, about 8 minutes
    python tests/experiments/throughput.py --gpus 0,1 --phases breakdown,pipelined,one-gpu --out "$OUT"
                                                                  # 2 GPUs, then GPU 0 alone: about 9 minutes

Phases (each skipped, and said so, when the --budget-s left cannot hold it):
1. breakdown: vector_add's triton_block starter evaluated one at a time (tests/experiments/evaluator.py's measure):
   wall, overhead beyond compile, each stage and each wait on another process, medians with quartiles.
2. pipelined: the offline policy on each small built-in target for --seconds-per-target, in one evaluator session
   (parallel jailed planners, one executor and referee per GPU, attempts in flight); then the best kernel re-timed
   with eager on the same device (its time, speedup and timing CV).
3. sequential: the same on --sequential-targets with one planner and one attempt in flight (the loop as it was
   before pipelining, with today's evaluator).
4. one-gpu (with --gpus): phase 2 again on the first GPU alone, for the ratio of candidates per minute.
--phases picks among them (default: breakdown,pipelined,sequential, and one-gpu with --gpus). A target's rate is
its attempts over the whole loop window (the first attempt waits for its target's one-time costs: the reference's
first run and the torch.compile baseline's autotuning) and, beside it, the rate after the first attempt was logged.
The last lines are a short table; the full report goes to OUT/throughput.json, every attempt's stages and waits to
OUT/timeline.csv, the host's load every half second (busy cores, the driver process's cores, stopped planners) to
OUT/host.csv, the run database to OUT/throughput.db.gz.
tests/experiments/throughput_timeline.py draws OUT/timeline.csv: attempts over time and each candidate's device time.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "experiments"))

import evaluator as evaluator_breakdown  # noqa: E402  (tests/experiments/evaluator.py)

from agent import run as runs  # noqa: E402
from sandbox import placement  # noqa: E402
from sandbox.evaluate import EvalSettings, Session, versions  # noqa: E402
from tools.records import bench  # noqa: E402
from tools.profile import gpu_info  # noqa: E402
from tools.records.store import open_db  # noqa: E402
from tools.target import load_target  # noqa: E402

SMALL = ("vector_add", "gelu", "softmax", "layernorm", "rmsnorm", "row_sum")
GOAL_PER_MINUTE = 60.0
GOAL_OVERHEAD_S = 0.5


class HostSampler:
    """Every `every_s` while the bench runs, what the host does: the share of all cores busy (/proc/stat), the cores
    this driver process uses (the loop, the pipeline's threads and the store share one GIL: near 1.0, it is the
    bottleneck), and how many processes are stopped (SIGSTOP: jailed planners while a kernel is timed on their GPU).
    Rows go to OUT/host.csv; each phase's medians and 90th percentiles to its report."""

    COLUMNS = ("t_s", "phase", "cores_busy", "driver_cores", "stopped_processes")

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s, self.rows, self.label = every_s, [], ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-sampler", daemon=True)

    @staticmethod
    def _cpu_ticks() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)   # total, idle + iowait

    @staticmethod
    def _stopped() -> int:
        count = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                count += stat.read_text().rsplit(")", 1)[1].split()[0] == "T"
            except (OSError, IndexError):
                continue
        return count

    def _run(self) -> None:
        began, (total, idle), driver = time.monotonic(), self._cpu_ticks(), time.process_time()
        while not self._stop.wait(self.every_s):
            (t2, i2), d2 = self._cpu_ticks(), time.process_time()
            busy = 1 - (i2 - idle) / (t2 - total) if t2 > total else 0.0
            self.rows.append((round(time.monotonic() - began, 2), self.label, round(busy, 3),
                              round((d2 - driver) / self.every_s, 3), self._stopped()))
            total, idle, driver = t2, i2, d2

    def start(self) -> "HostSampler":
        self._thread.start()
        return self

    def stop(self, path: Path) -> None:
        self._stop.set()
        self._thread.join()
        with open(path, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(self.COLUMNS)
            out.writerows(self.rows)

    def summary(self, label: str) -> dict:
        rows = [r for r in self.rows if r[1] == label]
        found = {}
        for i, name in enumerate(self.COLUMNS[2:], start=2):
            values = sorted(r[i] for r in rows)
            if values:
                found[name] = {"median": statistics.median(values), "p90": values[int(0.9 * (len(values) - 1))]}
        return found


class Clock:
    def __init__(self, budget_s: float) -> None:
        self.start, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)


def say(*parts) -> None:
    print(*parts, flush=True)


def median_of(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def one_target(store, name: str, seconds: float, evaluator: dict, session) -> dict:
    """One target's offline run in `session` for `seconds` of loop time, then its best re-timed beside eager."""
    cap = 10**9
    settings = runs.settings_for(name, max_attempts=cap, hours=seconds / 3600, target_sol=sys.float_info.max,
                                 patience=cap, started_by="tests/experiments/throughput.py", **evaluator)
    run = runs.start(store, "offline", settings)
    began = time.monotonic()
    runs.run(run, session=session)
    wall = time.monotonic() - began
    attempts = store.attempts(run.id)
    best = store.best_attempt(run.id)
    final = None
    if best is not None:  # on the session's first device, warm, nothing else running
        target = load_target(name)
        with session.evaluation(target, best.source, EvalSettings(baselines=("eager",))) as ev:
            ev.assemble(), ev.verify(), ev.profile()
        final = ev.result
    seconds_of = bench.evaluation_seconds(attempts)
    walls = [(a.durations or {}).get("wall") for a in attempts]
    after_first = sum(w for w in walls[1:] if w) if len(attempts) > 1 and None not in walls else None
    waits = [(a.durations or {}).get("waited", {}) for a in attempts]
    verdicts = {}
    for a in attempts:
        verdicts[a.verdict] = verdicts.get(a.verdict, 0) + 1
    gpus = sorted({(a.gpu or {}).get("index") for a in attempts if a.gpu}, key=str)
    return {
        "target": name, "run_id": run.id, "attempts": len(attempts), "loop_s": wall,
        "per_minute": len(attempts) / wall * 60 if wall else None, "verdicts": verdicts, "gpus_used": gpus,
        "per_minute_after_first": (len(attempts) - 1) / after_first * 60 if after_first else None,
        "overhead_beyond_compile_s": seconds_of["beyond_compile"], "device_s": seconds_of["device"],
        "compile_s": seconds_of["compile"],
        "planner_acquire_s": median_of([w.get("planner:acquire") for w in waits]),
        "queued_s": median_of([(a.durations or {}).get("queued") for a in attempts]),
        "best_attempt": best.number if best else None, "best_language": best.language if best else None,
        "best_run_us": best.median_us if best else None,
        "best_run_cv": (best.time_us.cv if best.time_us else None) if best else None,
        "final_verdict": final.verdict if final else None,
        "final_reasons": final.reasons[:3] if final else None,
        "final_us": final.median_us if final else None,
        "final_cv": final.time_us.cv if final and final.time_us else None,
        "final_speedup_eager": final.speedup_over("eager") if final else None,
        "final_sol": final.sol_fraction if final else None,
        "pipeline": session_depth(settings, session),
    }


def session_depth(settings: dict, session) -> int:
    return runs.pipeline_depth(settings, "offline", session.planners, len(session.devices))


def phase(store, targets: list[str], seconds: float, evaluator: dict, clock: Clock, label: str,
          session_maker=None, host: HostSampler | None = None) -> dict:
    """Targets run one after another in one evaluator session (started, and warm, before the first)."""
    out = {"label": label, "evaluator": evaluator, "targets": [], "skipped": []}
    if host is not None:
        host.label = label
    per_target = seconds + 25   # the window drains past the budget, then the best is re-timed
    began = time.monotonic()
    session = session_maker() if session_maker else runs.evaluator_session(
        runs.settings_for(targets[0], **evaluator), load_target(targets[0]))
    with session:
        session.start()
        out["start_s"] = time.monotonic() - began
        out["planners"], out["devices"] = session.planners, [d.name for d in session.devices]
        split = getattr(session, "core_split", None)   # sandbox.cores: None where the CPUs are not split
        out["cpus"] = {"trusted": [sorted(d.cpus() or []) for d in session.devices],
                       "jailed": sorted(split.jailed)} if split else None
        for name in targets:
            if clock.left() < per_target:
                out["skipped"].append(name)
                continue
            say(f"[{label}] {name}: {seconds:g} s ...")
            try:
                row = one_target(store, name, seconds, evaluator, session)
            except Exception:
                out.setdefault("errors", {})[name] = traceback.format_exc()[-4000:]
                say(f"[{label}] {name} failed:\n{out['errors'][name]}")
                continue
            say(f"[{label}] {name}: {row['attempts']} attempts in {row['loop_s']:.0f} s = "
                f"{row['per_minute']:.1f}/min ({row['per_minute_after_first'] or 0:.1f} after the first); "
                f"beyond compile {row['overhead_beyond_compile_s']}, "
                f"GPU {row['device_s']} s; best {row['final_us']} us")
            out["targets"].append(row)
    if host is not None:
        out["host"] = host.summary(label)
    return out


def table(report: dict) -> str:
    lines = []
    b = report.get("breakdown")
    if b:
        lines.append(f"evaluator, one candidate at a time (vector_add, n={b['wall_s']['n']}): wall "
                     f"{b['wall_s']['median']:.2f} s, beyond compile {b['overhead_beyond_compile_s']['median']:.2f} s "
                     f"(IQR {b['overhead_beyond_compile_s']['q1']:.2f}-{b['overhead_beyond_compile_s']['q3']:.2f}); "
                     + ", ".join(f"{k} {v['median']:.2f}" for k, v in b["stages_s"].items()
                                 if k in ("plan", "load", "verify", "profile")))
    head = f"{'mode':<12} {'target':<11} {'att':>4} {'/min':>6} {'after1':>6} {'beyond':>7} {'GPU s':>6} " \
           f"{'compile':>7} {'best us':>8} {'cv':>6} {'x eager':>7}"
    lines.append(head)
    for key in ("pipelined", "sequential", "scaling_one_gpu"):
        ph = report.get(key)
        if not ph:
            continue
        for r in ph["targets"]:
            fmt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
            lines.append(f"{key[:12]:<12} {r['target']:<11} {r['attempts']:>4} {fmt(r['per_minute'], '{:.1f}'):>6} "
                         f"{fmt(r.get('per_minute_after_first'), '{:.1f}'):>6} "
                         f"{fmt(r['overhead_beyond_compile_s'], '{:.2f}'):>7} {fmt(r['device_s'], '{:.2f}'):>6} "
                         f"{fmt(r['compile_s'], '{:.2f}'):>7} {fmt(r['final_us'], '{:.1f}'):>8} "
                         f"{fmt(r['final_cv'], '{:.2%}'):>6} {fmt(r['final_speedup_eager'], '{:.2f}'):>7}")
        rates = [r["per_minute"] for r in ph["targets"] if r["per_minute"]]
        if rates:
            lines.append(f"{key[:12]:<12} {'(min/med)':<11} {'':>4} {min(rates):>6.1f} / {statistics.median(rates):.1f}"
                         f"  planners {ph['planners']}, devices {len(ph['devices'])}, started in {ph['start_s']:.0f} s"
                         + (f", trusted CPUs {ph['cpus']['trusted']}" if ph.get("cpus") else ", CPUs not split")
                         + (f", skipped {','.join(ph['skipped'])}" if ph["skipped"] else ""))
        host = ph.get("host") or {}
        if host:
            lines.append(f"{key[:12]:<12} host: " + ", ".join(
                f"{name} {v['median']:g} (p90 {v['p90']:g})" for name, v in host.items())
                + f" [cores busy: share of {os.cpu_count()}]")
    for key, error in report.get("errors", {}).items():
        lines.append(f"ERROR in {key}: {error.strip().splitlines()[-1][:200]}")
    for goal in report.get("goals", []):
        lines.append(f"{'PASS' if goal['passed'] else 'FAIL' if goal['passed'] is False else 'n/a '} {goal['goal']}: "
                     f"{goal['detail']}")
    return "\n".join(lines)


TIMELINE = ("phase", "target", "number", "language", "verdict", "device", "logged_s", "attempt_s", "wall_s",
            "waiting_s", "planner_acquire_s", "planner_build_s", "plan_s", "queued_s", "load_s", "verify_s",
            "profile_s", "sass_s", "time_us", "referee_calls", "referee_s", "executor_calls", "executor_s")


def write_timeline(store, report: dict, path: Path) -> None:
    """Every attempt of the pipelined phases, a row each: when it was logged (seconds into its run: the sum of the
    walls between logged attempts), its stages and the waits that show where a pipeline stalls, and its calls to the
    trusted processes (how many, how long in all: slower calls or more of them)."""
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(TIMELINE)
        for key in ("pipelined", "scaling_one_gpu", "sequential"):
            for t in (report.get(key) or {}).get("targets", []):
                logged = 0.0
                for a in store.attempts(t["run_id"]):
                    d = a.durations or {}
                    waited, calls = d.get("waited") or {}, d.get("calls") or {}
                    logged += d.get("wall") or 0.0
                    out.writerow([key, t["target"], a.number, a.language, a.verdict, d.get("device"),
                                  round(logged, 3), d.get("attempt"), d.get("wall"), d.get("waiting"),
                                  waited.get("planner:acquire"), waited.get("planner:build"), d.get("plan"),
                                  d.get("queued"), d.get("load"), d.get("verify"), d.get("profile"),
                                  waited.get("sass"), a.median_us,
                                  _summed(calls, "referee"), _summed(waited, "referee"),
                                  _summed(calls, "executor"), _summed(waited, "executor")])


def _summed(per_command: dict, process: str) -> float | None:
    """The sum over one process's commands ("referee:check", ...); None when it had none."""
    values = [v for k, v in per_command.items() if k.startswith(f"{process}:")]
    return round(sum(values), 4) if values else None


def goals(report: dict) -> list[dict]:
    found = []
    pipelined = (report.get("pipelined") or {}).get("targets", [])
    if pipelined:
        worst = min(pipelined, key=lambda r: r["per_minute"] or 0)
        found.append({"goal": f">= {GOAL_PER_MINUTE:g} candidates/min per GPU on every small target",
                      "passed": all((r["per_minute"] or 0) / max(1, len(report["pipelined"]["devices"]))
                                    >= GOAL_PER_MINUTE for r in pipelined),
                      "detail": f"lowest {worst['target']} {worst['per_minute']:.1f}/min on "
                                f"{len(report['pipelined']['devices'])} device(s)"})
    b = report.get("breakdown")
    if b:
        m = b["overhead_beyond_compile_s"]["median"]
        found.append({"goal": f"median evaluator overhead beyond compile <= {GOAL_OVERHEAD_S:g} s", "passed":
                      m <= GOAL_OVERHEAD_S, "detail": f"{m:.2f} s one at a time"})
    seq = {r["target"]: r for r in (report.get("sequential") or {}).get("targets", [])}
    same = [(r, seq[r["target"]]) for r in pipelined if r["target"] in seq and r["final_us"] and
            seq[r["target"]]["final_us"]]
    if same:
        found.append({"goal": "same best kernels or better than one at a time (best us, within 2%)",
                      "passed": all(p["final_us"] <= s["final_us"] * 1.02 for p, s in same),
                      "detail": ", ".join(f"{p['target']} {p['final_us']:.1f} vs {s['final_us']:.1f}" for p, s in same)})
        found.append({"goal": "timing CV unchanged (final re-time, pipelined vs one at a time)", "passed": None,
                      "detail": ", ".join(f"{p['target']} {p['final_cv']:.2%} vs {s['final_cv']:.2%}" for p, s in same
                                          if p["final_cv"] is not None and s["final_cv"] is not None)})
    one = report.get("scaling_one_gpu")
    if one and pipelined:
        a = {r["target"]: r["per_minute"] for r in one["targets"]}
        ratios = [r["per_minute"] / a[r["target"]] for r in pipelined if a.get(r["target"])]
        if ratios:
            g = statistics.geometric_mean(ratios)
            found.append({"goal": f"{len(report['pipelined']['devices'])} GPUs >= 1.8x one GPU's candidates/min",
                          "passed": g >= 1.8, "detail": f"geomean ratio {g:.2f}x"})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=500, help="phases that no longer fit are skipped")
    parser.add_argument("--seconds-per-target", type=float, default=30)
    parser.add_argument("--targets", default=",".join(SMALL))
    parser.add_argument("--sequential-targets", default="vector_add,softmax")
    parser.add_argument("--sequential-seconds", type=float, default=25)
    parser.add_argument("--repeats", type=int, default=8, help="evaluations in the breakdown")
    parser.add_argument("--gpus", default=None, help="all or indices (0,1): one device each (default: this GPU)")
    parser.add_argument("--planners", type=int, default=None)
    parser.add_argument("--planners-per-gpu", type=int, default=None,
                        help="planners for each phase: this many times its GPUs (instead of --planners)")
    parser.add_argument("--phases", default=None,
                        help="comma-separated, of breakdown,pipelined,sequential,one-gpu (default: the first three, "
                             "and one-gpu with --gpus)")
    args = parser.parse_args()
    phases = set((args.phases or "breakdown,pipelined,sequential" + (",one-gpu" if args.gpus else "")).split(","))
    unknown = phases - {"breakdown", "pipelined", "sequential", "one-gpu"}
    if unknown or ("one-gpu" in phases and not args.gpus):
        parser.error(f"--phases: unknown {', '.join(sorted(unknown))}" if unknown else "--phases one-gpu needs --gpus")
    clock = Clock(args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    # The run database holds every attempt's PTX and SASS (tens of MB): it is kept aside and copied gzipped.
    db_path = Path(tempfile.mkdtemp(prefix="kloop-throughput-")) / "throughput.db"
    store = open_db(db_path)
    targets = [t for t in args.targets.split(",") if t]
    report = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": gpu_info(), "versions": versions(),
              "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    say(f"GPU: {(report['gpu'] or {}).get('name')}; budget {args.budget_s:.0f} s")

    def save() -> None:
        report["goals"] = goals(report)
        (args.out / "throughput.json").write_text(json.dumps(report, indent=1, default=str))

    def attempt(key: str, work) -> None:
        """One phase; a failure is recorded (with its traceback) and the next phase still runs."""
        try:
            report[key] = work()
        except Exception:
            report.setdefault("errors", {})[key] = traceback.format_exc()[-6000:]
            say(f"{key} failed:\n{report['errors'][key]}")
        save()

    def breakdown() -> dict:
        with Session(spares=4) as session:
            session.start()
            target = load_target("vector_add")
            source = (ROOT / "agent/kernels/vector_add/triton_block.py").read_text()
            found = evaluator_breakdown.measure(session, target, source, args.repeats)
        say(evaluator_breakdown.breakdown_table(found))
        return found

    if "breakdown" in phases and clock.left() > 60:
        attempt("breakdown", breakdown)
    gpus = placement.gpu_list(args.gpus) if args.gpus else None
    per_gpu = args.planners_per_gpu
    evaluator = {"gpus": args.gpus, "planners": per_gpu * len(gpus or [0]) if per_gpu else args.planners}
    evaluator = {k: v for k, v in evaluator.items() if v is not None}
    host = HostSampler().start()
    if "pipelined" in phases:
        attempt("pipelined", lambda: phase(store, targets, args.seconds_per_target, evaluator, clock, "pipelined",
                                           host=host))
    seq_targets = [t for t in args.sequential_targets.split(",") if t]
    if "sequential" in phases and seq_targets and clock.left() > args.sequential_seconds + 35:
        attempt("sequential", lambda: phase(store, seq_targets, args.sequential_seconds,
                                            {"pipeline": 1, "planners": 1}, clock, "sequential",
                                            lambda: Session(spares=2, planners=1), host))
    if "one-gpu" in phases:
        first = gpus[:1]
        one = {k: v for k, v in {**evaluator, "gpus": None, "planners": per_gpu or args.planners}.items()
               if v is not None}
        planners = placement.planners_for(one, 1, load_target(targets[0]))
        attempt("scaling_one_gpu", lambda: phase(store, targets, args.seconds_per_target, one, clock, "one GPU",
                                                 lambda: Session(spares=planners, gpus=first, planners=planners),
                                                 host))
    host.stop(args.out / "host.csv")
    save()
    say("")
    say(table(report))
    write_timeline(store, report, args.out / "timeline.csv")
    store.close()
    with open(db_path, "rb") as raw, gzip.open(args.out / "throughput.db.gz", "wb", compresslevel=6) as packed:
        shutil.copyfileobj(raw, packed)
    say(f"wrote {args.out / 'throughput.json'} and {args.out / 'throughput.db.gz'} "
        f"({(args.out / 'throughput.db.gz').stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
