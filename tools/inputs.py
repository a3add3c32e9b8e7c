"""How a target's inputs are made from a seed: one definition, used by the trusted evaluator and the worker alike,
so both sides create bit-identical inputs without either sending them to the other."""
from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_inputs(module, seed: int) -> list:
    """Inputs for one call of a target module's Model: seeded, created on the device."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        inputs = module.get_inputs()
    return [x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs]


def round_seed(seed: int, round_index: int) -> int:
    """The input seed of one timing round; the trusted side derives the same to check the rounds it kept."""
    return (seed * 1_000_003 + round_index) % (1 << 62)
