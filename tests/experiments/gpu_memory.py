"""GPU memory per process while a command runs (not a test): which of kloop's processes holds what, at the peak.

    python tests/experiments/gpu_memory.py --out mem.json -- python3 -m agent.cli suite ... 

NVML's per-process usage is sampled every 50 ms; each process is named by its role from its command line
(referee, executor, warm = a planner or a spare, inductor = a starter generation, the kloop process itself).
The command's output is printed with seconds since its start; so is every change of 0.5 GiB or more in what a role
holds (lines starting with `mem`). Prints, last: the peak of the sum over all processes, and what each role held at
that moment. mem.json holds the same and every role's own peak. The command's exit status is this script's.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time

ROLES = (("sandbox.referee", "referee"), ("sandbox.executor", "executor"), ("sandbox.warm", "warm"),
         ("agent.kernels.inductor", "inductor"), ("compile_worker", "compile-worker"), ("agent.cli", "kloop"))


def role_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    return next((role for needle, role in ROLES if needle in args), "other")


class Poller:
    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        self.roles: dict[int, str] = {}
        self.peak_total, self.at_peak, self.role_peaks = 0, {}, {}
        self.done = threading.Event()
        self.began = time.monotonic()
        self.last: dict[str, int] = {}

    def sample(self) -> None:
        held: dict[str, int] = {}
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if p.pid not in self.roles:
                self.roles[p.pid] = role_of(p.pid)
            role = self.roles[p.pid]
            held[role] = held.get(role, 0) + (p.usedGpuMemory or 0)
        total = sum(held.values())
        if total > self.peak_total:
            self.peak_total, self.at_peak = total, held
        for role, nbytes in held.items():
            self.role_peaks[role] = max(self.role_peaks.get(role, 0), nbytes)
        if any(abs(held.get(r, 0) - self.last.get(r, 0)) >= 2**29 for r in set(held) | set(self.last)):
            self.last = held
            print(f"{time.monotonic() - self.began:7.1f} mem " + " ".join(
                f"{r}={n / 2**30:.1f}" for r, n in sorted(held.items())) + f" total={total / 2**30:.1f} GiB",
                flush=True)

    def run(self) -> None:
        while not self.done.wait(0.05):
            self.sample()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    poller = Poller()
    thread = threading.Thread(target=poller.run, daemon=True)
    thread.start()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in child.stdout:
        print(f"{time.monotonic() - poller.began:7.1f} {line.rstrip()}", flush=True)
    code = child.wait()
    poller.done.set()
    thread.join()
    gib = lambda n: round(n / 2**30, 2)  # noqa: E731
    report = {"peak_total_gib": gib(poller.peak_total), "at_peak_gib": {k: gib(v) for k, v in poller.at_peak.items()},
              "role_peaks_gib": {k: gib(v) for k, v in poller.role_peaks.items()}}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
