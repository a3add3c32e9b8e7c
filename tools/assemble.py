"""Build PTX with ptxas and read what the kernels cost: registers, spills, shared memory, occupancy.

Everything here works without a GPU: ptxas and cuobjdump assemble and inspect for sm_90 on any machine.
"""
from __future__ import annotations

import functools
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PTXAS_TIMEOUT_S = 60

# Hopper (sm_90) limits, as the CUDA occupancy calculator (cuda_occupancy.h) uses them.
HOPPER_LIMITS = {
    "warp_size": 32,
    "regs_per_sm": 65536,
    "max_regs_per_block": 65536,
    "max_regs_per_thread": 255,
    "reg_alloc_unit": 256,          # registers are allocated per warp in units of 256
    "reg_sub_partitions": 4,        # each of the 4 SM sub-partitions holds a quarter of the register file
    "max_threads_per_sm": 2048,
    "max_threads_per_block": 1024,
    "max_warps_per_sm": 64,
    "max_blocks_per_sm": 32,
    "shared_per_sm": 228 * 1024,
    "max_shared_per_block": 227 * 1024,
    "reserved_shared_per_block": 1024,  # the driver's own shared memory in every block
    "shared_alloc_unit": 128,
}


class PtxAssembleError(Exception):
    """ptxas rejected the PTX; the message lists each error with its PTX line."""

    def __init__(self, message: str, errors: list[tuple[int | None, str]] | None = None, log: str = ""):
        super().__init__(message)  # only the message in args, so the exception pickles across processes
        self.errors = errors or []  # (PTX line number or None, ptxas message)
        self.log = log              # ptxas's whole output


@dataclass
class Assembly:
    cubin: bytes
    log: str                                        # ptxas -v output (info and warnings)
    kernels: dict[str, dict] = field(default_factory=dict)
    ptxas_version: str = ""
    arch: str = "sm_90"


def find_tool(name: str) -> str | None:
    """Path of a CUDA binary tool (ptxas, cuobjdump, nvdisasm): PATH first, then the copy bundled with Triton."""
    on_path = shutil.which(name)
    if on_path:
        return on_path
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    return str(bundled) if bundled.is_file() and os.access(bundled, os.X_OK) else None


def _require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found on PATH nor in Triton's backends/nvidia/bin")
    return path


@functools.lru_cache(maxsize=None)
def _tool_version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    match = re.search(r"V(\d+\.\d+\.\d+)", out)
    if match:
        return match.group(1)
    return out.strip().splitlines()[-1] if out.strip() else ""


def _effective_arch(ptx: str, arch: str) -> str:
    """PTX declaring `.target sm_90a` (wgmma, setmaxnreg) must be assembled for sm_90a: ptxas refuses sm_90."""
    target = re.search(r"^\s*\.target\s+(sm_\w+)", ptx, re.MULTILINE)
    if target and target.group(1) in (arch + "a", arch + "f"):
        return target.group(1)
    return arch


_ERROR_LINE = re.compile(r"^ptxas (?:.+?), line (\d+); (?:error|fatal)\s*: (.*)$")
_FATAL = re.compile(r"^ptxas (?:error|fatal)\s*: (.*)$")


def _errors_of(log: str) -> list[tuple[int | None, str]]:
    errors: list[tuple[int | None, str]] = []
    for line in log.splitlines():
        if m := _ERROR_LINE.match(line):
            errors.append((int(m.group(1)), m.group(2).strip()))
        elif (m := _FATAL.match(line)) and m.group(1).strip() != "Ptx assembly aborted due to errors":
            errors.append((None, m.group(1).strip()))
    return errors


def _error_message(errors: list[tuple[int | None, str]], ptx: str, arch: str, log: str) -> str:
    ptx_lines = ptx.splitlines()
    parts = [f"ptxas could not assemble the PTX for {arch}:"]
    for line_no, message in errors:
        if line_no is None:
            parts.append(message)
            continue
        parts.append(f"line {line_no}: {message}")
        if 1 <= line_no <= len(ptx_lines):
            parts.append(f"    {ptx_lines[line_no - 1].strip()}")
    if not errors:
        parts.append(log.strip() or "no output")
    return "\n".join(parts)


