"""Watching a candidate from inside its own process: which PyTorch ops its forward runs, which kernels it launches.

Installed before the candidate is imported, so the functions it relies on are bound first. This is the second line
of defence; the first is tools/rules.py (the candidate may not reach torch internals to undo any of this), and the
last is the trusted evaluator, which believes nothing from this process but the bytes of the output tensors.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Allocation, views and zero-filling are not the op's work; everything else in forward is PyTorch doing the work.
ALLOWED_OPS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "zero_", "fill_", "full", "full_like", "new_full", "view", "_unsafe_view", "as_strided", "t", "transpose",
    "permute", "expand", "squeeze", "unsqueeze", "select", "slice", "split", "split_with_sizes", "unbind", "narrow",
    "detach", "alias", "lift_fresh", "reshape", "flatten", "unflatten", "view_as", "expand_as", "is_contiguous",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "dim", "is_same_size",
    "_has_compatible_shallow_copy_type", "record_stream",
}
# Moving values from a tensor into another is work too (and item() would let Python compute the answer).
FORBIDDEN_OVERLOADS = {"aten.fill_.Tensor"}


class OpRecorder(TorchDispatchMode):
    """Records every aten op outside ALLOWED_OPS while active and not paused (kernel launches pause it)."""

    def __init__(self) -> None:
        super().__init__()
        self.forbidden: list[str] = []
        self.paused = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            name = func.overloadpacket.__name__
            if (name not in ALLOWED_OPS or str(func) in FORBIDDEN_OVERLOADS) and str(func) not in self.forbidden:
                self.forbidden.append(str(func))
        return func(*args, **(kwargs or {}))


class LaunchWatch:
    """Counts the candidate's kernel launches (Triton JIT, interpreter, PTX) and keeps Triton's compiled kernels."""

    def __init__(self) -> None:
        self.count = 0
        self.compiled: dict[str, object] = {}  # kernel name -> Triton CompiledKernel (GPU only)
        self.triton_names: set[str] = set()
        self.ptx_kernels: dict[str, object] = {}  # entry name -> PtxKernel
        self.recorder: OpRecorder | None = None

    @contextlib.contextmanager
    def _launching(self):
        self.count += 1
        if self.recorder is not None:
            self.recorder.paused += 1
        try:
            yield
        finally:
            if self.recorder is not None:
                self.recorder.paused -= 1

    def install(self) -> None:
        from triton.runtime import interpreter, jit

        watch = self
        for cls in (jit.JITFunction, interpreter.InterpretedFunction):
            original = cls.run

            def run(self, *args, grid, warmup, _original=original, **kwargs):
                if warmup:
                    return _original(self, *args, grid=grid, warmup=warmup, **kwargs)
                with watch._launching():
                    compiled = _original(self, *args, grid=grid, warmup=warmup, **kwargs)
                name = getattr(self, "__name__", None) or getattr(getattr(self, "fn", None), "__name__", "kernel")
                watch.triton_names.add(name)
                if compiled is not None and hasattr(compiled, "asm"):
                    watch.compiled[getattr(compiled, "name", name)] = compiled
                return compiled

            cls.run = run

        from tools import launch

        original_launch = launch.PtxKernel.launch

        def ptx_launch(kernel, *args, **kwargs):
            watch.ptx_kernels[kernel.name] = kernel
            with watch._launching():
                return original_launch(kernel, *args, **kwargs)

        launch.PtxKernel.launch = ptx_launch

    @contextlib.contextmanager
    def watching(self):
        """Record PyTorch ops and count launches for the duration of one forward call."""
        self.recorder = OpRecorder()
        start = self.count
        with self.recorder:
            yield self
        self.launches = self.count - start
        self.forbidden_ops = self.recorder.forbidden
        self.recorder = None


def flatten_outputs(out) -> list:
    """A forward returns a tensor or a tuple/list of tensors; anything else is reported as such."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _ranges_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


def output_problems(outputs: list, inputs: list, expected_device: torch.device) -> list[str]:
    """Type, device and aliasing checks on what forward returned (values are compared by the trusted side)."""
    problems = []
    for i, out in enumerate(outputs):
        if type(out) is not torch.Tensor:
            problems.append(f"output {i} is a {type(out).__module__}.{type(out).__qualname__}, not exactly torch.Tensor")
            continue
        if out.device.type != expected_device.type:
            problems.append(f"output {i} is on {out.device}, expected {expected_device.type}")
        for j, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and _ranges_overlap(out, x):
                problems.append(f"output {i} aliases input {j} (outputs must be fresh memory)")
        for k in range(i):
            if isinstance(outputs[k], torch.Tensor) and _ranges_overlap(out, outputs[k]):
                problems.append(f"output {i} aliases output {k}")
    return problems


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (NaNs included), for the check that inputs are unchanged by forward."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))) \
        if a.dtype != torch.bool else bool(torch.equal(a, b))


def poison_like(sizes: list[tuple[int, torch.device]]) -> None:
    """Fill freshly freed blocks with NaN bits so the next allocation of that size cannot hold an old answer."""
    blocks = [torch.empty(n, dtype=torch.uint8, device=dev) for n, dev in sizes]
    for block in blocks:
        block.fill_(0xFF)
    if blocks and blocks[0].is_cuda:
        torch.cuda.synchronize()


def poison_tensors(tensors: list) -> None:
    """Overwrite the whole storage of each tensor with NaN bits before it is freed."""
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.numel():
            raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
            raw.fill_(0xFF)
