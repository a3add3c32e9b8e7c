"""How a target's inputs are made from a seed: one definition, used by the trusted evaluator and the worker alike,
so both sides create bit-identical inputs without either sending them to the other."""
from __future__ import annotations

import math
import threading

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# Held by kloop's code in this process while it seeds and draws from torch's one global random state: a suite's lanes
# are threads of one process, and another lane's draws (its reference's dropout, say) landing between our seed and
# our draws would give us other inputs or weights than the executor made from the same seed.
RANDOM_STATE = threading.RLock()
SPREAD = (-4.0, 4.0)  # where make_inputs(spread=True) maps inputs whose values all have one sign
SAMPLE = 1 << 16      # elements looked at to tell a continuous input from whole numbers (a mask, counts, indices)


def make_inputs(module, seed: int, spread: bool = False) -> list:
    """Inputs for one call of a target module's Model: seeded, created on the device.

    spread: every floating-point input drawn from a one-signed distribution (`torch.rand`, as many KernelBench
    problems draw theirs, `rand * c`, `randn().abs()`, `rand() - 1`: see `spreadable`) is mapped onto [-4, 4] by
    x -> (x - min) * 2^k - 4, the power of two 2^k at most 8 / (max - min). On non-negative inputs ReLU, ELU,
    LeakyReLU, abs and their kind are the identity (on non-positive ones ReLU is 0), and HardTanh is on [-1, 1)
    (HardSigmoid is linear on [-3, 3)), so a copy, a constant or a linear map would pass every trial; a kernel must
    compute the op on any valid input. The map keeps the order of
    the values (sorted boundaries stay sorted) and is the same arithmetic on both sides, so both get the same bits."""
    with RANDOM_STATE, torch.device(DEVICE):
        torch.manual_seed(seed)
        inputs = module.get_inputs()
    inputs = [x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs]
    if spread:
        for x in inputs:
            if spreadable(x):
                lo, hi = x.min(), x.max()
                scale = 2.0 ** math.floor(math.log2((SPREAD[1] - SPREAD[0]) / (hi - lo).item()))
                x.sub_(lo).mul_(scale).add_(SPREAD[0])
    return inputs


def spreadable(x) -> bool:
    """A floating-point tensor of more than one element, finite, whose values all have one sign (none below 0, or
    none above) and are not all equal, nor all whole numbers (masks, counts or indices, not a draw)."""
    if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1):
        return False
    lo, hi = x.min(), x.max()
    if not ((bool(lo >= 0) or bool(hi <= 0)) and bool(hi > lo) and bool(torch.isfinite(lo) & torch.isfinite(hi))):
        return False
    # a view, never a copy of a full-size input: its first SAMPLE elements, or (strided) its first row
    sample = x.reshape(-1)[:SAMPLE] if x.is_contiguous() else x[(0,) * (x.dim() - 1)][:SAMPLE]
    return bool((sample != sample.trunc()).any())