_COMPILING = re.compile(r"Compiling entry function '([^']+)'")
_PROPERTIES = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def _parse_usage(log: str) -> dict[str, dict]:
    """Per entry function: the numbers of `ptxas -v` (smem is static shared memory only)."""
    kernels: dict[str, dict] = {}
    frames: dict[str, tuple[int, int, int]] = {}
    entry = properties_of = None
    for line in log.splitlines():
        if m := _COMPILING.search(line):
            entry = m.group(1)
            kernels[entry] = {"registers": 0, "spill_stores_bytes": 0, "spill_loads_bytes": 0, "shared_bytes": 0,
                              "stack_bytes": 0, "const_bytes": 0, "barriers": 0}
        elif m := _PROPERTIES.search(line):
            properties_of = m.group(1)
        elif (m := _FRAME.search(line)) and properties_of:
            frames[properties_of] = tuple(int(g) for g in m.groups())
        elif (m := _USED.search(line)) and entry:
            usage = kernels[entry]
            usage["registers"] = int(m.group(1))
            if b := re.search(r"used (\d+) barriers", line):
                usage["barriers"] = int(b.group(1))
            if s := re.search(r"(\d+) bytes smem", line):
                usage["shared_bytes"] = int(s.group(1))
            # ptxas 13 no longer prints cmem; older ones list one entry per constant bank.
            usage["const_bytes"] = sum(int(c) for c in re.findall(r"(\d+) bytes cmem\[\d+\]", line))
    for name, usage in kernels.items():
        if name in frames:
            usage["stack_bytes"], usage["spill_stores_bytes"], usage["spill_loads_bytes"] = frames[name]
    return kernels


