"""Re-verify and re-time a run's logged attempts on this machine, as a new run linked to the old one.

The logged target source (not whatever the target file says today) is what gets evaluated, so a re-verification
checks the same problem the run solved. The new run has parent_run_id = the old run, parent_kind 'reverify', and keeps the old
attempt numbers, so old and new attempts pair up by number. The database read is opened read-only: the new run goes
into `out_db` (which may be the same file only when the caller says so: kloop reverify --in-place).

    >>> outcome = reverify("a1b2c3d4", "runs/bench-h200-part1.db", "best", out_db="runs/kloop.db")
    >>> outcome.disagreements
    [(7, 'time 12.1 us -> 15.9 us (+31%)')]
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tools.records.store import Attempt, Store, StoreError, attempt_columns, gpu_columns, now, open_db

WHICH = ("best", "correct", "all")
TIME_REL_TOLERANCE = 0.10   # timings closer than this are the same ...
TIME_IQR_FACTOR = 3.0       # ... as are timings within 3x their combined spread (noisy, short kernels)
NOT_TIMED = "not timed (no GPU)"


class ReverifyError(Exception):
    """The re-verification cannot be done as asked: one line for the user."""


@dataclass
class ReverifiedAttempt:
    number: int
    old: Attempt                                # the logged attempt
    new: Attempt                                # the new attempt, as stored in the new run
    disagreements: list[str] = field(default_factory=list)


@dataclass
class ReverifyOutcome:
    run_id: str
    new_run_id: str
    rows: list[ReverifiedAttempt]
    old_gpu: str | None
    new_gpu: str | None
    out_db: Path | None = None                  # where the new run was written

    @property
    def disagreements(self) -> list[tuple[int, str]]:
        return [(row.number, d) for row in self.rows for d in row.disagreements]


def select_attempts(store: Store, run: dict, which: str) -> list[Attempt]:
    attempts = store.attempts(run["id"])
    if which == "all":
        return attempts
    if which == "correct":
        return [a for a in attempts if a.verdict == "correct"]
    best_id = run.get("best_attempt_id")
    return [a for a in attempts if a.id == best_id]


def compare(old: Attempt, new: Attempt, same_gpu: bool = True) -> list[str]:
    """Why the new measurement disagrees with the logged one (empty: it agrees). Times are compared only when both
    were taken on the same GPU model: an H200 is faster than an H100, and that is no disagreement."""
    found = []
    if old.verdict != new.verdict:
        found.append(f"verdict {old.verdict} -> {new.verdict} (checks v{old.result.checks} -> "
                     f"v{new.result.checks}: {_first_reason(new)})")
    if same_gpu and old.timed and new.timed:
        a, b = old.median_us, new.median_us
        spread = TIME_IQR_FACTOR * ((old.time_us.iqr or 0.0) + (new.time_us.iqr or 0.0))
        if abs(b - a) > max(TIME_REL_TOLERANCE * a, spread):
            found.append(f"time {a:.3g} us -> {b:.3g} us ({100 * (b - a) / a:+.0f}%)")
    return found


def _first_reason(attempt: Attempt) -> str:
    reasons = attempt.reasons or []
    if not reasons:
        return "passes every check" if attempt.verdict == "correct" else "no reason given"
    return reasons[0][:300]


def _target_from_source(run: dict, directory: Path):
    """Load the run's logged target source as a module file (the worker imports targets by path)."""
    from tools.target import TargetError, load_target

    if not run.get("target_source"):
        raise ReverifyError(f"run {run['id']} has no stored target source to re-verify against")
    path = directory / f"{run.get('target_name') or 'target'}.py"
    path.write_text(run["target_source"])
    try:
        return load_target(str(path))
    except TargetError as e:
        raise ReverifyError(str(e)) from None


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def reverify(run_id: str, db_path: str | os.PathLike, which: str = "best", settings=None,
             on_attempt: Callable[[ReverifiedAttempt], None] = lambda row: None,
             out_db: str | os.PathLike | None = None) -> ReverifyOutcome:
    """Evaluate the chosen attempts again (fresh secret seed unless `settings` says otherwise) and store them as a
    new run in `out_db` (None: in db_path itself). db_path is only read unless it is out_db."""
    from agent.run import gpu_facts
    from sandbox.evaluate import EvalSettings, Session

    settings = settings or EvalSettings()   # one secret seed for the whole re-verification
    if which not in WHICH:
        raise ReverifyError(f"unknown --attempts {which!r} (one of {', '.join(WHICH)})")
    in_place = out_db is None or same_file(out_db, db_path)
    try:
        source = open_db(db_path, create=False, readonly=not in_place)
        run = source.get_run(run_id)
    except StoreError as e:
        raise ReverifyError(str(e)) from None
    try:
        if in_place:
            store = source
        else:
            try:
                store = open_db(out_db)
            except StoreError as e:
                raise ReverifyError(str(e)) from None
    except BaseException:
        source.close()
        raise
    try:
        gpu = gpu_facts()   # this machine's, written when the new run is made (as agent.run does for a loop run)
        chosen = select_attempts(source, run, which)
        if not chosen:
            raise ReverifyError(f"run {run_id} has no {'' if which == 'all' else which + ' '}attempt to re-verify")
        with tempfile.TemporaryDirectory(prefix="kloop-reverify-") as tmp, Session(spares=1, settings=settings) as session:
            target = _target_from_source(run, Path(tmp))
            new_run_id = store.create_run(
                target_name=run.get("target_name"), target_source=run["target_source"],
                target_sha256=target.sha256, policy=run.get("policy"), model=run.get("model"),
                settings={**(run.get("settings") or {}), "replay_attempts": which,
                          **({} if in_place else {"replay_of_db": str(Path(db_path).resolve())})},
                parent_run_id=run_id, parent_kind="reverify", notes=f"re-verification of run {run_id}",
                isolation=session.isolation, **gpu_columns(gpu))
            rows = []
            try:
                for old in chosen:
                    with session.evaluation(target, old.source or "") as ev:
                        ev.assemble(), ev.verify(), ev.profile()
                    new = store.get_attempt(store.add_attempt(
                        new_run_id, number=old.number, branch=old.branch, turn=old.turn, source=old.source,
                        reasoning=old.reasoning, **attempt_columns(ev.result)))
                    row = ReverifiedAttempt(old.number, old, new,
                                            compare(old, new, same_gpu=run.get("gpu_name") == (gpu or {}).get("name")))
                    rows.append(row)
                    on_attempt(row)
            except BaseException as e:
                store.update_run(new_run_id, status="stopped" if isinstance(e, KeyboardInterrupt) else "failed",
                                 notes=f"reverify of {run_id} interrupted: {type(e).__name__}: {e}")
                raise
        # The re-verified run's best is the old best's counterpart, if it still holds up.
        old_best = source.best_attempt(run_id)
        best = next((a for a in store.attempts(new_run_id) if old_best and a.number == old_best.number
                     and a.verdict == "correct"), None)
        first = rows[0].new.result
        store.update_run(new_run_id, status="finished", finished_at=now(), best_attempt_id=best.id if best else None,
                         versions=first.versions, numeric_flags=first.numeric_flags,
                         baselines={k: v.__dict__ for k, v in first.baselines.items()} if first.baselines else None)
    finally:
        store.close()
        if not in_place:
            source.close()
    return ReverifyOutcome(run_id, new_run_id, rows, run.get("gpu_name"), (gpu or {}).get("name"), store.path)


