"""metr: each new attempt builds on an earlier verified kernel sampled by its efficiency (METR's KernelBench
study; Kernel-Coder's test-time comparison).

Weighting: P(parent = k) = e_k**2 / sum_j e_j**2 over the run's verified attempts, where e is
agent.strategies.efficiency (speedup over eager when timed; SOL fraction x 10; else 1). Squaring is a softmax over
log-speedup at temperature 1/2: a 2x kernel is drawn 4 times as often as a 1x one, yet no verified kernel is ever
out of reach. Untimed runs (the CPU interpreter) draw uniformly. Before any kernel is verified, the branch's
latest attempt is the parent (to fix it). The proposal sees the parent and the run's best."""
from __future__ import annotations

import random

from agent.strategies import Archive, Parent, efficiency, weights

POWER = 2.0


class Metr:
    name = "metr"

    def pick(self, archive: Archive, rng: random.Random, branch: int, turn: int) -> Parent:
        verified = archive.verified
        if not verified:
            return archive.fallback(branch, self.name)
        p = weights(verified, POWER)
        chosen = rng.choices(range(len(verified)), weights=p, k=1)[0]
        parent = verified[chosen]
        return Parent(parent, f"metr: sampled attempt #{parent.number} (efficiency {efficiency(parent):.3g}, "
                              f"p={p[chosen]:.2f} of {len(verified)} verified)", shown=[parent])


STRATEGY = Metr()
