"""How a target's inputs are made from a seed: one definition, used by the trusted evaluator and the worker alike,
so both sides create bit-identical inputs without either sending them to the other."""
from __future__ import annotations

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SPREAD = (-4.0, 4.0)  # where make_inputs(spread=True) maps inputs drawn from [0, 1); exact in binary floating point


def make_inputs(module, seed: int, spread: bool = False) -> list:
    """Inputs for one call of a target module's Model: seeded, created on the device.

    spread: every floating-point input that looks drawn from [0, 1) (`torch.rand`, as many KernelBench problems
    draw theirs) is mapped to [-4, 4) by x -> 8x - 4. On [0, 1) ReLU, ELU, LeakyReLU and their kind are the identity,
    and HardTanh is on [-1, 1) (HardSigmoid is linear on [-3, 3)), so a plain copy or a linear map would pass every
    trial; a kernel must compute the op on any valid input."""
    torch.manual_seed(seed)
    with torch.device(DEVICE):
        inputs = module.get_inputs()
    inputs = [x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs]
    if spread:
        for x in inputs:
            if unit_uniform(x):
                x.mul_(SPREAD[1] - SPREAD[0]).add_(SPREAD[0])
    return inputs


def unit_uniform(x) -> bool:
    """A floating-point tensor of more than one element whose values all lie in [0, 1) (so not a 0/1 mask)."""
    return (isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 1
            and bool(x.min() >= 0) and bool(x.max() < 1))


def round_seed(seed: int, round_index: int) -> int:
    """The input seed of one timing round; the trusted side derives the same to check the rounds it kept."""
    return (seed * 1_000_003 + round_index) % (1 << 62)
