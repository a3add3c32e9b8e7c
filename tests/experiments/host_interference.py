"""What slows a trusted process on a busy host (not a test): the work a device thread waits on, measured while other
processes load the host the way a pipeline's planners do, with and without CPU affinity keeping them apart.

    python tests/experiments/host_interference.py --out "$OUT"            # about 90 s on a GPU machine

A probe process repeats two things for --seconds and reports each one's median and 90th percentile:
- `python_ms`: a fixed piece of pure Python (the trusted processes' JSON, dispatch and bookkeeping);
- `launch_ms`: 50 small CUDA kernel launches and a synchronize on the probe's GPU (a baseline's timed calls).
Loads, --load processes each, at the planners' niceness:
- idle: nothing;
- spin: a Python busy loop (compiling planners);
- import: fresh interpreters importing torch and triton, one after another (warm spares starting);
- context-other / context-same: fresh interpreters that also make a CUDA context and a small allocation on the other
  GPU / the probe's GPU, then exit (planners coming and going).
Each load runs twice: everything unpinned, then the probe on two physical cores of its own (SMT siblings included)
and the load on the rest. Writes OUT/host_interference.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sandbox.cores import physical_cores  # noqa: E402

PROBE = r"""
import json, sys, time, torch
seconds = float(sys.argv[1])
x = torch.ones(1 << 16, device="cuda")
torch.cuda.synchronize()
def python_work():
    total = 0
    for i in range(20000):
        total += len(json.dumps({"i": i % 7}))
    return total
python_ms, launch_ms = [], []
end = time.perf_counter() + seconds
while time.perf_counter() < end:
    t = time.perf_counter(); python_work(); python_ms.append((time.perf_counter() - t) * 1e3)
    t = time.perf_counter()
    for _ in range(50):
        x.mul_(1.0)
    torch.cuda.synchronize(); launch_ms.append((time.perf_counter() - t) * 1e3)
print(json.dumps({"python_ms": python_ms, "launch_ms": launch_ms}))
"""

LOADS = {
    "idle": None,
    "spin": "while True: pass",
    "import": "import torch, triton",
    "context-other": "import torch; torch.zeros(1 << 20, device='cuda:{other}'); torch.cuda.synchronize()",
    "context-same": "import torch; torch.zeros(1 << 20, device='cuda:{same}'); torch.cuda.synchronize()",
}


def summary(values: list[float]) -> dict:
    values = sorted(values)
    return {"n": len(values), "median": round(statistics.median(values), 3),
            "p90": round(values[int(0.9 * (len(values) - 1))], 3)}


def loaders(code: str | None, count: int, cpus: set[int] | None, gpus: dict) -> list[subprocess.Popen]:
    if code is None:
        return []
    body = code.format(**gpus)
    if code.startswith("while"):
        script = body
    else:  # a fresh interpreter each time, as the pool starts them
        script = f"import subprocess, sys\nwhile True: subprocess.run([sys.executable, '-c', {body!r}])"
    procs = []
    for _ in range(count):
        procs.append(subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", script],
                                      preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))   # a group of its own: it and its children killed
    return procs


def probe(seconds: float, cpus: set[int] | None, gpu: str) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
    out = subprocess.run([sys.executable, "-c", PROBE, str(seconds)], capture_output=True, text=True, env=env,
                         preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None, check=True)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return {k: summary(v[1:]) for k, v in found.items()}   # the first pass warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--ramp-s", type=float, default=3)
    parser.add_argument("--load", type=int, default=None, help="load processes (default: 3/4 of the CPUs)")
    parser.add_argument("--loads", default=",".join(LOADS))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cores = physical_cores()
    count = args.load or max(1, 3 * len(os.sched_getaffinity(0)) // 4)
    probe_cpus = {c for core in cores[-2:] for c in core}
    load_cpus = set(os.sched_getaffinity(0)) - probe_cpus
    import torch

    gpus = {"same": "0", "other": "1" if torch.cuda.device_count() > 1 else "0"}
    report = {"cpus": len(os.sched_getaffinity(0)), "physical_cores": len(cores), "smt": max(map(len, cores)),
              "probe_cpus": sorted(probe_cpus), "load_processes": count, "rows": []}
    print(f"{report['cpus']} CPUs, {report['physical_cores']} physical cores; {count} load processes", flush=True)
    print(f"{'load':<14} {'pinned':<6} {'python ms (p90)':>16} {'launch ms (p90)':>16}", flush=True)
    for name in args.loads.split(","):
        for pinned in (False, True):
            procs = loaders(LOADS[name], count, load_cpus if pinned else None, gpus)
            try:
                time.sleep(args.ramp_s if procs else 0)
                found = probe(args.seconds, probe_cpus if pinned else None, gpus["same"])
            finally:
                for p in procs:
                    os.killpg(p.pid, signal.SIGKILL)
                for p in procs:
                    p.wait()
            report["rows"].append({"load": name, "pinned": pinned, **found})
            print(f"{name:<14} {str(pinned):<6} {found['python_ms']['median']:>8.2f} ({found['python_ms']['p90']:.2f})"
                  f" {found['launch_ms']['median']:>8.3f} ({found['launch_ms']['p90']:.3f})", flush=True)
            (args.out / "host_interference.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
