"""Without a GPU, the jailed planner answers the candidate's CUDA probes as an H100 would, or as the GPU it plans
for (`describe`, on a GPU node, where planners get no device: sandbox/pool.py).

Public Triton code checks its device before it launches (`assert x.is_cuda`, `if not x.is_cuda: return torch...`,
`torch.cuda.is_available()`, `DEVICE = triton.runtime.driver.active.get_active_torch_device()`, grids sized from
`torch.cuda.get_device_properties(...).multi_processor_count`). Answered truthfully on the CPU, such a kernel fails
with a bare AssertionError, or plans another path than it would on a GPU: a kernel that computes exactly where
`torch.cuda.is_available()` is false and approximates on a GPU would be credited for code the GPU never runs.

So, in the planner only (it runs candidate code and is untrusted anyway; nothing here is a defence): CPU tensors
say they are `cuda:0`, a `cuda` device named for an allocation or a copy means the CPU, torch.cuda answers as one
H100 and Triton's active driver as CUDA on it. The executor and the referee never see any of it: they replay the
recorded plan on CPU tensors of their own (on a GPU node, on the GPU).
"""
from __future__ import annotations

import contextlib
import json
import os
from types import SimpleNamespace

import torch
from torch.overrides import TorchFunctionMode

from sandbox.process import PLAN_GPU_ENV

CUDA0 = torch.device("cuda", 0)
CPU = torch.device("cpu")
NAME = "NVIDIA H100 80GB HBM3"
CAPABILITY = (9, 0)
# torch.cuda.get_device_properties(0) on an H100 SXM (torch 2.11).
PROPERTIES = SimpleNamespace(
    name=NAME, major=9, minor=0, total_memory=85_029_158_912, multi_processor_count=132, warp_size=32,
    max_threads_per_multi_processor=2048, max_threads_per_block=1024, regs_per_multiprocessor=65536,
    shared_memory_per_block=49152, shared_memory_per_block_optin=232448, shared_memory_per_multiprocessor=233472,
    L2_cache_size=52_428_800, is_integrated=0, is_multi_gpu_board=0, gcnArchName="NVIDIA H100 80GB HBM3",
    uuid="00000000-0000-0000-0000-000000000000", pci_bus_id=0, pci_device_id=0, pci_domain_id=0,
)
# triton.runtime.driver.active.utils.get_device_properties(0) on the same card.
TRITON_PROPERTIES = {"max_shared_mem": 232448, "max_num_regs": 65536, "multiprocessor_count": 132, "warpSize": 32,
                     "sm_clock_rate": 1_980_000, "mem_clock_rate": 2_619_000, "mem_bus_width": 5120}

def describe(index: int = 0) -> str:
    """The current process's GPU `index` as JSON for a planner without a device to answer as (trusted side)."""
    import triton

    props = torch.cuda.get_device_properties(index)
    properties = {key: getattr(props, key, default) for key, default in vars(PROPERTIES).items()}
    properties["uuid"] = str(properties["uuid"])
    triton_properties = triton.runtime.driver.active.utils.get_device_properties(index)
    return json.dumps({"properties": properties, "triton": {key: triton_properties.get(key, value)
                                                           for key, value in TRITON_PROPERTIES.items()}})


def _answer_as(described: str) -> None:
    """Answer as the described GPU from now on (this module's constants rebound)."""
    global NAME, CAPABILITY, PROPERTIES
    gpu = json.loads(described)
    PROPERTIES = SimpleNamespace(**gpu["properties"])
    NAME, CAPABILITY = PROPERTIES.name, (PROPERTIES.major, PROPERTIES.minor)
    TRITON_PROPERTIES.update(gpu["triton"])


# Threads a block may have whatever its registers (255 a thread, allocated as 256): 65536 // 256.
MAX_THREADS_ANY_REGISTERS = 256

# Property reads reach a TorchFunctionMode as the getter's __get__; inside the mode, `t.device` is the real one.
_GETTERS = {torch._C.TensorBase.is_cuda: lambda t: t.device.type in ("cpu", "cuda"),
            torch._C.TensorBase.is_cpu: lambda t: False,
            torch._C.TensorBase.device: lambda t: CUDA0 if t.device.type == "cpu" else t.device}


def _host(device):
    """A device argument as the planner's tensors live: cuda (or a bare index, which means cuda) is the CPU."""
    if isinstance(device, int) and not isinstance(device, bool):
        return CPU
    if isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda":
        return CPU
    return device


