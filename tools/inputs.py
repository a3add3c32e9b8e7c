"""How a target's inputs are made from a seed: one definition, used by the trusted evaluator and the worker alike,
so both sides create bit-identical inputs without either sending them to the other.

Input families. A kernel must be right on any input a user could pass, not only on the target's own distribution:
`torch.rand` makes ReLU a copy and `relu(log(x))` zero, wide `randn` rows already have mean 0 and variance 1, random
rows never stress a top-k's capacity or a scan's long memory. So each check draws its inputs from a *family*: the
target's own draw (`own`), then mapped, per floating input whose values are a draw (`drawable`: not whole numbers, a
mask, counts or indices), by a transform whose constants come from the seed (so no family is one recognisable
"check" distribution, and both sides make the same bits):

| family | each drawable input becomes |
|---|---|
| own | the target's draw, unchanged |
| signed | its range mapped onto [-a, b], a and b in [0.5, 4] (both signs: ReLU-like ops on `rand` inputs) |
| positive | its range mapped onto [a, b], 0 < a < 0.5 < b (the positive domain of log, sqrt, pow) |
| negative | its range mapped onto [-b, -a] (all-negative rows) |
| large | scaled by 2^k, k in [4, 10] (less where the dtype would overflow) |
| small | scaled by 2^-k, k in [8, 20] |
| sorted / reversed | `signed`, then each row (last dimension) sorted ascending / descending |
| tied | its range mapped onto [-c, c], c in [0.5, 2], then rounded to 8 levels, none 0: many equal values per row (ties in top-k, argmax, sort) |
| near_one | its range mapped onto [1 - 2^-k, 1], k in [6, 10] (gates near one: a scan's long memory) |

The maps keep the order of the values (sorted boundaries stay sorted) and are the same arithmetic on both sides.
"""
from __future__ import annotations

import math
import random
import threading

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# Held by kloop's code in this process while it seeds and draws from torch's one global random state: a suite's lanes
# are threads of one process, and another lane's draws (its reference's dropout, say) landing between our seed and
# our draws would give us other inputs or weights than the executor made from the same seed.
RANDOM_STATE = threading.RLock()
OWN = "own"
FAMILIES = ("signed", "positive", "negative", "large", "small", "sorted", "reversed", "tied", "near_one")
SAMPLE = 1 << 16      # elements looked at to tell a continuous input from whole numbers (a mask, counts, indices)
SORT_LIMIT = 1 << 27  # elements of an input sorted per row at most (a sort's temporaries are 3x its size)
TIE_LEVELS = 8


def make_inputs(module, seed: int, family: str = OWN, device: torch.device = DEVICE) -> list:
    """Inputs for one call of a target module's Model: seeded, created on `device`, in `family` (see above)."""
    if family != OWN and family not in FAMILIES:
        raise ValueError(f"unknown input family {family!r}")
    with RANDOM_STATE, torch.device(device):
        torch.manual_seed(seed)
        inputs = module.get_inputs()
    inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in inputs]
    if family != OWN:
        draw = random.Random(f"{seed}:{family}")   # the transforms' constants: from the seed, never torch's state
        for x in inputs:
            if drawable(x):
                _transform(x, family, draw)
    return inputs


def _transform(x: torch.Tensor, family: str, draw: random.Random) -> None:
    """x mapped in place into `family`."""
    lo, hi = float(x.min()), float(x.max())
    if family in ("large", "small"):
        k = draw.uniform(4, 10) if family == "large" else -draw.uniform(8, 20)
        if family == "large":   # keep clear of the dtype's largest value (float16: 65504)
            room = math.log2(torch.finfo(x.dtype).max) - 4 - math.log2(max(abs(lo), abs(hi), 1e-30))
            k = max(0.0, min(k, room))
        x.mul_(2.0 ** k)
        return
    if family == "positive":
        a = 2.0 ** draw.uniform(-10, -1)
        a, b = a, a + 2.0 ** draw.uniform(-0.5, 3)
    elif family == "negative":
        a = 2.0 ** draw.uniform(-10, -1)
        a, b = -(a + 2.0 ** draw.uniform(-0.5, 3)), -a
    elif family == "near_one":
        a, b = 1.0 - 2.0 ** -draw.uniform(6, 10), 1.0
    elif family == "tied":   # an even count of levels symmetric about 0: none is 0 (a product of ties never 0 * inf)
        b = 2.0 ** draw.uniform(-1, 1)
        a = -b
    else:   # signed, and the row orders built on it
        a, b = -(2.0 ** draw.uniform(-1, 2)), 2.0 ** draw.uniform(-1, 2)
    x.sub_(lo).mul_((b - a) / (hi - lo)).add_(a)
    if family == "tied":
        x.sub_(a).mul_((TIE_LEVELS - 1) / (b - a)).round_().mul_((b - a) / (TIE_LEVELS - 1)).add_(a)
    elif family in ("sorted", "reversed") and x.dim() and x.numel() <= SORT_LIMIT:
        x.copy_(x.sort(dim=-1, descending=family == "reversed", stable=True).values)


def drawable(x) -> bool:
    """A floating-point tensor of more than one element (none standing for several), finite, not all equal, nor all
    whole numbers (masks, counts or indices, not a draw)."""
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1):
        return False
    if any(stride == 0 and size > 1 for size, stride in zip(x.shape, x.stride())):
        return False   # an expanded view: one element stands for many, and in-place maps cannot write it
    lo, hi = x.min(), x.max()
    if not (bool(hi > lo) and bool(torch.isfinite(lo) & torch.isfinite(hi))):
        return False
    # a view, never a copy of a full-size input: its first SAMPLE elements, or (strided) its first row
    sample = x.reshape(-1)[:SAMPLE] if x.is_contiguous() else x[(0,) * (x.dim() - 1)][:SAMPLE]
    return bool((sample != sample.trunc()).any())