# -- display ---------------------------------------------------------------------------------------------------------

def _pair(old: str, new: str) -> str:
    return old if old == new else f"{old} → {new}"


def _number(value: float | None, unit: str = "") -> str:
    return "–" if value is None else f"{value:.3g}{unit}"


def comparison_table(outcome: ReverifyOutcome):
    """Old and new side by side ("logged → now") for verdict, time and speedups; disagreements in red."""
    from rich.table import Table

    timed_here = outcome.new_gpu is not None
    other_gpu = timed_here and outcome.old_gpu is not None and outcome.old_gpu != outcome.new_gpu
    table = Table(title=f"run {outcome.run_id} ({outcome.old_gpu or 'no GPU'}) re-verified as "
                        f"{outcome.new_run_id} ({outcome.new_gpu or 'no GPU'}): logged → now"
                        + ("; another GPU model: times are shown, not compared" if other_gpu else ""))
    for header in ("#", "verdict", "time (us)", "x eager", "x compile", "disagreement"):
        table.add_column(header, justify="right" if header == "#" else "left")
    for row in outcome.rows:
        old, new = row.old, row.new
        cells = []
        for logged, now_, unit in ((old.median_us, new.median_us, ""), (old.speedup_eager, new.speedup_eager, "x"),
                                   (old.speedup_compile, new.speedup_compile, "x")):
            cells.append(f"{_number(logged, unit)} → {_number(now_, unit) if timed_here else NOT_TIMED}")
        table.add_row(str(row.number), _pair(old.verdict or "–", new.verdict or "–"), *cells,
                      "; ".join(row.disagreements) or "agrees", style="red" if row.disagreements else None)
    return table
