"""best-of-n: N independent attempts from the same starting point, the best one selected (the run's best).

The starting point is the target alone until the run has a verified kernel, then the run's first verified kernel
(the offline policy's starter, or a model's first working kernel). An attempt never sees its siblings' results, so
attempts are independent samples; the run's best is still kept, re-timed and reported as with every strategy."""
from __future__ import annotations

import random

from agent.strategies import Archive, Parent


class BestOfN:
    name = "best-of-n"

    def pick(self, archive: Archive, rng: random.Random, branch: int, turn: int) -> Parent:
        verified = archive.verified
        if not verified:
            return Parent(None, "best-of-n: an independent sample from the target alone", shown=[], show_best=False)
        start = verified[0]
        return Parent(start, f"best-of-n: an independent sample from the starting point, attempt #{start.number}",
                      shown=[start], show_best=False)


STRATEGY = BestOfN()
