"""Search strategies: which earlier attempt the next proposal builds on, and what of the run it sees.

One interface, one small module per strategy:

    strategy.pick(archive, rng, branch, turn) -> Parent(attempt, reason, cell, island, shown, show_best)

- `archive` (Archive) is built from the run's logged attempts only; `rng` is `random.Random` seeded from the run's
  stored seed, the branch and the turn (`rng_for`). So a pick is a deterministic function of the database: a resumed
  run (or one replayed after a crash) makes the same choices, and `kloop show` can explain each one.
- `Parent.attempt` is a logged Attempt (None: start from the target alone); `reason` is logged with the new
  attempt (attempts.parent_reason), `cell` is the parent's MAP-Elites cell, `island` the island it was picked for.
- What the next proposal sees: `shown` (attempts; None = this branch's whole history, as refine) and `show_best`
  (the run's best). Every policy reads the same ProposeContext: model policies get the parent in the prompt
  (agent/prompts/turn.md.j2), the offline policy searches around it first.

| strategy | parent | the proposal sees |
|---|---|---|
| refine (default) | the run's best (today's loop) | the branch's whole history and the best |
| best-of-n | the starting point: nothing until the run has a verified kernel, then its first one | only the parent |
| metr | a verified attempt drawn with p proportional to efficiency^2 (metr.py) | the parent and the run's best |
| evolve | a MAP-Elites elite of the attempt's island (evolve.py) | the parent and up to 2 other elites |
"""
from __future__ import annotations

import importlib
import math
import random
from dataclasses import dataclass, field
from typing import Protocol

from tools.records.store import Attempt
from tools.result import EvalResult

STRATEGIES = ("refine", "best-of-n", "metr", "evolve")


@dataclass
class Parent:
    attempt: Attempt | None              # None: start from the target alone
    reason: str
    cell: str | None = None              # the parent's archive cell (evolve), else None
    island: int | None = None            # the island this attempt belongs to (evolve), else None
    shown: list[Attempt] | None = None   # attempts the proposal sees; None: the branch's whole history (refine)
    show_best: bool = True               # whether the run's best is shown too
    show_parent: bool = True             # refine's parent is just the best, already shown: not repeated

    @property
    def attempt_id(self) -> int | None:
        return self.attempt.id if self.attempt else None


class Strategy(Protocol):
    name: str

    def pick(self, archive: Archive, rng: random.Random, branch: int, turn: int) -> Parent: ...


@dataclass
class Archive:
    """The run's logged attempts, as strategies read them (number order)."""
    attempts: list[Attempt]
    best_id: int | None = None
    islands: int = 2                      # evolve
    migrate_every: int = 4                # evolve
    children: dict[int, int] = field(default_factory=dict, init=False)

    def __post_init__(self):
        for a in self.attempts:
            if a.parent_attempt_id is not None:
                self.children[a.parent_attempt_id] = self.children.get(a.parent_attempt_id, 0) + 1

    @property
    def verified(self) -> list[Attempt]:
        return [a for a in self.attempts if a.verdict == "correct"]

    @property
    def best(self) -> Attempt | None:
        return next((a for a in self.attempts if a.id == self.best_id), None)

    def of_branch(self, branch: int) -> list[Attempt]:
        return [a for a in self.attempts if a.branch == branch]

    def fallback(self, branch: int, name: str) -> Parent:
        """No verified kernel yet: fix the branch's latest attempt, or start from the target alone."""
        mine = self.of_branch(branch)
        if mine:
            return Parent(mine[-1], f"{name}: no verified kernel yet, so from this branch's latest attempt "
                                    f"#{mine[-1].number}", shown=[mine[-1]])
        return Parent(None, f"{name}: no attempt yet, so from the target alone", shown=[])


def efficiency(row: Attempt) -> float:
    """How good a verified kernel is: its speedup over eager when timed, else its speed-of-light fraction x 10 (on
    the same footing as a speedup near 1 for a kernel at 10% SOL), else 1.0 (untimed, as under the CPU interpreter:
    every verified kernel counts the same)."""
    if row.speedup_eager is not None:
        return max(float(row.speedup_eager), 0.0)
    if row.sol_fraction is not None:
        return max(float(row.sol_fraction) * 10, 0.0)
    return 1.0


