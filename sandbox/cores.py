"""CPU affinity: each GPU's trusted processes on physical cores of their own, candidates' processes on the rest.

While a GPU times a kernel its own planners are stopped (sandbox/pool.py: quiet), but another GPU's run on, and so
do their compilers (Triton, ptxas). The split keeps that work off the cores of a referee timing eager's launches
(the launch cover hides only what the host launches within its 0.5 ms). On a GPU node each GPU's executor and
referee get TRUSTED_CORES_PER_GPU whole physical cores (SMT siblings included), chosen by the GPU's NVML index from
the end of the CPU list, and jailed processes get every other CPU. The choice depends only on the node (its CPUs and
GPUs), so every kloop session on a node makes the same split and two sessions' trusted processes never share cores.
KLOOP_PIN_CPUS=0 turns it off.

It is placement, not a boundary: affinity is a process's own to change, and a jailed candidate may call
sched_setaffinity onto every CPU of the node (tried: nothing in the jail stops it). Nor is it a speed-up: on an H100
pair a device's time per candidate was within 3-5% with and without it (results/throughput-h100x2/cpu-split-ab/).
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

TRUSTED_CORES_PER_GPU = 2   # physical cores: the executor's and the referee's
MIN_JAILED_SHARE = 0.5      # of the physical cores, at least, stay with the jailed processes
SYSFS = Path("/sys/devices/system/cpu")


def physical_cores(cpus: set[int] | None = None, sysfs: Path = SYSFS) -> list[list[int]]:
    """The CPUs (this process's, by default) grouped by physical core, SMT siblings together, ordered by their
    lowest CPU."""
    cpus = set(os.sched_getaffinity(0)) if cpus is None else cpus
    groups: dict[str, list[int]] = {}
    for cpu in sorted(cpus):
        try:
            key = (sysfs / f"cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            key = f"cpu{cpu}"   # no topology (some containers): each CPU its own core
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values())


@dataclass(frozen=True)
class CoreSplit:
    trusted: tuple[frozenset[int], ...]   # per NVML GPU index
    jailed: frozenset[int]

    def for_gpu(self, index: int | None) -> frozenset[int] | None:
        return self.trusted[index] if index is not None and 0 <= index < len(self.trusted) else None


def split(gpus: int, cores: list[list[int]] | None = None) -> CoreSplit | None:
    """The node's split for `gpus` GPUs: GPU i gets the i-th group of cores from the end. Fewer cores per GPU where
    the jailed processes would keep less than MIN_JAILED_SHARE of the cores; None where not even one each fits."""
    cores = physical_cores() if cores is None else cores
    per = TRUSTED_CORES_PER_GPU
    while per and gpus * per > len(cores) * (1 - MIN_JAILED_SHARE):
        per -= 1
    if not per or gpus < 1:
        return None
    trusted = tuple(frozenset(cpu for core in cores[len(cores) - (i + 1) * per:len(cores) - i * per] for cpu in core)
                    for i in range(gpus))
    jailed = frozenset(cpu for core in cores[:len(cores) - gpus * per] for cpu in core)
    return CoreSplit(trusted, jailed)


def enabled() -> bool:
    return os.environ.get("KLOOP_PIN_CPUS", "1") != "0" and shutil.which("taskset") is not None


def command(cpus: frozenset[int] | None) -> list[str]:
    """The argv prefix that starts a program on `cpus` (util-linux taskset; its children inherit them), or []."""
    if not cpus:
        return []
    return [shutil.which("taskset") or "taskset", "--cpu-list", ",".join(map(str, sorted(cpus)))]
