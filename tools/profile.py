"""Measuring on the GPU: device facts, NVML snapshots, interleaved event timing, roofline, Nsight Compute.

Read-only towards the GPU: NVML is only queried, and ncu always runs with `--clock-control none`.
Imports of torch / pynvml happen inside the functions so this module loads anywhere.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import io
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from tools.timing import flush_buffer, timed_call

# Dense (no sparsity) tensor-core peaks in TFLOP/s, from NVIDIA's datasheets; fp32 is the non-tensor FMA peak.
# More specific names first: "H100 PCIe" must match before "H100".
PEAK_TFLOPS = (
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}),
    ("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("H200 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}),
    ("H100", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
)
PEAK_DTYPES = ("bf16", "fp16", "tf32", "fp32")
# fp32 at about fp32's accuracy also runs on tensor cores: 3xTF32 splits each operand into two TF32 parts and sums
# three TF32 products (the evaluator credits it), so fp32's speed of light is the faster of the FMA peak and a third
# of the TF32 peak (an fp32 GEMM in 3xTF32 reached 116% of the FMA peak on an H200: KernelBench level 2's 53).
TF32_PRODUCTS_PER_FP32 = 3

# NVML clock-event ("throttle") reason bits.
CLOCK_EVENT_REASONS = {
    0x1: "GpuIdle",
    0x2: "AppClocks",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermal",
    0x40: "HwThermal",
    0x80: "HwPowerBrake",
    0x100: "DisplayClock",
}
THROTTLING = ("SwPowerCap", "HwSlowdown", "SwThermal", "HwThermal", "HwPowerBrake")


def peak_tflops_for(name: str) -> dict[str, float | None]:
    """Datasheet peaks by GPU name; every dtype None for a GPU not in the table."""
    for key, peaks in PEAK_TFLOPS:
        if key.lower() in name.lower():
            return dict(peaks)
    return dict.fromkeys(PEAK_DTYPES)


def _nvml_handle(pynvml, device: int, uuid: str | None = None):
    """NVML's handle for CUDA device `device` (CUDA_VISIBLE_DEVICES renumbers CUDA devices, NVML does not), or for
    the GPU with `uuid` (a GPU this process does not use itself: one executor's of several).

    By UUID when this process already uses CUDA; otherwise from CUDA_VISIBLE_DEVICES, so that a snapshot never
    initializes CUDA itself (a process that forks workers must not).
    """
    if uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    try:
        import torch

        if torch.cuda.is_initialized():
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except (ImportError, AttributeError, pynvml.NVMLError):
        pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if device < len(visible):
        chosen = visible[device]
        if chosen.isdigit():
            return pynvml.nvmlDeviceGetHandleByIndex(int(chosen))
        return pynvml.nvmlDeviceGetHandleByUUID(chosen)
    return pynvml.nvmlDeviceGetHandleByIndex(device)


def _nvml_read(getter, *args):
    """One NVML getter, None where this GPU or driver does not support it."""
    import pynvml

    try:
        return getter(*args)
    except pynvml.NVMLError:
        return None


_nvml_ready: bool | None = None   # NVML initialized once per process (nvmlInit enumerates every GPU: tens of ms)


def _with_nvml(device: int, read: Callable, uuid: str | None = None):
    """read(pynvml, handle) with NVML initialized (once per process, never shut down: snapshots are taken around
    every timing); None when NVML or its driver is not there."""
    global _nvml_ready
    try:
        import pynvml
    except ImportError:
        return None
    if _nvml_ready is None:
        try:
            pynvml.nvmlInit()
            _nvml_ready = True
        except Exception:  # no driver, no libnvidia-ml: no NVML facts
            _nvml_ready = False
    if not _nvml_ready:
        return None
    try:
        return read(pynvml, _nvml_handle(pynvml, device, uuid))
    except pynvml.NVMLError:
        return None


def _nvml_facts(pynvml, handle) -> dict:
    bus_bits = _nvml_read(pynvml.nvmlDeviceGetMemoryBusWidth, handle)
    mem_mhz = _nvml_read(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM)
    return {
        "index": _nvml_read(pynvml.nvmlDeviceGetIndex, handle),
        "driver": _nvml_read(pynvml.nvmlSystemGetDriverVersion),
        # double data rate, bits -> bytes, MB/s -> GB/s
        "peak_gbps": bus_bits * mem_mhz * 2 / 8 / 1000 if bus_bits and mem_mhz else None,
    }


def gpu_info(device: int = 0) -> dict | None:
    """Facts about a CUDA GPU for the evaluator's `gpu` entry; None when there is no GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    nvml = _with_nvml(device, _nvml_facts) or {}
    uuid = str(getattr(props, "uuid", "") or "")
    peak_gbps = nvml.get("peak_gbps")
    if peak_gbps is None and getattr(props, "memory_bus_width", 0) and getattr(props, "memory_clock_rate", 0):
        peak_gbps = props.memory_bus_width * props.memory_clock_rate * 2 / 8 / 1e6  # kHz -> GB/s
    info = {
        "name": props.name,
        # which GPU of the machine: NVML's index (not renumbered by CUDA_VISIBLE_DEVICES) and the UUID
        "index": nvml["index"] if nvml.get("index") is not None else device,
        "uuid": (uuid if uuid.startswith("GPU-") else f"GPU-{uuid}") if uuid else None,
        "sms": props.multi_processor_count,
        "smem_per_block_bytes": getattr(props, "shared_memory_per_block_optin", None),
        "smem_per_sm_bytes": getattr(props, "shared_memory_per_multiprocessor", None),
        "l2_bytes": props.L2_cache_size,
        "cc": f"{props.major}.{props.minor}",
        "total_memory_bytes": props.total_memory,
        "driver": nvml.get("driver"),
        "cuda": torch.version.cuda,
        "peak_gbps": peak_gbps,
    }
    info.update({f"peak_tflops_{dtype}": value for dtype, value in peak_tflops_for(props.name).items()})
    return info


def gpu_uuid(visible: str | None = None) -> str | None:
    """The UUID of the GPU a CUDA_VISIBLE_DEVICES entry names (None: this process's first GPU), from NVML without
    initializing CUDA; None without NVML."""
    if visible is None:
        entries = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        visible = entries[0] if entries else "0"
    if visible.startswith(("GPU-", "MIG-")):
        return visible

    def read(pynvml, handle):
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        return uuid.decode() if isinstance(uuid, bytes) else uuid

    if not visible.isdigit():
        return None
    return _with_nvml(0, lambda pynvml, _handle: read(pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(visible))))


