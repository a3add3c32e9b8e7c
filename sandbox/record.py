"""Recording one `forward` call as a launch plan (sandbox/plan.py), inside the untrusted planner process.

While recording, kernel launches are captured instead of run: Triton's compiled launches at the launcher
(`CompiledKernel.run`, below autotuning and heuristics), Triton interpreter launches (CPU) and PtxKernel launches.
PyTorch ops go through a dispatch mode: allocations, zero-fills and views become plan steps; anything else is work
PyTorch would be doing, and reading tensor data on the host makes a plan impossible. Both are reported as reasons.

Nothing here is a defence: this code runs in the candidate's own process, which may undo any of it. It only has to
make honest candidates plannable and give early, readable reasons; the trusted executor runs the plan on its own
inputs and trusted code compares what comes out, so a plan that leaves work out is simply wrong.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import textwrap
import threading
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sandbox import plan as planfmt
from tools.inputs import DEVICE   # the real device, taken before the CPU planner answers CUDA probes as a GPU

ALLOC_OPS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
ZERO_OPS = {"zeros", "zeros_like", "new_zeros"}
FULL_OPS = {"full", "full_like", "new_full", "ones", "ones_like", "new_ones"}
FILL_OPS = {"zero_", "fill_"}
VIEW_OPS = {
    "view", "_unsafe_view", "as_strided", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze", "select",
    "slice", "split", "split_with_sizes", "unbind", "narrow", "detach", "alias", "lift_fresh", "reshape", "flatten",
    "unflatten", "view_as", "expand_as", "diagonal", "unfold", "movedim", "_reshape_alias", "numpy_T", "mT",
    "is_contiguous", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "dim",
    "is_same_size", "_has_compatible_shallow_copy_type", "record_stream",
}
HOST_READS = {"_local_scalar_dense", "item", "equal", "is_nonzero", "allclose"}


class PlanRefused(Exception):
    """This forward cannot become a plan; `status` is the verdict to report (rejected, incorrect)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Buffers:
    """Storages the plan knows, by base address: forward's inputs, its allocations, and pre-existing state."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir  # None: a recording only compared with the first, whose state bytes were kept
        self.by_base: dict[int, tuple[planfmt.Ref, object]] = {}
        self.inputs: list[dict] = []
        self.allocs: list[int] = []
        self.state: list[dict] = []
        self.keep: list = []  # storages referenced by the plan stay alive, so their addresses are never reused

    def add_inputs(self, inputs: list) -> None:
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                storage = x.untyped_storage()
                self.by_base.setdefault(storage.data_ptr(), (planfmt.Ref("input", i), storage))
                self.keep.append(storage)
                self.inputs.append({"dtype": _dtype_name(x.dtype), "shape": list(x.shape), "stride": list(x.stride()),
                                    "nbytes": storage.nbytes()})
            else:
                self.inputs.append({"dtype": None, "value": x if isinstance(x, (int, float, bool)) else None})

    def alloc(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        ref = planfmt.Ref("alloc", len(self.allocs))
        self.allocs.append(storage.nbytes())
        self.by_base[storage.data_ptr()] = (ref, storage)
        self.keep.append(storage)

    def ref_of(self, t: torch.Tensor) -> tuple[planfmt.Ref, int]:
        """The buffer holding tensor t and t's byte offset in it; memory the plan has not seen becomes state, its
        bytes snapshotted now (before this call changes them: kernels do not run while recording)."""
        storage = t.untyped_storage()
        base = storage.data_ptr()
        if base not in self.by_base:
            ref = planfmt.Ref("state", len(self.state))
            names = self._snapshot(storage, t.device, ref.index)
            self.state.append({"nbytes": storage.nbytes(), "blobs": names})
            self.by_base[base] = (ref, storage)
            self.keep.append(storage)
        ref, _ = self.by_base[base]
        return ref, t.data_ptr() - base

    def _snapshot(self, storage, device: torch.device, index: int) -> list[str]:
        """The storage's bytes as files of at most planfmt.state_part_bytes() each, copied a part at a time: a
        weight larger than the jail's file-size limit (a 32768 x 32768 fp32 Linear is 4 GiB) or than its memory
        limit still travels."""
        nbytes = storage.nbytes()
        step = planfmt.state_part_bytes()
        names = [f"state-{index}-{j}.bin" for j in range(max(1, -(-nbytes // step)))]
        if self.out_dir is not None:
            raw = torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (nbytes,), (1,))
            for j, name in enumerate(names):
                raw[j * step:(j + 1) * step].cpu().numpy().tofile(self.out_dir / name)
        return names

    def ref_of_address(self, address: int) -> tuple[planfmt.Ref, int] | None:
        for base, (ref, storage) in self.by_base.items():
            if base <= address <= base + storage.nbytes():
                return ref, address - base
        return None


class Recorder(TorchDispatchMode):
    """Active for one forward call: every op and launch on this thread becomes part of the plan or a reason."""

    def __init__(self, out_dir: Path | None, inputs: list) -> None:
        super().__init__()
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.buffers = _Buffers(self.out_dir)
        self.buffers.add_inputs(inputs)
        self.kernels: list[dict] = []
        self._kernel_index: dict[object, int] = {}
        self.steps: list[dict] = []
        self.forbidden: list[str] = []
        self.host_reads: list[str] = []
        self.input_writes: list[str] = []
        self.autotuned = False
        self.sites: dict[tuple, int] = {}   # (autotuner, key) -> its choose steps' site
        self.quiet = False  # set while the recorder's own bookkeeping runs torch ops

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No: TorchDispatchMode would wrap __torch_dispatch__ in torch._disable_dynamo, whose first call imports
        torch._dynamo (2 CPU-s of every planner's start), and no recording runs under Dynamo."""
        return False

    @contextlib.contextmanager
    def bookkeeping(self):
        saved, self.quiet = self.quiet, True
        try:
            yield
        finally:
            self.quiet = saved

    # -- PyTorch ops ------------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if HOOKS.autotuner_timing or self.quiet:  # Triton's autotuner clears caches with torch ops; so do we
            return func(*args, **kwargs)
        if name in FILL_OPS and (name == "zero_" or str(func) == "aten.fill_.Scalar"):
            self._fill(args[0], 0 if name == "zero_" else args[1])
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        if name in ALLOC_OPS | ZERO_OPS | FULL_OPS and isinstance(out, torch.Tensor):
            self.buffers.alloc(out)
            if name in ZERO_OPS or name in FULL_OPS:
                value = 0 if name in ZERO_OPS else (1 if "ones" in name else self._full_value(name, args, kwargs))
                self._fill(out, value)
        elif name in HOST_READS:
            self.host_reads.append(str(func))
        elif name not in VIEW_OPS and str(func) not in self.forbidden:
            self.forbidden.append(str(func))
        return out

    @staticmethod
    def _full_value(name, args, kwargs):
        value = kwargs.get("fill_value", args[1] if len(args) > 1 and name != "new_full" else
                           (args[2] if len(args) > 2 else None))
        if isinstance(value, torch.Tensor) or not isinstance(value, (int, float, bool)):
            raise PlanRefused("rejected", f"torch.{name} with a non-scalar fill value cannot become a plan")
        return value

    def _fill(self, t: torch.Tensor, value) -> None:
        if isinstance(value, torch.Tensor) or not isinstance(value, (int, float, bool)):
            self.forbidden.append("aten.fill_.Tensor")
            return
        with self.bookkeeping():
            ref, offset = self.buffers.ref_of(t)
        if ref.kind == "input":
            self.input_writes.append(f"forward writes into its input {ref.index} (inputs must be left unchanged)")
            return
        self.steps.append({"op": "fill", "ref": list(ref.key()), "offset": offset, "dtype": _dtype_name(t.dtype),
                           "shape": list(t.shape), "stride": list(t.stride()), "value": value})

    def site(self, key: tuple) -> int:
        return self.sites.setdefault(key, len(self.sites))

    # -- launches -------------------------------------------------------------------------------------------------
    def _kernel(self, key, make) -> int:
        if key not in self._kernel_index:
            self._kernel_index[key] = len(self.kernels)
            self.kernels.append(make())
        return self._kernel_index[key]

    def pointer(self, value, dtype: str = "uint8") -> dict:
        if value is None:
            return {"ref": None}
        if isinstance(value, torch.Tensor):
            where = value.untyped_storage().device   # not value.device, which the CPU planner makes answer cuda
            if where.type != DEVICE.type:
                raise PlanRefused("runtime_error", f"a kernel argument is a {where.type} tensor")
            with self.bookkeeping():
                ref, offset = self.buffers.ref_of(value)
            return {"ref": list(ref.key()), "offset": offset, "dtype": _dtype_name(value.dtype)}
        found = self.buffers.ref_of_address(int(value))
        if found is None:
            if int(value) == 0:
                return {"ref": None}
            raise PlanRefused("rejected", "a kernel argument is a raw address outside every tensor forward can "
                              "see; pass tensors (or pointers into them)")
        ref, offset = found
        return {"ref": list(ref.key()), "offset": offset, "dtype": dtype}

    def triton_launch(self, kernel, grid: tuple, args: tuple) -> None:
        """A launch through Triton's launcher: the compiled kernel, its grid and every argument (constexprs too)."""
        src = kernel.src
        arg_names = list(getattr(src.fn, "arg_names", []))
        signature = {str(k): str(v) for k, v in src.signature.items()}

        def make():
            import json

            metadata_file = kernel.metadata_group[f"{kernel.name}.json"]
            cubin = kernel.asm["cubin"]
            blob = f"kernel-{len(self.kernels)}.cubin"
            if self.out_dir is not None:
                (self.out_dir / blob).write_bytes(cubin)
            return {"kind": "triton", "name": kernel.name, "hash": kernel.hash,
                    "metadata": json.loads(Path(metadata_file).read_text()), "blob": blob, "blob_bytes": len(cubin),
                    "ptx": kernel.asm.get("ptx", ""), "signature": signature, "arg_names": arg_names,
                    "source": _source_of(src.fn)}

        index = self._kernel(("triton", kernel.hash), make)
        recorded = [self._triton_arg(value, signature.get(name, "constexpr")) for name, value in zip(arg_names, args)]
        step = {"op": "launch", "kernel": index, "grid": _grid3(grid), "args": recorded}
        scratch = self._global_scratch(kernel, step["grid"])
        if scratch is not None:
            step["scratch"] = list(scratch.key())
        self.steps.append(step)

    def _global_scratch(self, kernel, grid: list[int]) -> planfmt.Ref | None:
        """Triton's launcher asks its allocator for global scratch (device-side TMA descriptors live there) at each
        launch; in the plan it is an allocation of its own, which the trusted executor makes and poisons like any."""
        metadata = kernel.metadata
        if getattr(metadata, "profile_scratch_size", 0):
            raise PlanRefused("rejected", f"kernel {kernel.name} was built with profiling instrumentation (profile "
                              "scratch), which kloop does not replay")
        size = getattr(metadata, "global_scratch_size", 0)
        if not size:
            return None
        ref = planfmt.Ref("alloc", len(self.buffers.allocs))
        self.buffers.allocs.append(size * getattr(metadata, "num_ctas", 1) * grid[0] * grid[1] * grid[2])
        return ref

    def _triton_arg(self, value, ty):
        if isinstance(ty, tuple) or isinstance(value, tuple):
            types = ty if isinstance(ty, tuple) else (ty,) * len(value)
            return {"tuple": [self._triton_arg(v, t) for v, t in zip(value, types)]}
        if ty == "constexpr":
            return {"constexpr": _json_value(value)}
        if ty.startswith("*"):
            return {"ptr": self.pointer(value, _triton_elem(ty))}
        if ty.startswith("tensordesc"):
            return {"desc": self._descriptor(value)}
        if ty in planfmt.FLOAT_TYPES:
            return {"scalar": {"value": float(value), "type": ty}}
        return {"scalar": {"value": int(value), "type": ty}}

    def _descriptor(self, d) -> dict:
        """A host-side TensorDescriptor as the buffer its base lies in, plus its fields (never a raw address)."""
        if not isinstance(d.base, torch.Tensor):
            raise PlanRefused("rejected", "a tensor descriptor's base must be a tensor forward can see")
        return {"base": self.pointer(d.base), "shape": [int(s) for s in d.shape],
                "strides": [int(s) for s in d.strides], "block_shape": [int(s) for s in d.block_shape],
                "padding": str(getattr(d, "padding", "zero"))}

    def interpreted_launch(self, fn, grid, args: tuple, kwargs: dict) -> None:
        """A Triton interpreter launch (CPU): the kernel's source and what it refers to, its grid and arguments."""
        python_fn = fn.fn
        index = self._kernel(("interpreted", python_fn), lambda: _interpreted_kernel(python_fn))
        names = self.kernels[index]["arg_names"]
        call = inspect.signature(python_fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        call.apply_defaults()
        if callable(grid):
            from triton.runtime.interpreter import GridExecutor, _implicit_cvt

            constexprs = GridExecutor(python_fn, names, grid).constexprs
            meta = {k: v if k in constexprs else _implicit_cvt(v) for k, v in call.arguments.items()}
            grid = grid(meta)
        # Every parameter travels positionally, defaults applied: the executor calls the kernel the same way.
        recorded = [self._interpreted_arg(call.arguments[n], index) for n in names]
        self.steps.append({"op": "launch", "kernel": index, "grid": _grid3(grid), "args": recorded})

    def _interpreted_arg(self, value, index: int):
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction
        from triton.tools.tensor_descriptor import TensorDescriptor

        if isinstance(value, (InterpretedFunction, JITFunction)):
            # a jit function as a constexpr (ACT=gelu): its source travels with the kernel's, like a function it calls
            extra, kernel = _interpreted_kernel(value.fn), self.kernels[index]
            for field in ("functions", "constants", "aliases"):
                kernel[field] = {**extra[field], **kernel[field]}
            return {"constexpr": planfmt.JIT_CONSTEXPR + value.fn.__name__}
        if isinstance(value, torch.Tensor) or value is None:
            return {"ptr": self.pointer(value)}
        if isinstance(value, TensorDescriptor):
            return {"desc": self._descriptor(value)}
        if isinstance(value, bool):
            return {"scalar": {"value": value, "type": "i1"}}
        if isinstance(value, int):
            return {"scalar": {"value": value, "type": "i32" if -2**31 <= value < 2**31 else "i64"}}
        if isinstance(value, float):
            return {"scalar": {"value": value, "type": "fp32"}}
        return {"constexpr": _json_value(value)}

    def ptx_launch(self, kernel, grid, block, args, shared_mem: int) -> None:
        import numpy as np

        from tools.launch import _dims

        grid, block = _dims(grid, "grid"), _dims(block, "block")
        params = kernel._params or []
        if kernel._params is not None and len(args) != len(params):
            raise TypeError(f"{kernel.name} takes {len(params)} parameters, got {len(args)} arguments")
        index = self._kernel(("ptx", kernel.ptx, kernel.name),
                             lambda: {"kind": "ptx", "name": kernel.name, "ptx": kernel.ptx, "source": kernel.ptx})
        recorded = []
        for i, arg in enumerate(args):
            size = params[i][1] if i < len(params) else None
            if isinstance(arg, torch.Tensor) or arg is None:
                entry = {"ptr": self.pointer(arg)}
                width = 8
            else:
                value = arg if isinstance(arg, np.generic) else \
                    np.int32(arg) if isinstance(arg, int) and -2**31 <= arg < 2**31 else \
                    np.float32(arg) if isinstance(arg, float) else None
                if value is None:  # the same refusals PtxKernel.launch makes, with the same words
                    raise TypeError(f"argument {i} has type {type(arg).__name__} or does not fit in int32; pass a "
                                    "CUDA tensor, an int32, a float, None or a numpy scalar")
                ty = _NUMPY_TYPES.get(value.dtype.name)
                if ty is None:
                    raise TypeError(f"argument {i} has numpy type {value.dtype.name}, which a PTX launch cannot pass")
                width = value.nbytes
                if value.dtype in (np.uint64, np.int64) and self.buffers.ref_of_address(int(value)) is not None:
                    entry = {"ptr": self.pointer(int(value))}
                else:
                    entry = {"scalar": {"value": float(value) if ty in planfmt.FLOAT_TYPES else int(value),
                                        "type": ty}}
            if size is not None and size != width:
                raise TypeError(f"argument {i} is {width} bytes but the PTX parameter is {size} bytes; wrap it in "
                                "the matching numpy scalar")
            recorded.append(entry)
        self.steps.append({"op": "launch", "kernel": index, "grid": _grid3(grid), "block": _grid3(block),
                           "shared": int(shared_mem), "args": recorded})

    # -- the result -------------------------------------------------------------------------------------------------
    def finish(self, out) -> dict:
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        specs = []
        for i, t in enumerate(outputs):
            if type(t) is not torch.Tensor:
                raise PlanRefused("incorrect", f"output {i} is a {type(t).__module__}.{type(t).__qualname__}, not "
                                  "exactly torch.Tensor")
            with self.bookkeeping():
                ref, offset = self.buffers.ref_of(t)
            if ref.kind == "input":
                raise PlanRefused("incorrect", f"output {i} aliases input {ref.index} (outputs must be fresh memory)")
            if ref.kind == "state":
                raise PlanRefused("incorrect", f"output {i} is memory that outlives the call (a parameter or a cached "
                                  "buffer): allocate outputs in forward")
            specs.append({"ref": list(ref.key()), "offset": offset, "dtype": _dtype_name(t.dtype),
                          "shape": list(t.shape), "stride": list(t.stride())})
        return {"version": planfmt.VERSION, "inputs": self.buffers.inputs, "allocs": self.buffers.allocs,
                "state": self.buffers.state, "kernels": self.kernels, "steps": self.steps, "outputs": specs}

    def problems(self) -> tuple[str, str] | None:
        """(status, reason) when what forward did cannot be a plan."""
        if self.host_reads:
            return "rejected", ("forward read tensor data on the host (" + ", ".join(self.host_reads[:3]) + "): a "
                                "launch plan is replayed on other inputs, so it cannot depend on their values")
        if self.forbidden:
            return "rejected", ("ModelNew.forward computed with PyTorch ops: " + ", ".join(self.forbidden[:8])
                                + " (only allocation, views and zero-fill are allowed; the kernels do the work)")
        if self.input_writes:
            return "incorrect", self.input_writes[0]
        if not any(s["op"] in ("launch", "choose") for s in self.steps):
            return "rejected", ("no kernel of the candidate's was launched in forward (its own Triton or PTX kernels "
                                "must do the work)")
        return None


def comparable(plan: dict) -> dict:
    """A plan without the names of its files, to compare the plans of two calls."""
    return {**plan, "state": [s["nbytes"] for s in plan["state"]],
            "kernels": [{k: v for k, v in kernel.items() if k != "blob"} for kernel in plan["kernels"]]}


# -- launch interception, installed once per planner process before the candidate is imported -----------------------
class _Hooks(threading.local):
    recorder: Recorder | None = None
    autotuner_timing: bool = False   # Triton's autotuner is timing a config: its launches run


HOOKS = _Hooks()


def install() -> None:
    """Route every kernel launch through the recorder: while recording, launches are captured and not run; outside
    recording (the warm-up call that compiles), they are not run either. A planner without a device records every
    configuration of an autotuned launch (_every_configuration); one with a GPU lets Triton's autotuner time them."""
    from triton.compiler import compiler
    from triton.runtime import autotuner, interpreter

    from tools import launch

    run_property = compiler.CompiledKernel.run

    def launcher(kernel):
        def run(grid_0, grid_1, grid_2, stream, function, packed_metadata, launch_metadata, enter, exit_, *args):
            if HOOKS.autotuner_timing:
                return run_property.fget(kernel)(grid_0, grid_1, grid_2, stream, function, packed_metadata,
                                                 launch_metadata, enter, exit_, *args)
            if DEVICE.type == "cpu":  # compiled without a device (sandbox/cuda_probes.py): what loading would check
                kernel._init_handles()
            if HOOKS.recorder is not None:
                HOOKS.recorder.triton_launch(kernel, (grid_0, grid_1, grid_2), args)
        return run

    compiler.CompiledKernel.run = property(launcher)

    interpreted_run = interpreter.InterpretedFunction.run

    def run_interpreted(self, *args, grid, warmup, **kwargs):
        if warmup or HOOKS.autotuner_timing:
            return interpreted_run(self, *args, grid=grid, warmup=warmup, **kwargs)
        if HOOKS.recorder is not None:
            HOOKS.recorder.interpreted_launch(self, grid, args, kwargs)

    interpreter.InterpretedFunction.run = run_interpreted

    if DEVICE.type == "cpu":  # no device to time on: every configuration is recorded, the executor chooses
        autotuner.Autotuner.run = _every_configuration(autotuner.Autotuner.run)
    else:
        time_config = autotuner.Autotuner._bench

        def timed_config(self, *args, **kwargs):
            if HOOKS.recorder is not None:
                HOOKS.recorder.autotuned = True
            saved, HOOKS.autotuner_timing = HOOKS.autotuner_timing, True
            try:
                return time_config(self, *args, **kwargs)
            finally:
                HOOKS.autotuner_timing = saved

        autotuner.Autotuner._bench = timed_config

    def ptx_launch(kernel, grid, block, args, shared_mem: int = 0) -> None:
        if HOOKS.recorder is not None:  # recorded even without a GPU: the trusted side assembles and reports it
            HOOKS.recorder.ptx_launch(kernel, grid, block, args, shared_mem)

    launch.PtxKernel.launch = ptx_launch


def _config_failures() -> tuple:
    """The errors for which Triton's autotuner drops a configuration rather than fail."""
    from triton.compiler import errors as compile_errors
    from triton.runtime import errors as runtime_errors

    return tuple(e for e in (getattr(runtime_errors, "OutOfResources", None),
                             getattr(compile_errors, "CompileTimeAssertionFailure", None),
                             getattr(runtime_errors, "PTXASError", None)) if e is not None)


def _every_configuration(run):
    """Autotuner.run for a planner without a device: every configuration left after pruning is compiled and, while
    recording, launched into an option of one choose step (sandbox/plan.py), its pre-hook's fills included; the
    trusted executor times the options and picks. Launches of one autotuner at one key share their choice, as the
    autotuner's cache would make them. Configurations that fail to compile are dropped, as the autotuner drops them."""
    def every_configuration(self, *args, **kwargs):
        if len(self.configs) <= 1:
            return run(self, *args, **kwargs)
        self.nargs = dict(zip(self.arg_names, args))
        named = {k: v for k, v in {**self.nargs, **kwargs}.items() if k in self.arg_names}
        key = tuple([named[k] for k in self.keys if k in named] +
                    [str(v.dtype) for v in named.values() if hasattr(v, "dtype")])
        recorder, options, failure = HOOKS.recorder, [], None
        outer = recorder.steps if recorder is not None else None
        for config in self.prune_configs(kwargs):
            if recorder is not None:
                recorder.steps = []
            try:
                self.best_config = config
                if config.pre_hook is not None:
                    config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
                self.fn.run(*args, **kwargs, **config.all_kwargs())
                options.append(recorder.steps if recorder is not None else [])
            except _config_failures() as e:
                failure = e
            finally:
                if recorder is not None:
                    recorder.steps = outer
        self.nargs = None
        if not options:
            raise failure
        if recorder is not None:
            if len(options) == 1:
                outer.extend(options[0])
            else:
                outer.append({"op": "choose", "site": recorder.site((id(self), key)), "options": options})

    return every_configuration


@contextlib.contextmanager
def recording(out_dir: Path | None, inputs: list):
    recorder = Recorder(out_dir, inputs)
    HOOKS.recorder = recorder
    try:
        with recorder:
            yield recorder
    finally:
        HOOKS.recorder = None


# -- helpers ------------------------------------------------------------------------------------------------------
_NUMPY_TYPES = {"int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
                "uint32": "u32", "uint64": "u64", "float16": "fp16", "float32": "fp32", "float64": "fp64",
                "bool": "i1"}
def _triton_elem(ty: str) -> str:
    return planfmt.TRITON_DTYPES.get(ty.lstrip("*k"), "uint8")


def _grid3(grid) -> list[int]:
    dims = [int(g) for g in (tuple(grid) if isinstance(grid, (tuple, list)) else (grid,))]
    if not 1 <= len(dims) <= 3:
        raise PlanRefused("runtime_error", f"grid {tuple(dims)} must have 1 to 3 dimensions")
    if any(d < 1 for d in dims):
        raise PlanRefused("runtime_error", f"grid {tuple(dims)} has an empty dimension")
    return dims + [1] * (3 - len(dims))


def _json_value(value):
    """Constexpr values as JSON: numbers, strings, booleans, None; Triton dtypes as 'tl.<name>'."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    inner = getattr(value, "value", None)  # tl.constexpr
    if inner is not None and inner is not value:
        return _json_value(inner)
    name = getattr(value, "name", None)
    if name and type(value).__module__.startswith("triton.language"):
        return f"tl.{name}" if not name.startswith("tl.") else name
    if isinstance(value, (tuple, list)) and all(isinstance(v, (bool, int, float, str)) for v in value):
        return list(value)
    return repr(value)[:200]


def _source_of(fn) -> str:
    text = getattr(fn, "src", None)
    if isinstance(text, str):
        return text
    try:
        return textwrap.dedent(inspect.getsource(getattr(fn, "fn", fn)))
    except (OSError, TypeError):
        return ""


_MODULE_ALIASES = {"triton": "triton", "triton.language": "triton.language"}


def _interpreted_kernel(python_fn) -> dict:
    """The source of a kernel and of every jit function it calls, the module constants they read and the modules
    they name: what the trusted side checks and rebuilds into a module of its own (nothing else of the candidate's
    module travels)."""
    import builtins
    import types

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    functions: dict[str, str] = {}
    constants: dict[str, object] = {}
    aliases: dict[str, str] = {}
    pending = [python_fn]
    while pending:
        fn = pending.pop()
        if fn.__name__ in functions:
            continue
        source = textwrap.dedent(inspect.getsource(fn))
        functions[fn.__name__] = source
        tree = ast.parse(source).body[0]
        tree.decorator_list = []  # @triton.autotune(configs=...) is not the kernel: only its body and defaults travel
        local = {a.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
                 for a in node.args + node.kwonlyargs + node.posonlyargs}
        local |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        defaults = [d for d in tree.args.defaults + tree.args.kw_defaults if d is not None]
        in_defaults = {n.id for d in defaults for n in ast.walk(d) if isinstance(n, ast.Name)}
        renamed: dict[str, str] = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Name) or node.id in local:
                continue
            if node.id not in fn.__globals__:
                if not hasattr(builtins, node.id):  # what Triton's compiler reports on a GPU: a compile error
                    raise PlanRefused("compile_error", f"kernel {fn.__name__}: name {node.id!r} is not defined")
                continue
            value = fn.__globals__[node.id]
            if isinstance(value, (InterpretedFunction, JITFunction)):
                pending.append(value.fn)
            elif isinstance(value, types.ModuleType):
                module = value.__name__
                if module.startswith("triton.language.extra") and module.endswith("libdevice"):
                    module = "triton.language.extra.libdevice"
                if module not in _MODULE_ALIASES and module != "triton.language.extra.libdevice":
                    raise PlanRefused("rejected", f"kernel {fn.__name__} uses module {value.__name__}; a Triton kernel "
                                      "may only use triton, triton.language and libdevice")
                aliases[node.id] = module
            elif (path := _language_path(value)) is not None:
                renamed[node.id] = path   # `from ...libdevice import rsqrt`, `triton_tanh = libdevice.tanh`
            elif node.id not in ("range", "min", "max", "len", "int", "float", "bool", "print", "abs"):
                annotation = fn.__globals__.get("__annotations__", {}).get(node.id)
                if node.id not in in_defaults and not _constexpr_global(value) and not _constexpr_annotation(annotation):
                    # Triton's compiler refuses these (a module-level list a kernel could mutate, a plain int):
                    # the interpreter would read them, so the CPU refuses them as the GPU does.
                    raise PlanRefused("compile_error", f"kernel {fn.__name__}: cannot access global variable "
                                      f"{node.id} (a {type(value).__name__}): a Triton kernel reads only globals "
                                      f"made constexpr ({node.id} = tl.constexpr(...))")
                literal = _json_value(value)
                if isinstance(literal, str) and literal == repr(value)[:200] and not isinstance(value, str):
                    raise PlanRefused("rejected", f"kernel {fn.__name__} reads global {node.id}, a "
                                      f"{type(value).__name__}: kernels may only read constants")
                constants[node.id] = literal
        if renamed:  # the function travels with those names written out from the triton module
            aliases[TRITON_ROOT] = "triton"
            functions[fn.__name__] = ast.unparse(ast.fix_missing_locations(_Qualified(renamed).visit(tree)))
    names = list(inspect.signature(python_fn).parameters)
    return {"kind": "interpreted", "name": python_fn.__name__, "functions": functions, "constants": constants,
            "aliases": aliases, "arg_names": names, "source": functions[python_fn.__name__]}


def _constexpr_global(value) -> bool:
    """Whether Triton's compiler lets a kernel read this module global (CodeGenerator's global lookup)."""
    import triton.language as tl

    return isinstance(value, (tl.constexpr, tl.dtype)) or getattr(value, "__triton_builtin__", False) or \
        getattr(value, "__module__", "").startswith("triton.language")


def _constexpr_annotation(annotation) -> bool:
    """`SCALE: tl.constexpr = 1.0`: Triton's compiler reads a global annotated constexpr as a constexpr."""
    import triton.language as tl

    return annotation is tl.constexpr or (isinstance(annotation, str) and
                                          annotation.split(".")[-1] == "constexpr")


