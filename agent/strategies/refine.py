"""refine: iterative refinement, kloop's loop before strategies existed. Each attempt is written from the feedback on
the branch's earlier attempts, building on the run's best (shared across branches)."""
from __future__ import annotations

import random

from agent.strategies import Archive, Parent


class Refine:
    name = "refine"

    def pick(self, archive: Archive, rng: random.Random, branch: int, turn: int) -> Parent:
        best = archive.best
        if best is None:
            return Parent(None, "refine: no verified kernel yet; from this branch's history", show_parent=False)
        return Parent(best, f"refine: the run's best, attempt #{best.number}", show_parent=False)


STRATEGY = Refine()