class CudaOnCpu(TorchFunctionMode):
    """CPU tensors report cuda:0; devices named cuda in torch calls (`device="cuda"`, `.to("cuda")`, `.cuda()`) are
    the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        getter = _GETTERS.get(getattr(func, "__self__", None))
        if getter is not None and getattr(func, "__name__", "") == "__get__":
            return getter(args[0])
        if func is torch.Tensor.get_device:
            return 0 if args[0].device.type == "cpu" else func(*args, **kwargs)
        if func is torch.Tensor.cuda:
            return args[0]
        if "device" in kwargs:
            kwargs["device"] = _host(kwargs["device"])
        if func is torch.Tensor.to:
            args = tuple(_host(a) if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool) else a
                         for a in args)
        return func(*args, **kwargs)


class _Device(contextlib.AbstractContextManager):
    """torch.cuda.device(...) and device_of(tensor): selects the one GPU there is."""

    def __init__(self, device=None) -> None:
        self.idx = 0

    def __exit__(self, *exc) -> None:
        return None


class _Stream:
    """torch.cuda.current_stream(): the stream launches go to (Triton's driver answers 0 too); nothing runs here."""

    cuda_stream = 0
    device = CUDA0

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class _Utils:
    @staticmethod
    def get_device_properties(device=0) -> dict:
        return dict(TRITON_PROPERTIES)


class _Driver:
    """What Triton's CUDA driver answers about the current GPU (launches never reach it: the recorder takes them)."""

    utils = _Utils()

    def get_active_torch_device(self):
        return CUDA0

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device) -> None:
        return None

    def get_device_capability(self, device=0):
        return CAPABILITY

    def get_current_stream(self, device=0) -> int:
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", CAPABILITY[0] * 10 + CAPABILITY[1], 32)

    def get_device_interface(self):
        return torch.cuda

    def get_benchmarker(self):
        raise RuntimeError("no kernel is timed while planning on the CPU")


def install() -> None:
    """Answer CUDA probes as one H100 (or as $KLOOP_PLAN_GPU describes) from now on, in this process (a planner
    without a device)."""
    from triton.runtime.driver import driver

    if os.environ.get(PLAN_GPU_ENV):
        _answer_as(os.environ[PLAN_GPU_ENV])
        _compiled_kernels_without_a_device()
    cuda = torch.cuda
    cuda.is_available = lambda: True
    cuda.device_count = lambda: 1
    cuda.current_device = lambda: 0
    cuda.set_device = lambda device: None
    cuda.synchronize = lambda device=None: None
    cuda.get_device_properties = lambda device=None: PROPERTIES
    cuda.get_device_capability = lambda device=None: CAPABILITY
    cuda.get_device_name = lambda device=None: NAME
    cuda.mem_get_info = lambda device=None: (PROPERTIES.total_memory, PROPERTIES.total_memory)
    cuda.device = cuda.device_of = _Device
    cuda.current_stream = cuda.default_stream = lambda device=None: _Stream()
    # a CPU tensor that says it is on a GPU is no cuDNN operand: nn.LSTM/GRU/RNN, built or moved, flatten their weights
    # for cuDNN when it is, through the real device (with a CUDA build of torch and no device: "No CUDA GPUs")
    torch.backends.cudnn.is_acceptable = lambda tensor: False
    torch.version.cuda = "13.0"
    driver.set_active(_Driver())
    CudaOnCpu().__enter__()   # left on for the process's life: every later call of candidate code runs under it


def _compiled_kernels_without_a_device() -> None:
    """Triton's compiled kernels, which nothing here loads: `_init_handles` (Triton calls it before every launch)
    checks the kernel's shared memory and threads against the described GPU, as loading it would; `n_regs`,
    `n_spills` and `n_max_threads` (the tutorials read them) come from the cubin (cuobjdump), read once a kernel and
    only when asked: a launch of at most MAX_THREADS_ANY_REGISTERS threads fits whatever its registers."""
    from triton.compiler.compiler import CompiledKernel
    from triton.runtime.errors import OutOfResources

    from tools.assemble import cubin_resources

    def usage(self) -> dict:
        if "kloop_usage" not in self.__dict__:
            self.kloop_usage = (cubin_resources(self.kernel) or {}).get(self.name) or {}
        return self.kloop_usage

    def max_threads(self) -> int:
        registers = max(8, -(-(self.n_regs or 0) // 8) * 8)   # allocated per thread in units of 8
        return min(PROPERTIES.max_threads_per_block, TRITON_PROPERTIES["max_num_regs"] // registers // 32 * 32)

    def init_handles(self) -> None:
        max_shared = TRITON_PROPERTIES["max_shared_mem"]
        if self.metadata.shared > max_shared:
            raise OutOfResources(self.metadata.shared, max_shared, "shared memory")
        threads = self.metadata.num_warps * self.metadata.warp_size
        if threads > MAX_THREADS_ANY_REGISTERS and threads > self.n_max_threads:
            raise OutOfResources(threads, self.n_max_threads, "threads")

    CompiledKernel._init_handles = init_handles
    CompiledKernel.n_regs = property(lambda self: usage(self).get("registers"))
    CompiledKernel.n_spills = property(lambda self: usage(self).get("local_bytes", 0) // 4)
    CompiledKernel.n_max_threads = property(max_threads)