TRITON_ROOT = "kloop_triton"   # the name under which a kernel's Triton functions named by the module travel


def _language_path(value) -> str | None:
    """`triton.language.<...>.<name>` for a function of the Triton language that a module global names (Triton's
    compiler reads those as it reads tl.exp); None for anything else."""
    import importlib

    module, name = getattr(value, "__module__", None), getattr(value, "__name__", None)
    if not (callable(value) and isinstance(module, str) and isinstance(name, str)
            and module.startswith("triton.language")):
        return None
    for public in ("triton.language", "triton.language.math"):   # the modules the interpreter patches: tl.cast
        if getattr(importlib.import_module(public), name, None) is value:   # lives in triton.language.core, which
            return f"{public}.{name}"   # an interpreted kernel can leave patched (core.cast is then another object)
    try:
        if getattr(importlib.import_module(module), name, None) is not value:
            return None
    except ImportError:
        return None
    if module.startswith("triton.language.extra") and module.endswith("libdevice"):
        module = "triton.language.extra.libdevice"   # the executor binds that one to its CPU libdevice
    return f"{module}.{name}"


class _Qualified(ast.NodeTransformer):
    """Rewrites the names of Triton functions a kernel reads from its module (`rsqrt(x)`) as attribute chains from
    the triton module (`kloop_triton.language.extra.libdevice.rsqrt(x)`): the executor rebuilds and checks kernels
    from their own source, the triton modules and constants, never other module globals."""

    def __init__(self, renamed: dict[str, str]) -> None:
        self.renamed = renamed

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id not in self.renamed or not isinstance(node.ctx, ast.Load):
            return node
        value: ast.expr = ast.Name(TRITON_ROOT, ast.Load())
        for attr in self.renamed[node.id].split(".")[1:]:
            value = ast.Attribute(value=value, attr=attr, ctx=ast.Load())
        return ast.copy_location(value, node)