def fitness_key(row: Attempt) -> tuple:
    """Higher is better; ties go to the earlier attempt (as the loop keeps the first of equals as its best)."""
    return (efficiency(row), -row.number)


def bucket(fraction: float | None, label: str) -> str:
    if fraction is None:
        return f"{label}?"
    q = min(int(max(fraction, 0.0) * 4), 3)
    return f"{label}{q * 25}-{q * 25 + 25}"


def descriptors(language: str, result: EvalResult, source: str) -> dict:
    """The behaviour descriptors of one verified kernel, from what kloop already measures:

    - lang: triton or ptx;
    - bound: memory or compute, from the roofline (GPU only, else '?');
    - sol: the speed-of-light fraction in quarters (GPU only, else 'sol?');
    - occ: theoretical occupancy in quarters; else registers per thread (<=32, <=64, <=128, more); else, with no
      resource counts at all (the CPU interpreter), the warps tunable of an offline-policy kernel;
    - tmpl: the offline policy's template, else 'model' (a model-written kernel).
    """
    from agent.policies.offline import tunable_kind
    from tools.records.store import offline_marker

    roofline = result.roofline
    occupancies = [r.occupancy for r in result.resources if r.occupancy is not None]
    registers = [r.registers for r in result.resources if r.registers is not None]
    marker = offline_marker(source) or {}
    if occupancies:
        occ = bucket(min(occupancies), "occ")
    elif registers:
        regs = max(registers)
        occ = next((f"regs<={n}" for n in (32, 64, 128) if regs <= n), "regs>128")
    else:
        warps = [v for k, v in (marker.get("values") or {}).items() if tunable_kind(k) == "warps"]
        occ = f"warps{warps[0]}" if warps else "occ?"
    template = marker.get("template") or "model"
    if marker.get("ptx_edit"):
        template += f"+{marker['ptx_edit']}"
    return {"lang": language or result.language or "?", "bound": (roofline.bound if roofline else None) or "?",
            "sol": bucket(roofline.sol_fraction if roofline else None, "sol"), "occ": occ, "tmpl": template}


def cell_of(row: Attempt) -> str | None:
    """The MAP-Elites cell of a logged attempt ('|'-joined descriptors); None for one that was not verified."""
    if row.verdict != "correct":
        return None
    return cell_of_result(row.language or "", row.result, row.source or "")


def cell_of_result(language: str, result: EvalResult, source: str) -> str | None:
    if result.verdict != "correct":
        return None
    return "|".join(descriptors(language, result, source).values())


def rng_for(seed: int, branch: int, turn: int) -> random.Random:
    """The pick's random stream: fixed by the run's stored seed, the branch and the turn, so a resumed or redone
    attempt draws the same numbers."""
    return random.Random(f"kloop-strategy:{seed}:{branch}:{turn}")


def make_strategy(name: str) -> Strategy:
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r} (one of {', '.join(STRATEGIES)})")
    module = importlib.import_module(f"agent.strategies.{name.replace('-', '_')}")
    return module.STRATEGY


def choose(store, run_id: str, settings, branch: int, turn: int) -> Parent:
    """The loop's entry point: the parent of the next attempt of `branch` under settings.strategy."""
    archive = Archive(store.history(run_id), store.progress(run_id)["best_id"],
                      islands=max(1, getattr(settings, "islands", 2)),
                      migrate_every=max(1, getattr(settings, "migrate_every", 4)))
    strategy = make_strategy(getattr(settings, "strategy", "refine") or "refine")
    return strategy.pick(archive, rng_for(getattr(settings, "strategy_seed", 0) or 0, branch, turn), branch, turn)


def weights(rows: list[Attempt], power: float = 2.0) -> list[float]:
    """Sampling weights proportional to efficiency**power (metr), normalized."""
    raw = [efficiency(r) ** power for r in rows]
    total = sum(raw)
    if not total or not math.isfinite(total):
        return [1 / len(rows)] * len(rows)
    return [w / total for w in raw]
