"""sandbox.cores: each GPU's trusted processes on physical cores of their own, the jailed processes on the rest."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import cores


def fake_sysfs(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, listed in siblings.items():
        (root / f"cpu{cpu}/topology").mkdir(parents=True)
        (root / f"cpu{cpu}/topology/thread_siblings_list").write_text(listed + "\n")
    return root


def test_cpus_are_grouped_by_physical_core_with_their_smt_siblings(tmp_path):
    sysfs = fake_sysfs(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    assert cores.physical_cores(set(range(8)), sysfs) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # Only this process's CPUs count; a CPU without topology is a core of its own.
    assert cores.physical_cores({1, 5, 9}, sysfs) == [[1, 5], [9]]


def test_each_gpu_gets_two_whole_cores_from_the_end_and_the_jailed_processes_the_rest():
    sixteen = [[c, c + 16] for c in range(16)]
    found = cores.split(2, sixteen)
    assert found.trusted[0] == {15, 31, 14, 30} and found.trusted[1] == {13, 29, 12, 28}
    assert found.jailed == frozenset(range(0, 12)) | frozenset(range(16, 28))
    assert not found.trusted[0] & found.jailed and not found.trusted[1] & found.jailed
    assert found.for_gpu(1) == found.trusted[1] and found.for_gpu(2) is None and found.for_gpu(None) is None


def test_few_cores_give_each_gpu_one_core_or_no_split_at_all():
    eight = [[c] for c in range(8)]
    assert [len(t) for t in cores.split(4, eight).trusted] == [1, 1, 1, 1]   # 4 of 8 cores stay jailed
    assert len(cores.split(4, eight).jailed) == 4
    assert cores.split(5, eight) is None   # the jailed processes would keep fewer than half
    assert cores.split(1, [[0]]) is None


def test_the_split_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("KLOOP_PIN_CPUS", "0")
    assert not cores.enabled()
    monkeypatch.setenv("KLOOP_PIN_CPUS", "1")
    assert cores.enabled()
    assert cores.command(None) == [] and cores.command(frozenset()) == []


def test_a_program_started_with_the_prefix_runs_on_those_cpus_and_so_do_its_children():
    cpu = max(os.sched_getaffinity(0))
    code = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); sys.stdout.flush(); " \
           "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    out = subprocess.run([*cores.command(frozenset({cpu})), sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [f"[{cpu}]", f"[{cpu}]"]


def test_jailed_processes_of_a_pool_with_cpus_run_on_those_cpus_only():
    from sandbox.pool import WarmPool
    from sandbox.process import descendants

    cpu = max(os.sched_getaffinity(0))
    pool = WarmPool(spares=0, cpus=frozenset({cpu}))
    try:
        child = pool.acquire("planner")
        time.sleep(0.1)
        tree = [child.proc.pid, *descendants(child.proc.pid)]
        assert len(tree) >= 2   # the jail and the interpreter inside it
        assert all(os.sched_getaffinity(pid) == {cpu} for pid in tree)
        child.close()
    finally:
        pool.close()


@pytest.mark.gpu
def test_a_gpu_session_runs_its_trusted_processes_and_its_planners_on_separate_cores():
    from sandbox.evaluate import Session
    from sandbox.process import descendants

    with Session(spares=1) as session:
        if session.core_split is None:
            pytest.skip("this node has too few cores to split (or no taskset)")
        device = session.devices[0]
        executor, referee = device.executor(), device.referee()
        trusted = device.cpus()
        assert trusted and not trusted & session.core_split.jailed
        for child in (executor, referee):
            assert os.sched_getaffinity(child.proc.pid) == trusted
        planner = session.pool.acquire("planner")
        try:
            assert all(os.sched_getaffinity(pid) == session.core_split.jailed
                       for pid in [planner.proc.pid, *descendants(planner.proc.pid)])
        finally:
            planner.close()