def assemble_ptx(ptx: str, arch: str = "sm_90", timeout_s: float = PTXAS_TIMEOUT_S) -> Assembly:
    """Assemble PTX to a cubin with `ptxas -v`; raise PtxAssembleError (with PTX line numbers) when it fails."""
    if not isinstance(ptx, str) or not ptx.strip():
        raise ValueError("assemble_ptx needs PTX text (got an empty or non-string value)")
    ptxas = _require_tool("ptxas")
    arch = _effective_arch(ptx, arch)
    with tempfile.TemporaryDirectory(prefix="kloop-ptxas-") as tmp:
        source, cubin = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        source.write_text(ptx)
        try:
            done = subprocess.run([ptxas, "-v", f"-arch={arch}", str(source), "-o", str(cubin)],
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise PtxAssembleError(f"ptxas timed out after {timeout_s:g} s") from None
        log = (done.stdout + done.stderr).replace(str(source), "kernel.ptx")
        if done.returncode != 0 or not cubin.is_file():
            errors = _errors_of(log)
            raise PtxAssembleError(_error_message(errors, ptx, arch, log), errors, log)
        return Assembly(cubin=cubin.read_bytes(), log=log, kernels=_parse_usage(log),
                        ptxas_version=_tool_version(ptxas), arch=arch)


def _run_cuobjdump(flag: str, cubin: bytes) -> str | None:
    tool = find_tool("cuobjdump")
    if tool is None:
        return None
    with tempfile.TemporaryDirectory(prefix="kloop-cuobjdump-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        done = subprocess.run([tool, flag, str(path)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"cuobjdump {flag} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def sass_of(cubin: bytes) -> str | None:
    """The SASS listing of a cubin (cuobjdump --dump-sass), or None when cuobjdump is not there."""
    return _run_cuobjdump("--dump-sass", cubin)


def cubin_resources(cubin: bytes) -> dict[str, dict] | None:
    """Per function, from `cuobjdump -res-usage`: registers, stack, shared, local (spill and local array) bytes.

    Its shared size is static shared memory plus 1 KiB on sm_90 when there is any (ptxas -v shows it without).
    """
    out = _run_cuobjdump("-res-usage", cubin)
    if out is None:
        return None
    found: dict[str, dict] = {}
    name = None
    for line in out.splitlines():
        if m := re.match(r"\s*Function (\S+):", line):
            name = m.group(1)
        elif name and (m := re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)):
            found[name] = dict(zip(("registers", "stack_bytes", "shared_bytes", "local_bytes"),
                                   (int(g) for g in m.groups())))
    return found


def _limits(device: dict | None) -> dict:
    limits = dict(HOPPER_LIMITS)
    if device:
        unknown = set(device) - set(HOPPER_LIMITS)
        if unknown:
            raise ValueError(f"unknown device limit(s) {sorted(unknown)}; known: {sorted(HOPPER_LIMITS)}")
        limits.update({k: int(v) for k, v in device.items() if v is not None})
    return limits


def device_limits(device: int = 0) -> dict:
    """The occupancy limits of a CUDA device, from torch's device properties (for theoretical_occupancy)."""
    import torch

    props = torch.cuda.get_device_properties(device)
    found = {
        "warp_size": getattr(props, "warp_size", None),
        "regs_per_sm": getattr(props, "regs_per_multiprocessor", None),
        "max_threads_per_sm": getattr(props, "max_threads_per_multi_processor", None),
        "shared_per_sm": getattr(props, "shared_memory_per_multiprocessor", None),
        "max_shared_per_block": getattr(props, "shared_memory_per_block_optin", None),
    }
    if found["max_threads_per_sm"] and found["warp_size"]:
        found["max_warps_per_sm"] = found["max_threads_per_sm"] // found["warp_size"]
    return {k: v for k, v in found.items() if v is not None}


def theoretical_occupancy(registers: int, shared_bytes: int, threads_per_block: int,
                          device: dict | None = None) -> float:
    """Active warps / max warps per SM, the way the CUDA occupancy calculator computes it.

    shared_bytes is the block's static plus dynamic shared memory (without the driver's reserve, which is added here).
    0.0 means the block cannot launch at all (too many registers or too much shared memory per block).
    `device` overrides HOPPER_LIMITS entries (see device_limits).
    """
    lim = _limits(device)
    if not 1 <= threads_per_block <= lim["max_threads_per_block"]:
        raise ValueError(f"threads_per_block must be 1..{lim['max_threads_per_block']}, got {threads_per_block}")
    if not 0 <= registers <= lim["max_regs_per_thread"]:
        raise ValueError(f"registers must be 0..{lim['max_regs_per_thread']} per thread, got {registers}")
    if shared_bytes < 0:
        raise ValueError(f"shared_bytes must be >= 0, got {shared_bytes}")

    warps_per_block = math.ceil(threads_per_block / lim["warp_size"])
    by_warps = min(lim["max_warps_per_sm"] // warps_per_block, lim["max_threads_per_sm"] // threads_per_block)

    by_regs = lim["max_blocks_per_sm"]
    if registers:
        unit = lim["reg_alloc_unit"]
        regs_per_warp = math.ceil(registers * lim["warp_size"] / unit) * unit
        if regs_per_warp * warps_per_block > lim["max_regs_per_block"]:
            return 0.0
        # Warps cannot straddle sub-partitions, so each sub-partition's quarter of the register file is filled alone.
        warps_per_partition = (lim["regs_per_sm"] // lim["reg_sub_partitions"]) // regs_per_warp
        by_regs = warps_per_partition * lim["reg_sub_partitions"] // warps_per_block

    if shared_bytes > lim["max_shared_per_block"]:
        return 0.0
    unit = lim["shared_alloc_unit"]
    shared_per_block = math.ceil((shared_bytes + lim["reserved_shared_per_block"]) / unit) * unit
    by_shared = lim["shared_per_sm"] // shared_per_block if shared_per_block else lim["max_blocks_per_sm"]

    blocks = min(lim["max_blocks_per_sm"], by_warps, by_regs, by_shared)
    return blocks * warps_per_block / lim["max_warps_per_sm"]


def _triton_arch(compiled) -> str:
    capability = compiled.metadata.target.arch
    return f"sm_{capability}{'a' if capability >= 90 else ''}"  # Triton targets sm_90a on Hopper


def triton_kernel_resources(compiled, device: dict | None = None) -> dict:
    """Resources of a Triton CompiledKernel, in the evaluator's `resources` entry shape.

    n_regs / n_spills exist only once the kernel has been launched; before that (or with no GPU) the numbers come
    from `cuobjdump -res-usage` on the kernel's cubin. Spills are counted in 4-byte words, as Triton does.
    """
    meta = compiled.metadata
    threads = meta.num_warps * meta.warp_size
    registers = getattr(compiled, "n_regs", None)
    spills = getattr(compiled, "n_spills", None)
    source = "triton"
    if registers is None:
        usage = (cubin_resources(compiled.asm["cubin"]) or {}).get(compiled.name) if "cubin" in compiled.asm else None
        if usage:
            registers, spills, source = usage["registers"], usage["local_bytes"] // 4, "cuobjdump"
    return {
        "kernel": compiled.name,
        "source": source,
        "registers": registers,
        "spills": spills,
        "shared_bytes": meta.shared,
        "num_warps": meta.num_warps,
        "num_stages": meta.num_stages,
        "threads": threads,
        "occupancy": None if registers is None else theoretical_occupancy(registers, meta.shared, threads, device),
        "arch": _triton_arch(compiled),
        "ptx": compiled.asm.get("ptx"),
    }