def gpu_place(uuid: str) -> tuple[int, int] | None:
    """(NVML index of the GPU with `uuid`, GPUs NVML sees on this node), without initializing CUDA; None without
    NVML."""
    return _with_nvml(0, lambda pynvml, handle: (pynvml.nvmlDeviceGetIndex(handle), pynvml.nvmlDeviceGetCount()),
                      uuid)


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the NVML clock-event reason bits set in `mask`."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([f"0x{unknown:x}"] if unknown else [])


def nvml_snapshot(device: int = 0, uuid: str | None = None) -> dict | None:
    """Clocks, power, temperature, clock-event reasons and energy of a GPU now (CUDA device `device` of this
    process, or the GPU with `uuid`); None without NVML. Read-only."""
    def read(pynvml, handle):
        power_mw = _nvml_read(pynvml.nvmlDeviceGetPowerUsage, handle)
        events = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = _nvml_read(events, handle)
        return {
            "time": time.time(),
            "sm_clock_mhz": _nvml_read(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": _nvml_read(pynvml.nvmlDeviceGetClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": _nvml_read(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_SM),
            "max_mem_clock_mhz": _nvml_read(pynvml.nvmlDeviceGetMaxClockInfo, handle, pynvml.NVML_CLOCK_MEM),
            "power_w": None if power_mw is None else power_mw / 1000,
            "temperature_c": _nvml_read(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
            "clock_event_reasons": None if mask is None else decode_clock_event_reasons(mask),
            "energy_mj": _nvml_read(pynvml.nvmlDeviceGetTotalEnergyConsumption, handle),
        }

    return _with_nvml(device, read, uuid)


def throttle_reasons(before: dict | None, after: dict | None) -> list[str]:
    """The throttling clock-event reasons (power cap, thermal, hardware slowdown) seen in either snapshot."""
    seen = set()
    for snapshot in (before, after):
        seen.update((snapshot or {}).get("clock_event_reasons") or ())
    return [reason for reason in THROTTLING if reason in seen]


def summarize(samples_ms: list[float]) -> dict:
    """Statistics of kernel times given in milliseconds, reported in microseconds (cv is unitless)."""
    if not samples_ms:
        raise ValueError("summarize needs at least one sample")
    us = sorted(float(s) * 1000 for s in samples_ms)
    q1, median, q3 = statistics.quantiles(us, n=4, method="inclusive") if len(us) > 1 else (us[0],) * 3
    mean = statistics.fmean(us)
    stdev = statistics.stdev(us) if len(us) > 1 else 0.0
    return {"median": median, "q1": q1, "q3": q3, "iqr": q3 - q1, "min": us[0], "max": us[-1], "n": len(us),
            "mean": mean, "cv": stdev / mean if mean else 0.0}


def time_interleaved(fns: dict[str, Callable[[], object]], calls: int = 30, warmup: int = 5,
                     flush_bytes: int | None = None, before_round: Callable[[int], None] | None = None,
                     after_call: Callable[[str, int, object], None] | None = None) -> dict[str, dict]:
    """Time several callables round-robin on the current CUDA device, so clock drift hits them alike.

    Each call is one `tools.timing.timed_call` (cold L2 unless `flush_bytes` is 0, launch path covered, CUDA events
    on the current stream); the host wall clock around each call is summed too: events_total_ms must not exceed
    wall_total_ms. `before_round(i)` runs before round i and `after_call(name, i, output)` after each timed call,
    both outside the events.
    """
    import torch

    if not fns:
        raise ValueError("time_interleaved needs at least one callable")
    if calls < 1 or warmup < 0:
        raise ValueError(f"calls must be >= 1 and warmup >= 0, got calls={calls}, warmup={warmup}")
    flush = flush_buffer(torch.cuda.current_device(), flush_bytes)

    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    torch.cuda.synchronize()

    samples: dict[str, list[float]] = {name: [] for name in names}
    wall_ms = dict.fromkeys(names, 0.0)
    for round_index in range(calls):
        if before_round is not None:  # e.g. fresh input data, outside the timed region
            before_round(round_index)
        # Rotate the order each round so no callable always runs right after the same neighbour.
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            out, ms, wall = timed_call(fns[name], flush)
            samples[name].append(ms)
            wall_ms[name] += wall
            if after_call is not None:  # e.g. keep an output to verify later, outside the timed region
                after_call(name, round_index, out)
            del out

    return {name: summarize(samples[name]) | {"events_total_ms": sum(samples[name]), "wall_total_ms": wall_ms[name]}
            for name in names}


def _tensors_in(value) -> list:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors_in(item)]
    return []


def _unique_bytes(tensors) -> int:
    """Bytes spanned by the tensors, each storage counted once (a tensor passed twice, or two views, count once)."""
    spans: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for t in tensors:
        if t.numel() == 0:
            continue
        extent = (sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride())) + 1) * t.element_size()
        storage = t.untyped_storage()
        spans[(t.device, storage.data_ptr())].append((t.data_ptr(), t.data_ptr() + extent))
    total = 0
    for ranges in spans.values():
        reach = None
        for lo, hi in sorted(ranges):
            if reach is None or lo >= reach:
                total += hi - lo
                reach = hi
            elif hi > reach:
                total += hi - reach
                reach = hi
    return total


