"""Where candidates are evaluated: which GPUs, how many planners, how many warm spares, and the evaluator session
made of them from a run's settings (gpus, ray, planners, branches, compile_mode; agent.run.DEFAULT_SETTINGS).

    gpus = gpu_list("0,1")                          # CUDA_VISIBLE_DEVICES entries, checked (PlacementError)
    session = local_session(settings, target)       # a sandbox.evaluate.Session over them
    session = ray_session(settings)                 # or a sandbox.ray_backend.RaySession over a Ray cluster

Both sessions are sandbox.seam.EvaluatorSessions. Nothing here starts a process: the sessions start theirs when
asked (`start`) or when the first candidate comes.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.evaluate import Session
    from sandbox.ray_backend import RaySession


class PlacementError(ValueError):
    """Settings this machine cannot place (a GPU that is not there, GPUs of different kinds, no Ray): one line."""


def has_gpu() -> bool:
    from tools.inputs import DEVICE

    return DEVICE.type == "cuda"


def gpu_list(spec: str | None) -> list[str] | None:
    """--gpus: "all" or indices ("0,1") of the GPUs this process sees, as CUDA_VISIBLE_DEVICES entries (one device
    each); None: this process's own device. PlacementError for a GPU that is not there, or GPUs of different kinds
    (a plan compiled for one must run on the others)."""
    chosen = gpu_indices(spec)
    return None if chosen is None else visible_entries(chosen)


def visible_entries(indices: list[int]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of GPUs given as indices of those this process sees."""
    visible = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return [visible[g] if g < len(visible) else str(g) for g in indices]


def gpu_indices(spec: str | None) -> list[int] | None:
    """--gpus as indices of the GPUs this process sees (gpu_list's checks); None: this process's own device."""
    if spec is None:
        return None
    import torch

    chosen = parse_gpus(spec)
    kinds = {(torch.cuda.get_device_properties(g).name, torch.cuda.get_device_capability(g)) for g in chosen}
    if len(kinds) > 1:
        raise PlacementError(f"--gpus {spec}: the GPUs differ ({', '.join(sorted(k[0] for k in kinds))}); give GPUs "
                             "of one kind (a kernel compiled for one runs on the others)")
    return chosen


def parse_gpus(spec: str) -> list[int]:
    """--gpus ("all" or "0,1") as indices of GPUs this process sees, each at most once; PlacementError otherwise."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise PlacementError("--gpus needs a CUDA GPU and there is none here (leave it out to evaluate on the CPU)")
    if spec.strip() == "all":
        return list(range(count))
    try:
        chosen = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise PlacementError(f"--gpus {spec}: give all or GPU indices such as 0,1") from None
    if not chosen or any(not 0 <= g < count for g in chosen) or len(set(chosen)) != len(chosen):
        raise PlacementError(f"--gpus {spec}: this machine has GPUs 0 to {count - 1}; give each at most once")
    return chosen


def spares(settings: dict) -> int:
    """Planners kept started ahead (each takes seconds: torch, CUDA, Triton) so a candidate rarely waits; a CPU
    machine has few cores to share."""
    return min(2 * settings["branches"], 8) if has_gpu() else 1


def planners_for(settings: dict, devices: int, target=None) -> int:
    """Candidates planned at once: settings["planners"], else the CPU cores left beside each device's two trusted
    processes and this one, at most what a PLANNER_MEMORY_SHARE of the memory they keep the target's inputs in
    holds (the host's; the GPUs' where planners have a device). A CPU-only machine: one (its device stage needs a
    core too)."""
    if settings.get("planners"):
        return int(settings["planners"])
    if not has_gpu():
        return 1
    from sandbox.pipeline import PLANNER_GPU_BYTES, planner_bytes, planners_memory
    from sandbox.pool import deviceless_default

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    by_cores = max(1, min(16 * devices, cores - 2 * devices - 1))
    per_planner = planner_bytes(target) if target is not None else PLANNER_GPU_BYTES
    return max(1, min(by_cores, planners_memory(devices, deviceless_default()) // per_planner))


def _eval_settings(settings: dict):
    from sandbox.evaluate import COMPILE_MODES, EvalSettings

    return EvalSettings(compile_mode=settings.get("compile_mode") or COMPILE_MODES[0])


def local_session(settings: dict, target=None) -> Session:
    """A sandbox.evaluate.Session on this node: one device per GPU of settings["gpus"] (this process's own GPU, or
    the CPU, when None), planners_for(...) parallel planners and enough spares to keep them fed."""
    from sandbox.evaluate import Session

    gpus = gpu_list(settings.get("gpus"))
    devices = len(gpus) if gpus else 1
    planners = planners_for(settings, devices, target)
    return Session(spares=max(spares(settings), planners + (0 if has_gpu() else 1)),
                   settings=_eval_settings(settings), gpus=gpus, planners=planners)


def ray_session(settings: dict) -> RaySession:
    """A sandbox.ray_backend.RaySession over the Ray cluster at settings["ray"] ("auto" or an address)."""
    try:
        from sandbox.ray_backend import RaySession
    except ImportError as e:
        raise PlacementError(f"--ray needs the ray extra ({e.name} is missing): pip install -e '.[ray]'") from None
    return RaySession(settings["ray"], settings=_eval_settings(settings), planners=settings.get("planners"))
