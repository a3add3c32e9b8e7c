"""Weights that exercise the op: a module's floating parameters and buffers drawn at random near their own scale, the
same draw for the reference and the candidate.

Parameters left at their default initialisation hide part of the op: nn.LayerNorm starts its weight at ones and its
bias at zeros (KernelBench's layer norms keep them), so a kernel that ignores both matches the reference. A weights
trial perturbs, for the reference (the referee, trusted) and the candidate (the jailed planner) alike:

- every floating parameter or buffer whose elements are all equal (ones, zeros, a constant fill): always, on the
  reference side; a candidate that holds no tensor equal to it cannot follow, and fails;
- every other floating one the planner says the candidate holds as it is (same shape, dtype and values).

Each entry's draw depends only on (seed, the reference's name for it), on the CPU, so both sides get the same bits.
Positive entries (a running variance, a LayerNorm weight of ones) are scaled by 2^u, u uniform in [-1, 1], so they
stay positive; others move by u x max(mean |p|, MIN_SCALE). Integer and boolean buffers stay as they are.

    matched = perturb_candidate(candidate_model, reference_model, seed)   # planner: what it could follow
    perturb_reference(reference_model, seed, matched)                      # referee
"""
from __future__ import annotations

import hashlib

import torch

MIN_SCALE = 0.1   # additive draws of entries that are all zero move this far, at most


def _entries(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's floating parameters and buffers by name (non-persistent buffers too)."""
    found = dict(model.named_parameters())
    found.update(model.named_buffers())
    return {name: t for name, t in found.items() if isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.numel()}


def _constant(t: torch.Tensor) -> bool:
    flat = t.detach().reshape(-1)
    return bool((flat == flat[0]).all())


def drawn(name: str, t: torch.Tensor, seed: int) -> torch.Tensor:
    """New values for the entry `name` (its shape, dtype and device), from (seed, name) alone."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    u = torch.rand(t.shape, generator=generator, dtype=torch.float64).mul_(2).sub_(1)
    p = t.detach().to("cpu", torch.float64)
    if bool((p > 0).all()):
        new = p * torch.exp2(u)
    else:
        new = p + u * max(float(p.abs().mean()), MIN_SCALE)
    return new.to(device=t.device, dtype=t.dtype)


def perturb_reference(model: torch.nn.Module, seed: int, matched: list[str] | None = None) -> list[str]:
    """Draw the reference's constant entries and those named in `matched` (what the candidate holds as it is), in
    place; the names drawn."""
    wanted = set(matched or [])
    names = []
    with torch.no_grad():
        for name, t in _entries(model).items():
            if name in wanted or _constant(t):
                t.copy_(drawn(name, t, seed))
                names.append(name)
    return names


def perturb_candidate(candidate: torch.nn.Module, reference: torch.nn.Module, seed: int) -> list[str]:
    """Draw the candidate's tensors that equal a reference entry (same shape, dtype and values; the same name
    first) as that entry is drawn, in place; the reference names matched. Plain tensor attributes of the
    candidate's modules count too (a weight kept as `self.w = ...`)."""
    ours = _entries(candidate)
    for prefix, module in candidate.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
                ours.setdefault(f"{prefix}.{attr}" if prefix else attr, value)
    free = dict(ours)
    matched = []
    with torch.no_grad():
        for name, ref in _entries(reference).items():
            same = [n for n, t in free.items() if t.shape == ref.shape and t.dtype == ref.dtype
                    and t.device.type == ref.device.type and torch.equal(t.detach(), ref.detach())]
            if not same:
                continue
            mine = name if name in same else same[0]
            free.pop(mine).copy_(drawn(name, ref, seed))
            matched.append(name)
    return matched