def count_bytes_and_flops(model, inputs, outputs) -> tuple[int, int]:
    """(unique bytes read and written, FLOPs) of one forward: the minimum traffic a perfect kernel must move.

    Bytes: distinct input storages (parameters and buffers included: a kernel must read its weights) plus outputs.
    FLOPs: torch's FlopCounterMode over model(*inputs); elementwise ops count 0 (they are memory-bound anyway). The
    forward runs on fake tensors (shapes only: at KernelBench's full size a real one needs another output's worth
    of GPU memory and its intermediates), and for real only where fake tensors cannot run it (data-dependent shapes).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    weights = list(model.parameters()) + list(model.buffers()) if isinstance(model, torch.nn.Module) else []
    read_bytes = _unique_bytes(_tensors_in(list(inputs)) + weights)
    written_bytes = _unique_bytes(_tensors_in(outputs))

    def flops(mode, args) -> int:
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), mode, counter:
            model(*args)
        return int(counter.get_total_flops())

    fake = FakeTensorMode(allow_non_fake_inputs=True)   # the weights stay real: faked as they are met, not copied
    try:
        total = flops(fake, [fake.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs])
    except Exception:   # data-dependent shapes (nonzero, boolean masks): run it for real
        total = flops(contextlib.nullcontext(), inputs)
    return read_bytes + written_bytes, total


def _dtype_key(dtype) -> str | None:
    """The peak-table key of a torch dtype or key string; None for dtypes with no peak in the table (int, fp64)."""
    import torch

    by_torch = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
    if dtype in by_torch:
        return by_torch[dtype]
    if isinstance(dtype, str):
        if dtype not in PEAK_DTYPES:
            raise ValueError(f"unknown dtype key {dtype!r}; use one of {PEAK_DTYPES} or a torch dtype")
        return dtype
    return None


def roofline(bytes_moved: int, flops: int, gpu: dict | None, time_us: float | None, dtype) -> dict:
    """Speed of light: the time the GPU's peak bandwidth or peak FLOP rate allows, whichever is longer.

    Without a known FLOP peak for the dtype (fp64, integers, a GPU not in the table) only the memory bound counts.
    fp32's peak is the FMA units' or 3xTF32's on the tensor cores, whichever is higher (TF32_PRODUCTS_PER_FP32).
    """
    key = _dtype_key(dtype)
    peak_gbps = (gpu or {}).get("peak_gbps")
    peak_tflops = (gpu or {}).get(f"peak_tflops_{key}") if key else None
    tf32 = (gpu or {}).get("peak_tflops_tf32")
    if key == "fp32" and tf32:
        peak_tflops = max(peak_tflops or 0.0, tf32 / TF32_PRODUCTS_PER_FP32)
    memory_us = bytes_moved / (peak_gbps * 1e3) if peak_gbps else None          # GB/s = 1e3 bytes/us
    compute_us = flops / (peak_tflops * 1e6) if peak_tflops and flops else 0.0  # TFLOP/s = 1e6 flop/us
    if memory_us is None:
        sol_us, bound = None, None
    else:
        sol_us = max(memory_us, compute_us)
        bound = "compute" if compute_us > memory_us else "memory"
    return {
        "bytes": bytes_moved,
        "flops": flops,
        "dtype": key,
        "bound": bound,
        "memory_us": memory_us,
        "compute_us": compute_us if peak_tflops else None,
        "sol_us": sol_us,
        "sol_fraction": sol_us / time_us if sol_us is not None and time_us else None,
        "peak_gbps": peak_gbps,
        "peak_tflops": peak_tflops,
    }


# ---- Nsight Compute ----

NCU_STALL_REASONS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle", "long_scoreboard",
    "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "short_scoreboard",
    "sleeping", "tex_throttle", "wait",
)
_STALL_PREFIX, _STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
NCU_METRICS = {
    "gpu__time_duration.sum": "gpu_time",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved_occupancy_pct",
    "lts__t_sector_hit_rate.pct": "l2_hit_pct",
} | {f"{_STALL_PREFIX}{reason}{_STALL_SUFFIX}": f"stall:{reason}" for reason in NCU_STALL_REASONS}
# Tensor-pipe utilization (percent of the peak sustained while the SM is active): wgmma on Hopper (gmma), mma.sync
# (hmma), any tensor op. Names differ by chip and Nsight Compute version, and ncu fails on a name it does not know,
# so only those its --query-metrics lists are asked for (ncu_metrics).
NCU_TENSOR_METRICS = {f"{base}.avg.pct_of_peak_sustained_active": f"tensor:{base}" for base in (
    "sm__pipe_tensor_op_gmma_cycles_active", "sm__pipe_tensor_op_hmma_cycles_active", "sm__pipe_tensor_cycles_active")}
_TIME_UNIT_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
                 "second": 1e6, "s": 1e6}


class NcuError(RuntimeError):
    """Nsight Compute is missing, failed, or timed out."""


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for candidate in ["/usr/local/cuda/bin/ncu", *sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu"))]:
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def ncu_command(argv: list[str], out_csv: str, kernel_regex: str | None = None,
                launch_count: int | None = None, ncu: str = "ncu") -> list[str]:
    """The ncu command line profiling `argv`; the CSV (raw page) goes to `out_csv`, the program's output stays apart.

    --clock-control none always: ncu's default locks the clocks, and the GPU's settings must be left alone.
    """
    metrics = list(NCU_METRICS) + [m for m in NCU_TENSOR_METRICS if m.split(".")[0] in known_metrics(ncu)]
    command = [ncu, "--clock-control", "none", "--target-processes", "all", "--csv", "--page", "raw",
               "--print-units", "base", "--metrics", ",".join(metrics), "--log-file", out_csv]
    if kernel_regex:
        command += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_count:
        command += ["--launch-count", str(launch_count)]
    return command + list(argv)


@functools.cache
def known_metrics(ncu: str = "ncu") -> frozenset[str]:
    """Base metric names this Nsight Compute reports for the attached GPU (empty when the query fails)."""
    try:
        listed = subprocess.run([ncu, "--query-metrics"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return frozenset()
    if listed.returncode != 0:
        return frozenset()
    return frozenset(line.split()[0] for line in listed.stdout.splitlines() if line.strip() and "__" in line.split()[0])


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None  # "n/a" and empty cells


def parse_ncu_csv(text: str) -> dict[str, dict]:
    """Per kernel name, the metrics of `ncu --csv --page raw` averaged over its launches."""
    rows = list(csv.reader(io.StringIO("\n".join(
        line for line in text.splitlines() if line.strip() and not line.startswith("=")))))
    header_at = next((i for i, row in enumerate(rows) if "Kernel Name" in row), None)
    if header_at is None:
        return {}
    header = rows[header_at]
    name_col = header.index("Kernel Name")
    body = rows[header_at + 1:]
    units = dict.fromkeys(header, "")
    if body and not body[0][name_col].strip():  # the units row has no kernel name
        units = dict(zip(header, body[0]))
        body = body[1:]

    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    launches: dict[str, int] = defaultdict(int)
    for row in body:
        if len(row) != len(header):
            continue
        kernel = row[name_col]
        launches[kernel] += 1
        for column, cell in zip(header, row):
            key = NCU_METRICS.get(column) or NCU_TENSOR_METRICS.get(column)
            if key and (value := _number(cell)) is not None:
                if column == "gpu__time_duration.sum":
                    value *= _TIME_UNIT_US.get(units.get(column, "").strip(), 1e-3)  # ncu's base unit is ns
                sums[kernel][key].append(value)

    parsed = {}
    for kernel, count in launches.items():
        mean = {key: statistics.fmean(values) for key, values in sums[kernel].items()}
        stalls = {key.split(":", 1)[1]: value for key, value in mean.items() if key.startswith("stall:")}
        parsed[kernel] = {
            "launches": count,
            "gpu_time_us": mean.get("gpu_time"),
            "dram_pct": mean.get("dram_pct"),
            "sm_pct": mean.get("sm_pct"),
            "achieved_occupancy_pct": mean.get("achieved_occupancy_pct"),
            "l2_hit_pct": mean.get("l2_hit_pct"),
            "tensor_pct": max((v for k, v in mean.items() if k.startswith("tensor:")), default=None),
            "stalls": stalls,
            "top_stalls": sorted(stalls.items(), key=lambda kv: (-kv[1], kv[0]))[:3],
        }
    return parsed


def run_ncu(argv: list[str], env: dict | None = None, kernel_regex: str | None = None, timeout_s: float = 300,
            launch_count: int | None = None) -> dict[str, dict]:
    """Profile the program `argv` under Nsight Compute and parse its metrics ({} when no kernel matched)."""
    ncu = find_ncu()
    if ncu is None:
        raise NcuError("ncu (Nsight Compute) not found on PATH, in /usr/local/cuda/bin or /opt/nvidia/nsight-compute")
    with tempfile.TemporaryDirectory(prefix="kloop-ncu-") as tmp:
        out_csv = str(Path(tmp) / "ncu.csv")
        command = ncu_command(argv, out_csv, kernel_regex, launch_count, ncu=ncu)
        # Own process group, so a timeout kills ncu and the program it profiles together.
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise NcuError(f"ncu timed out after {timeout_s:g} s") from None
        log = Path(out_csv).read_text(errors="replace") if Path(out_csv).exists() else ""
        problems = [line for line in (log + "\n" + stderr).splitlines() if line.startswith("==ERROR==")]
        if process.returncode != 0 or problems:
            detail = "; ".join(problems) or (stderr.strip() or stdout.strip())[-500:] or "no output"
            raise NcuError(f"ncu exited with status {process.returncode}: {detail}")
        return parse_ncu_csv(log)
