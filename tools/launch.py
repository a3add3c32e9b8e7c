"""Run raw PTX from a candidate: `PtxKernel(ptx, "entry").launch(grid, block, args)`.

Assembly happens at construction (ptxas, errors carry PTX line numbers), so the resources are known even without a GPU;
the cubin is loaded through CuPy on the first launch and runs on torch's current stream.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from tools.assemble import Assembly, assemble_ptx

DEFAULT_DYNAMIC_SHARED_LIMIT = 48 * 1024  # above this the function must opt in to more dynamic shared memory
MAX_SHARED_PER_BLOCK = 227 * 1024
MAX_THREADS_PER_BLOCK = 1024

_dynamic_shared_opted_in: dict[int, int] = {}  # function handle -> max dynamic shared bytes it was allowed


class NoGpuError(RuntimeError):
    """A PTX kernel was asked to launch on a machine without a CUDA GPU."""


_PARAM_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8}


def _entry_params(ptx: str, entry: str) -> list[tuple[str, int | None]] | None:
    """(name, size in bytes or None for aggregates) of each parameter of `.entry entry(...)`, None if not found."""
    match = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\(([^)]*)\)", ptx)
    if match is None:
        return None
    params = []
    for decl in filter(None, (d.strip() for d in match.group(1).split(","))):
        name = re.search(r"(\w+)\s*(\[\s*\d+\s*\])?\s*$", decl)
        width = re.search(r"\.[usbf](8|16|32|64)\b", decl)
        is_array = bool(name and name.group(2))
        params.append((name.group(1) if name else decl,
                       None if is_array or width is None else _PARAM_BYTES[width.group(1)]))
    return params


@functools.lru_cache(maxsize=256)
def _assemble_cached(ptx: str, arch: str) -> Assembly:
    # Candidates may build their kernel inside forward(): assemble each distinct PTX once per process.
    return assemble_ptx(ptx, arch)


@functools.lru_cache(maxsize=256)
def _load_function(cubin: bytes, entry: str, device: int):
    import cupy

    with cupy.cuda.Device(device):
        module = cupy.cuda.function.Module()
        module.load(cubin)
        return module.get_function(entry)  # the Function keeps its Module alive


@functools.lru_cache(maxsize=64)
def _cupy_stream(torch_stream):
    import cupy

    if hasattr(torch_stream, "__cuda_stream__"):
        return cupy.cuda.Stream.from_external(torch_stream)
    return cupy.cuda.ExternalStream(torch_stream.cuda_stream, torch_stream.device.index)


def _dims(value, what: str) -> tuple[int, ...]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, (int, np.integer)) or d < 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims)


class PtxKernel:
    """One entry function of a PTX module, assembled now and launched through CuPy."""

    def __init__(self, ptx: str, entry: str, arch: str = "sm_90"):
        self.ptx = ptx
        self.name = entry
        self.assembly = _assemble_cached(ptx, arch)
        if entry not in self.assembly.kernels:
            found = ", ".join(sorted(self.assembly.kernels)) or "none"
            raise ValueError(f"entry {entry!r} is not a kernel of this PTX (its .entry functions: {found})")
        self.resources = dict(self.assembly.kernels[entry])  # a copy: the assembly is shared through the cache
        self.log = self.assembly.log
        self._params = _entry_params(ptx, entry)

    def __repr__(self) -> str:
        return f"PtxKernel({self.name!r}, registers={self.resources['registers']})"

    def _convert(self, args, device: int | None) -> tuple[list, int | None]:
        converted = []
        for i, arg in enumerate(args):
            label = f"argument {i}" + (f" ({self._params[i][0]})" if self._params and i < len(self._params) else "")
            if hasattr(arg, "data_ptr") and hasattr(arg, "is_cuda"):  # a torch.Tensor
                if not arg.is_cuda:
                    raise TypeError(f"{label} is a {arg.device} tensor; PtxKernel.launch needs CUDA tensors")
                if device is not None and arg.device.index != device:
                    raise ValueError(f"{label} is on cuda:{arg.device.index} but earlier ones are on cuda:{device}")
                device = arg.device.index
                value = np.uint64(arg.data_ptr())
            elif arg is None:
                value = np.uint64(0)
            elif isinstance(arg, np.generic):
                value = arg
            elif isinstance(arg, int):
                if not -2**31 <= arg < 2**31:
                    raise ValueError(f"{label} = {arg} does not fit in int32: use numpy.int64 (or another numpy "
                                     "scalar)")
                value = np.int32(arg)
            elif isinstance(arg, float):
                value = np.float32(arg)
            else:
                raise TypeError(f"{label} has type {type(arg).__name__}; pass a CUDA tensor, int, float, None "
                                "or a numpy scalar")
            if self._params and i < len(self._params) and self._params[i][1] not in (None, value.nbytes):
                raise TypeError(f"{label} is {value.nbytes} bytes ({type(value).__name__}) but the PTX parameter "
                                f"is {self._params[i][1]} bytes; wrap it in the matching numpy scalar")
            converted.append(value)
        return converted, device

    def launch(self, grid, block, args, shared_mem: int = 0) -> None:
        """Launch on torch's current CUDA stream. Tensors go as device pointers, ints as int32, floats as float32."""
        import torch

        if not torch.cuda.is_available():
            raise NoGpuError(f"no CUDA GPU here: PtxKernel {self.name!r} assembled but cannot launch")
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        threads = int(np.prod(block))
        if threads > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"block {block} has {threads} threads; the most is {MAX_THREADS_PER_BLOCK}")
        if self._params is not None and len(args) != len(self._params):
            raise TypeError(f"{self.name} takes {len(self._params)} parameters, got {len(args)} arguments")
        total_shared = shared_mem + self.resources["shared_bytes"]
        if shared_mem < 0 or total_shared > MAX_SHARED_PER_BLOCK:
            raise ValueError(f"shared memory {shared_mem} dynamic + {self.resources['shared_bytes']} static bytes "
                             f"is outside 0..{MAX_SHARED_PER_BLOCK} per block")
        values, device = self._convert(args, None)
        device = torch.cuda.current_device() if device is None else device
        function = _load_function(self.assembly.cubin, self.name, device)
        launch_function(function, grid, block, values, shared_mem, torch.cuda.current_stream(device))


def launch_function(function, grid: tuple, block: tuple, values: list, shared_mem: int, torch_stream) -> None:
    """Launch a loaded CuPy function on a torch stream, opting in to more than 48 KiB of dynamic shared memory
    first when asked for (shared by PtxKernel and the trusted executor, which replays PTX launches)."""
    import cupy

    with cupy.cuda.Device(torch_stream.device.index):
        if shared_mem > _dynamic_shared_opted_in.get(function.ptr, DEFAULT_DYNAMIC_SHARED_LIMIT):
            cupy.cuda.driver.funcSetAttribute(
                function.ptr, cupy.cuda.driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_mem)
            _dynamic_shared_opted_in[function.ptr] = shared_mem
        function(grid, block, tuple(values), shared_mem=shared_mem, stream=_cupy_stream(torch_stream))
