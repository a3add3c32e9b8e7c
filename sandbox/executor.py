"""The executor: replays launch plans on inputs it makes itself, and times them. Never imports candidate code.

On a GPU it is one long-lived trusted process per GPU. It loads each plan's kernels through Triton's own machinery
(the cache entry's cubin and metadata rebuilt into a `CompiledKernel`, launched by Triton's launcher) or through
CuPy for PTX (assembled here by ptxas), allocates the plan's buffers, and runs its steps on a stream of its own.
A kernel that takes the CUDA context down (an illegal address) ends the process; the evaluator starts another.

Without a GPU the kernels are Triton-language source run by Triton's interpreter, which is Python: then this
program runs jailed, fresh for each candidate, and only the kernel functions travel (checked by
tools.rules.check_jit_function, rebuilt into a module of our own making), never the candidate's module.

Commands (JSON lines in, JSON lines out on the control fd), see sandbox/evaluate.py for the caller:
    shape {shape, target_source, overrides}      the target module for one shape
    load {key, plan_dir, shape}                  a plan's kernels and buffers, its autotuned sites timed and chosen;
                                                 replies with kernel resources and the tuning
    inputs {shape, seed, family}                 fresh inputs for a shape (same seed, same bits as the referee's)
    run {key, timed, poison}                     poison the plan's allocations, run its steps (timed: cold L2, events)
    share {key, dir}                             outputs and inputs for the referee: IPC handles, or files in dir
    round {key, seed, family, timed, dir, poison}  inputs + run + share in one command (one round trip per trial)
    unload {key}
    release {deep}                               free the inputs (deep: and the allocator's cache)

On a GPU, small inputs are refreshed in place (new values from the seed, copied into the same buffers), so the
buffers the referee maps stay the same while the shape does: their IPC handles are made once (`stable` in the
description) and the referee keeps them mapped until it sees other inputs. Larger ones are freed before the next set
is made (two sets of a large shape at once would not fit beside the referee's), and described afresh each time.
"""
from __future__ import annotations

import ast
import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from sandbox import plan as planfmt
from sandbox.process import is_cuda_failure
from tools.inputs import DEVICE, OWN, make_inputs
from tools.numerics import pin_numeric_flags
from tools.target import module_from_source
from tools.timing import flush_buffer, timed_call

POISON = 0xFF                    # NaN bits in every float format (the evaluator alternates it with 0x00 by trial)

_NUMPY = {"i1": "int8", "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u1": "uint8", "u8": "uint8",
          "u16": "uint16", "u32": "uint32", "u64": "uint64", "fp16": "float16", "fp32": "float32", "f32": "float32",
          "fp64": "float64", "bf16": "float32"}


class ExecutorError(Exception):
    """A failure to report as a verdict; `fatal` when the CUDA context is unusable afterwards."""

    def __init__(self, status: str, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.status, self.fatal = status, fatal


class DevicePointer:
    """An address with `data_ptr()`, which Triton's launcher and its TMA descriptor code accept for a tensor."""

    def __init__(self, address: int) -> None:
        self.address = address

    def data_ptr(self) -> int:
        return self.address


class HostDescriptor:
    """The fields of triton.tools.tensor_descriptor.TensorDescriptor that Triton's launcher reads."""

    def __init__(self, base, shape, strides, block_shape, padding) -> None:
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, padding


def view(buffer: torch.Tensor, offset: int, dtype: str, shape: list[int], stride: list[int]) -> torch.Tensor:
    """A typed, strided view into a flat uint8 buffer (bounds were checked when the plan was loaded)."""
    torch_dtype = getattr(torch, dtype)
    itemsize = planfmt.ITEMSIZE[dtype]
    return torch.empty(0, dtype=torch_dtype, device=buffer.device).set_(
        buffer.untyped_storage(), buffer.storage_offset() // itemsize + offset // itemsize, shape, stride)


# Every buffer the executor makes for a plan (allocations, state, inputs) sits between two guard regions, filled with
# the trial's poison before each replay and checked after it: a store past either end is caught ("wrote past the end
# of allocation 0"), and a load past either end reads NaN bits (0xFF) or zeros, which shows in the outputs. Buffers
# start 512-byte aligned, as the caching allocator's do (Triton specializes on 16-byte alignment, TMA needs 16).
GUARD_BYTES = 1 << 18     # each side of each buffer
GUARD_BUDGET = 1 << 26    # of guard bytes per plan: a plan of many buffers gets smaller guards
GUARD_ALIGN = 512


class Guarded:
    """`nbytes` bytes (`inner`, a flat uint8 tensor) with `guard` bytes before and after, in one allocation."""

    def __init__(self, nbytes: int, guard: int, name: str) -> None:
        self.raw = torch.empty(nbytes + 2 * guard, dtype=torch.uint8, device=DEVICE)
        self.guard, self.name = guard, name
        self.inner = self.raw[guard:guard + nbytes]

    def poison(self, byte: int, whole: bool = False) -> None:
        """The guards (whole: and the inner bytes) filled with `byte`."""
        if whole:
            self.raw.fill_(byte)
            return
        self.raw[:self.guard].fill_(byte)
        self.raw[self.guard + self.inner.numel():].fill_(byte)

    def changed(self, byte: int) -> torch.Tensor:
        """A 0-d bool tensor (no host read): does either guard hold anything but `byte`?"""
        return (self.raw[:self.guard] != byte).any() | (self.raw[self.guard + self.inner.numel():] != byte).any()


def guard_bytes(buffers: int) -> int:
    return max(GUARD_ALIGN, min(GUARD_BYTES, GUARD_BUDGET // max(1, 2 * buffers)) // GUARD_ALIGN * GUARD_ALIGN)


def overruns(guarded: list[Guarded], byte: int) -> list[str]:
    """The names of the buffers whose guards a replay wrote (one host read)."""
    if not guarded:
        return []
    changed = torch.stack([g.changed(byte) for g in guarded]).tolist()
    return [g.name for g, bad in zip(guarded, changed) if bad]


class Loaded:
    """One plan made runnable here: its kernels, its allocations and its state (guarded buffers), and the state's
    bytes as recorded (`pristine`), restored before every replay: a kernel cannot keep anything from call to call in
    its module's parameters or buffers (a counter that computes on checked calls and skips the rest)."""

    def __init__(self, plan: planfmt.Plan, shape: str, kernels: list, allocs: list[Guarded], state: list[Guarded],
                 pristine: list[torch.Tensor]) -> None:
        self.plan, self.shape, self.kernels, self.allocs, self.state = plan, shape, kernels, allocs, state
        self.pristine = pristine
        self.choices = [0] * len(plan.sites())   # the option each autotuned site runs (Executor._tune)
        self.outputs: list[torch.Tensor] = []
        self.shared: list[dict] | None = None   # the outputs' IPC descriptions, made once (their buffers persist)


# Inputs up to this fraction of the GPU's memory are refreshed in place (two sets are briefly alive); larger ones
# are freed before the next set is made, and described afresh each time.
IN_PLACE_FRACTION = 1 / 64
PTX_ASSEMBLY_BUDGET_S = 60.0   # ptxas time for one candidate's PTX, all its shapes together
TUNE_RUNS = 3                  # timed replays per autotuned option (after one warm-up), their median compared
TUNE_SEED = 0                  # the inputs an autotuned plan is tuned on (then the trials draw their own)


class Executor:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.shapes: dict[str, object] = {}
        self.held: dict[str, list] = {}   # shape -> the inputs made last (one shape at a time), in guarded buffers
        self.held_guards: list[Guarded | None] = []   # per input: its guarded buffer (None: not a tensor)
        self.held_layout: list = []       # the inputs as make_inputs laid them out (what a refresh must match)
        self.held_shared: list | None = None  # their IPC descriptions while the buffers stay the same
        self.loaded: dict[str, Loaded] = {}
        self._modules = 0
        self.assembled: dict[str, object] = {}   # PTX text -> its Assembly, for the candidate in hand
        self.assembly_s = 0.0                    # ptxas time spent on the candidate in hand
        self.cuda = DEVICE.type == "cuda"
        if self.cuda:
            self.stream = torch.cuda.Stream()
            self.flush = flush_buffer(DEVICE)
            import triton

            triton.set_allocator(_no_scratch)  # global scratch comes from the plan's allocations only (_steps)

    # -- commands -------------------------------------------------------------------------------------------------
    def shape(self, shape: str, target_source: str, overrides: dict) -> dict:
        if shape not in self.shapes:  # the key is a hash of the source and the overrides
            self.shapes[shape] = module_from_source(target_source, overrides, f"kloop_target_{shape}")
        return {"status": "ok"}

    def load(self, key: str, plan_dir: str, shape: str) -> dict:
        plan = planfmt.load_plan(Path(plan_dir) / planfmt.PLAN_FILE)
        if any(k.kind == "ptx" for k in plan.kernels) and not self.cuda:
            return {"status": "not_run", "message": "no CUDA GPU: the PTX was assembled but cannot run here"}
        kernels = [self._kernel(k, plan) for k in plan.kernels]
        _constexprs_are_values(plan, kernels)
        guard = guard_bytes(len(plan.allocs) + len(plan.state))
        names = {o.ref.index: f"allocation {o.ref.index} (output {i})" for i, o in enumerate(plan.outputs)}
        allocs = [Guarded(n, guard, names.get(k, f"allocation {k}")) for k, n in enumerate(plan.allocs)]
        # The recorded state stays on the device where it fits easily beside its working copy, else in host memory
        # (each replay then copies it over the bus: slower, but it fits).
        state_bytes = sum(entry["nbytes"] for entry in plan.state)
        on_host = self.cuda and state_bytes > torch.cuda.mem_get_info(DEVICE)[0] / 4
        pristine = [self._state(plan, entry, torch.device("cpu") if on_host else DEVICE) for entry in plan.state]
        state = [Guarded(entry["nbytes"], guard, f"state {k}") for k, entry in enumerate(plan.state)]
        loaded = Loaded(plan, shape, kernels, allocs, state, pristine)
        loaded.outputs = [view(allocs[o.ref.index].inner, o.offset, o.dtype, o.shape, o.stride)
                          for o in plan.outputs]
        self.loaded[key] = loaded
        tuned = self._tune(key)
        reply = {"status": "ok", "resources": [self._resources(k, plan, kernel)
                                               for k, kernel in zip(plan.kernels, kernels)]}
        if isinstance(tuned, str):
            return {**reply, "overrun": tuned}
        return {**reply, "tuned": tuned} if tuned else reply   # only a GPU's (unjailed) executor tunes

    def _tune(self, key: str) -> list[dict] | str:
        """Triton's autotuning, done here under the executor's clock: each autotuned site's options (one per
        configuration) timed in a whole replay, TUNE_RUNS times after a warm-up, the others at their choice so far;
        the fastest median is kept. Without a GPU each option runs once, for its guards, and every site keeps its first
        (Triton's autotuner under the interpreter: every configuration ties, the first wins). A configuration that
        writes outside its memory is the candidate's bug, whichever is chosen: the overrun's words (a str)."""
        loaded = self.loaded[key]
        sites = loaded.plan.sites()
        if not sites:
            return []
        self.inputs(loaded.shape, TUNE_SEED)
        tuned = []
        for site, count in enumerate(sites):
            medians = []
            for option in range(count):
                loaded.choices[site] = option
                runs = [self.run(key, timed=self.cuda) for _ in range(TUNE_RUNS + 1 if self.cuda else 1)]
                overrun = next((r["overrun"] for r in runs if "overrun" in r), None)
                if overrun:
                    return f"configuration {option} of {count} of an autotuned launch {overrun}"
                if self.cuda:
                    medians.append(sorted(r["ms"] for r in runs[1:])[TUNE_RUNS // 2])
            loaded.choices[site] = medians.index(min(medians)) if self.cuda else 0
            if self.cuda:
                tuned.append({"site": site, "chosen": loaded.choices[site], "ms": medians})
        return tuned

    @staticmethod
    def _state(plan: planfmt.Plan, entry: dict, device: torch.device) -> torch.Tensor:
        """A state snapshot on `device`, filled a part at a time (host memory holds one part, not the whole): each
        part read straight into a host tensor (into the snapshot itself on the CPU)."""
        state = torch.empty(entry["nbytes"], dtype=torch.uint8, device=device)
        part = None if device.type == "cpu" else \
            torch.empty(min(entry["nbytes"], planfmt.STATE_PART_BYTES), dtype=torch.uint8)
        at = 0
        for name in entry["blobs"]:
            left = entry["nbytes"] - at
            host = state[at:] if part is None else part[:min(left, part.numel())]
            n = planfmt.read_untrusted_into(plan.blob_path(name), memoryview(host.numpy()))
            if part is not None and n:
                state[at:at + n].copy_(part[:n])
            at += n
        if at != entry["nbytes"]:
            raise planfmt.PlanError(f"the state's blobs hold {at} bytes, not its {entry['nbytes']}")
        return state

    def inputs(self, shape: str, seed: int, family: str = OWN) -> dict:
        old = self.held.get(shape)
        if old is not None and self.cuda and _bytes(old) <= self._in_place_limit():
            new = make_inputs(self.shapes[shape], seed, family)
            if _same_layout(self.held_layout, new):  # same buffers, new values: the referee's mappings stay valid
                for held, fresh in zip(old, new):
                    if isinstance(held, torch.Tensor):
                        held.copy_(fresh)
                old[:] = [h if isinstance(h, torch.Tensor) else f for h, f in zip(old, new)]
                torch.cuda.synchronize()  # made, not queued: the evaluator times this command
                return {"status": "ok"}
            del new
        another_shape = shape not in self.held
        old = None  # free the old set first (this name kept it alive too): at full size two may not fit
        self.held.clear()
        self.held_guards = []
        self.held_shared = None
        if self.cuda:
            torch.cuda.ipc_collect()  # shared blocks the referee has let go of are only freed here
            if another_shape:  # and give the freed blocks back: a smaller set (a hidden variant) carved out of a
                # cached full-size block leaves the rest too small for the next full-size one, which takes a second
                torch.cuda.empty_cache()
        fresh = make_inputs(self.shapes[shape], seed, family)
        self.held_layout = _layout(fresh)
        self.held[shape], self.held_guards = _guarded_inputs(fresh)
        del fresh
        if self.cuda:
            torch.cuda.synchronize()
        return {"status": "ok"}

    def _in_place_limit(self) -> float:
        if not hasattr(self, "_limit"):
            self._limit = torch.cuda.get_device_properties(DEVICE).total_memory * IN_PLACE_FRACTION
        return self._limit

    def round(self, key: str, seed: int, family: str = OWN, timed: bool = False, dir: str | None = None,
              poison: int = POISON) -> dict:
        """One trial or timed call: fresh inputs, a replay, and what the referee needs to check it."""
        self.inputs(self.loaded[key].shape, seed, family)
        ran = self.run(key, timed, poison)
        return {**self.share(key, dir), **{k: v for k, v in ran.items() if k != "status"}}

    def run(self, key: str, timed: bool = False, poison: int = POISON) -> dict:
        loaded = self.loaded[key]
        inputs = self.held[loaded.shape]
        self._check_inputs(loaded.plan, inputs)
        byte = int(poison) & 0xFF
        for buffer in loaded.allocs:  # no allocation may hold an old answer (or anything else) when forward starts
            buffer.poison(byte, whole=True)
        for buffer, recorded in zip(loaded.state, loaded.pristine):
            buffer.poison(byte)
            buffer.inner.copy_(recorded)
        guarded = loaded.allocs + loaded.state + [g for g in self.held_guards if g is not None]
        for g in self.held_guards:
            if g is not None:
                g.poison(byte)
        if not self.cuda:
            began = time.perf_counter()
            self._steps(loaded, inputs)
            return {"status": "ok", "wall_ms": (time.perf_counter() - began) * 1e3, **_overrun(guarded, byte)}
        with torch.cuda.stream(self.stream):
            _, ms, wall_ms = timed_call(lambda: self._steps(loaded, inputs), self.flush if timed else None)
        return {"status": "ok", "ms": ms, "wall_ms": wall_ms, **_overrun(guarded, byte)}

    def share(self, key: str, dir: str | None = None) -> dict:
        loaded = self.loaded[key]
        inputs = self.held[loaded.shape]
        if self.cuda:
            from sandbox.ipc import describe_all

            if loaded.shared is None:
                loaded.shared = describe_all(loaded.outputs, stable=True)
            stable = _bytes(inputs) <= self._in_place_limit()
            if self.held_shared is None or not stable:
                self.held_shared = describe_all(inputs, stable=stable)
            return {"status": "ok", "outputs": loaded.shared, "inputs": self.held_shared}
        files = {"outputs": [], "inputs": []}
        Path(dir).mkdir(exist_ok=True)
        for kind, tensors in (("outputs", loaded.outputs), ("inputs", inputs)):
            for i, t in enumerate(tensors):
                if not isinstance(t, torch.Tensor):
                    files[kind].append(None)
                    continue
                path = Path(dir) / f"{kind}-{i}.bin"
                raw = t.contiguous().view(-1).view(torch.uint8) if t.dtype != torch.bool else \
                    t.contiguous().view(-1).to(torch.uint8)
                raw.numpy().tofile(path)
                files[kind].append(path.name)
        return {"status": "ok", **files}

    def unload(self, key: str) -> dict:
        self.loaded.pop(key, None)
        return {"status": "ok"}

    def release(self, deep: bool = True) -> dict:
        """Between candidates: free the inputs; deep (another target next, or large inputs): and the allocator's
        cache, so the next target has the memory. The next candidate of the same target reuses the cached blocks."""
        self.held.clear()
        self.held_guards, self.held_layout = [], []
        self.held_shared = None
        self.assembled.clear()   # the next candidate's PTX budget starts afresh
        self.assembly_s = 0.0
        if self.cuda:
            torch.cuda.ipc_collect()  # shared blocks the referee has let go of
            if deep:
                torch.cuda.empty_cache()
        return {"status": "ok"}

    # -- kernels --------------------------------------------------------------------------------------------------
    def _kernel(self, k: planfmt.Kernel, plan: planfmt.Plan):
        if k.kind == "triton":
            return self._triton(k, plan)
        if k.kind == "ptx":
            assembly = self._assemble(k.ptx)
            if k.name not in assembly.kernels:
                raise ExecutorError("compile_error", f"PTX has no entry {k.name}")
            k.resources = assembly.kernels[k.name]
            return _ptx_function(assembly.cubin, k.name)
        return self._interpreted(k)

    def _assemble(self, ptx: str):
        """ptxas on a PTX text, once per candidate (its hidden shapes launch the same texts), within what is left of
        the candidate's PTX_ASSEMBLY_BUDGET_S."""
        from tools.assemble import PtxAssembleError, assemble_ptx

        if ptx not in self.assembled:
            left = PTX_ASSEMBLY_BUDGET_S - self.assembly_s
            if left <= 0:
                raise ExecutorError("compile_error", f"assembling the candidate's PTX took over "
                                    f"{PTX_ASSEMBLY_BUDGET_S:g} s")
            major, minor = torch.cuda.get_device_capability(DEVICE)
            began = time.perf_counter()
            try:
                self.assembled[ptx] = assemble_ptx(ptx, f"sm_{major}{minor}", timeout_s=left)
            except PtxAssembleError as e:
                raise ExecutorError("compile_error", str(e)) from None
            finally:
                self.assembly_s += time.perf_counter() - began
        return self.assembled[ptx]

    def _triton(self, k: planfmt.Kernel, plan: planfmt.Plan):
        from types import SimpleNamespace

        from triton.compiler.compiler import CompiledKernel

        group_dir = self.workdir / "kernels" / k.hash
        group_dir.mkdir(parents=True, exist_ok=True)
        metadata = group_dir / f"{k.name}.json"
        cubin = group_dir / f"{k.name}.cubin"
        metadata.write_text(json.dumps(k.metadata))
        cubin.write_bytes(planfmt.read_untrusted(plan.blob_path(k.blob), 1 << 30))
        src = SimpleNamespace(fn=SimpleNamespace(arg_names=k.arg_names), signature=k.signature, constants={})
        try:
            compiled = CompiledKernel(src, {metadata.name: str(metadata), cubin.name: str(cubin)}, k.hash)
            compiled._init_handles()
        except Exception as e:
            raise ExecutorError("runtime_error", f"Triton could not load kernel {k.name}: {type(e).__name__}: "
                                f"{str(e)[:300]}") from None
        return compiled

    def _interpreted(self, k: planfmt.Kernel):
        """The kernel and the jit functions it calls, rebuilt as a module of our own: checked sources, constants as
        literals, and only the modules a Triton kernel may name. The interpreter computes as compiled Triton does
        (sandbox/libdevice_cpu.gpu_numerics: bf16, tf32 dots, typed comparisons)."""
        from sandbox.libdevice_cpu import gpu_numerics
        from tools.rules import check_jit_function

        gpu_numerics()

        lines = ["import triton", "import triton.language", f"import sandbox.libdevice_cpu as {CPU_LIBDEVICE}"]
        checked: dict[str, ast.FunctionDef] = {}
        for alias, module in k.aliases.items():
            target = "sandbox.libdevice_cpu" if module == "triton.language.extra.libdevice" else module
            lines.append(f"import {target} as {alias}" if "." in target else f"import {target} as {alias}")
        for name, value in k.constants.items():
            lines.append(f"{name} = {_literal(value)}")
        for name, source in k.functions.items():
            reasons = check_jit_function(source, constants=set(k.constants), kernels=set(k.functions),
                                         aliases=k.aliases)
            if reasons:
                raise ExecutorError("rejected", f"kernel {name}: {reasons[0]}")
            tree = ast.parse(source)
            if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef) or tree.body[0].name != name:
                raise ExecutorError("rejected", f"the source of kernel {name} is not one function named {name}")
            tree.body[0].decorator_list = [ast.parse("triton.jit", mode="eval").body]
            _drop_docstrings(tree.body[0])
            tree = _LibdeviceChains(k.aliases).visit(tree)
            checked[name] = tree.body[0]
            lines.append(ast.unparse(tree))
        self._modules += 1
        path = self.workdir / "kernels" / f"{k.name}_{self._modules}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n\n".join(lines) + "\n")
        import importlib.util

        spec = importlib.util.spec_from_file_location(f"kloop_kernels_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        for name, fn in checked.items():
            if not _interpreter_reads(getattr(module, name), fn):
                raise ExecutorError("rejected", f"kernel {name}: the interpreter would not run the checked source")
        return getattr(module, k.name)

    def _resources(self, k: planfmt.Kernel, plan: planfmt.Plan, kernel) -> dict:
        launches = [s for s in plan.launches() if plan.kernels[s.kernel] is k]
        row = {"kernel": k.name, "launches": len(launches)}
        if k.kind == "triton":
            from tools.assemble import triton_kernel_resources

            row.update({key: v for key, v in triton_kernel_resources(kernel).items() if key not in ("ptx", "arch")})
        elif k.kind == "ptx":
            from tools.assemble import theoretical_occupancy

            usage = k.resources
            block = launches[0].block if launches else [1, 1, 1]
            dynamic = launches[0].shared if launches else 0
            threads, shared = block[0] * block[1] * block[2], usage["shared_bytes"] + dynamic
            try:
                occupancy = theoretical_occupancy(usage["registers"], shared, threads)
            except ValueError:  # a block no GPU launches: its launch says so
                occupancy = None
            row.update(source="ptxas", registers=usage["registers"], spills=usage["spill_stores_bytes"] // 4,
                       shared_bytes=shared, threads=threads, occupancy=occupancy)
        else:
            row["source"] = "triton-interpreter"
        return row

    # -- running --------------------------------------------------------------------------------------------------
    def _check_inputs(self, plan: planfmt.Plan, inputs: list) -> None:
        if len(inputs) != len(plan.inputs):
            raise ExecutorError("runtime_error", "the plan was made for another number of inputs")
        for i, (x, spec) in enumerate(zip(inputs, plan.inputs)):
            if spec.dtype is None:
                continue
            guarded = self.held_guards[i] if i < len(self.held_guards) else None
            if not isinstance(x, torch.Tensor) or guarded is None or \
                    str(x.dtype).removeprefix("torch.") != spec.dtype or list(x.shape) != spec.shape or \
                    list(x.stride()) != spec.stride or guarded.inner.numel() != spec.nbytes:
                raise ExecutorError("runtime_error", f"the plan was made for another input {i}")

    def _buffer(self, loaded: Loaded, inputs: list, ref: planfmt.Ref) -> torch.Tensor:
        if ref.kind == "input":   # its storage as make_inputs made it, inside its guards
            return self.held_guards[ref.index].inner
        return (loaded.allocs if ref.kind == "alloc" else loaded.state)[ref.index].inner

    def _address(self, loaded, inputs, p: planfmt.Pointer) -> int:
        return 0 if p.ref is None else self._buffer(loaded, inputs, p.ref).data_ptr() + p.offset

    def _steps(self, loaded: Loaded, inputs: list) -> None:
        for step in loaded.plan.steps:
            if isinstance(step, planfmt.Choose):
                for inner in step.options[loaded.choices[step.site]]:
                    self._step(loaded, inputs, inner)
            else:
                self._step(loaded, inputs, step)

    def _step(self, loaded: Loaded, inputs: list, step) -> None:
        plan = loaded.plan
        if isinstance(step, planfmt.Fill):
            view(self._buffer(loaded, inputs, step.ref), step.offset, step.dtype, step.shape,
                 step.stride).fill_(step.value)
            return
        kind = plan.kernels[step.kernel].kind
        kernel = loaded.kernels[step.kernel]
        if kind == "triton":
            args = [self._triton_arg(loaded, inputs, a) for a in step.args]
            if step.scratch is None:
                kernel[tuple(step.grid)](*args)
            else:  # Triton's launcher asks its allocator for global scratch: it gets the plan's allocation
                with _scratch_from(self._buffer(loaded, inputs, step.scratch)):
                    kernel[tuple(step.grid)](*args)
        elif kind == "ptx":
            from tools.launch import launch_function

            launch_function(kernel, tuple(step.grid), tuple(step.block),
                            [self._ptx_arg(loaded, inputs, a) for a in step.args], step.shared,
                            torch.cuda.current_stream())
        else:
            kernel[tuple(step.grid)](*[self._interpreted_arg(loaded, inputs, a, kernel) for a in step.args])

    def _triton_arg(self, loaded, inputs, a):
        if isinstance(a, tuple):
            return tuple(self._triton_arg(loaded, inputs, x) for x in a)
        if isinstance(a, planfmt.Pointer):
            return None if a.ref is None else self._address(loaded, inputs, a)
        if isinstance(a, planfmt.Scalar):
            return a.value
        if isinstance(a, planfmt.Descriptor):
            return HostDescriptor(DevicePointer(self._address(loaded, inputs, a.base)), a.shape, a.strides,
                                  a.block_shape, a.padding)
        return None  # constexpr: baked into the cubin, ignored by the launcher

    def _ptx_arg(self, loaded, inputs, a):
        import numpy as np

        if isinstance(a, planfmt.Pointer):
            return np.uint64(self._address(loaded, inputs, a))
        if isinstance(a, planfmt.Scalar):
            return getattr(np, _NUMPY[a.type])(a.value)
        raise ExecutorError("rejected", "a PTX launch argument must be a pointer or a scalar")

    def _interpreted_arg(self, loaded, inputs, a, kernel):
        if isinstance(a, tuple):
            return tuple(self._interpreted_arg(loaded, inputs, x, kernel) for x in a)
        if isinstance(a, planfmt.Pointer):
            if a.ref is None:
                return None
            buffer = self._buffer(loaded, inputs, a.ref)
            itemsize = planfmt.ITEMSIZE[a.dtype]
            count = max(0, (buffer.numel() - a.offset) // itemsize)
            return view(buffer, a.offset - a.offset % itemsize, a.dtype, [count], [1])
        if isinstance(a, planfmt.Scalar):
            from sandbox.libdevice_cpu import scalar_argument

            return scalar_argument(a.value, a.type)
        if isinstance(a, planfmt.Constexpr):
            if isinstance(a.value, str) and a.value.startswith(planfmt.JIT_CONSTEXPR):  # a rebuilt, checked function
                fn = kernel.fn.__globals__.get(a.value[len(planfmt.JIT_CONSTEXPR):])
                if fn is None or getattr(fn, "fn", None) is None or fn.fn.__globals__ is not kernel.fn.__globals__:
                    raise ExecutorError("rejected", f"constexpr {a.value!r} names no jit function of the kernel")
                return fn
            return _constexpr(a.value)
        if isinstance(a, planfmt.Descriptor):  # bounds were checked against the buffer when the plan was loaded
            from triton.tools.tensor_descriptor import TensorDescriptor

            base = self._interpreted_arg(loaded, inputs, a.base, kernel)
            return TensorDescriptor(base, a.shape, a.strides, a.block_shape, a.padding)
        raise ExecutorError("rejected", f"unknown argument {type(a).__name__}")


def _ptx_function(cubin: bytes, entry: str):
    """The entry of a module loaded for one plan: the Function keeps its Module alive, and both (with the module's
    .global memory) go when the plan is unloaded; nothing a candidate loaded outlives its evaluation."""
    import cupy

    with cupy.cuda.Device(DEVICE.index or 0):
        module = cupy.cuda.function.Module()
        module.load(cubin)
        return module.get_function(entry)


def _no_scratch(size: int, alignment: int, stream):
    raise ExecutorError("rejected", "a kernel asked for global scratch memory its plan does not provide")


@contextlib.contextmanager
def _scratch_from(buffer: torch.Tensor):
    """Triton's allocator, for one launch, serving a plan allocation (its size was checked against the kernel's
    metadata when the plan was loaded)."""
    import triton

    def allocate(size: int, alignment: int, stream):
        if size > buffer.numel() or buffer.data_ptr() % max(alignment, 1):
            raise ExecutorError("runtime_error", f"global scratch of {size} bytes (aligned to {alignment}) does not "
                                "fit the plan's allocation")
        return buffer

    triton.set_allocator(allocate)
    try:
        yield
    finally:
        triton.set_allocator(_no_scratch)


def _overrun(guarded: list[Guarded], byte: int) -> dict:
    """{"overrun": one line} when a replay wrote into a guard, else {}."""
    hit = overruns(guarded, byte)
    if not hit:
        return {}
    more = f" (and {len(hit) - 1} more)" if len(hit) > 1 else ""
    return {"overrun": f"wrote outside its memory: past an end of {hit[0]}{more}"}


def _guarded_inputs(inputs: list) -> tuple[list, list[Guarded | None]]:
    """The inputs copied into guarded buffers (views of one storage stay views of one buffer), and those buffers."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    guard = guard_bytes(len(tensors))
    by_storage: dict[int, Guarded] = {}
    out, guards = [], []
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            guards.append(None)
            continue
        storage = x.untyped_storage()
        g = by_storage.get(storage.data_ptr())
        if g is None:
            g = by_storage[storage.data_ptr()] = Guarded(storage.nbytes(), guard, f"input {i}")
            if storage.nbytes():
                g.inner.copy_(torch.empty(0, dtype=torch.uint8, device=x.device).set_(storage, 0,
                                                                                      (storage.nbytes(),), (1,)))
        out.append(torch.empty(0, dtype=x.dtype, device=x.device).set_(
            g.raw.untyped_storage(), g.guard // x.element_size() + x.storage_offset(), x.shape, x.stride()))
        guards.append(g)
    return out, guards


def _layout(tensors: list) -> list:
    return [(t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes())
            if isinstance(t, torch.Tensor) else type(t) for t in tensors]


def _bytes(tensors: list) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors if isinstance(t, torch.Tensor))


def _same_layout(old: list, new: list) -> bool:
    """Whether `new` has the layout `old` (from _layout) describes: tensor by tensor dtype, shape, strides, storage
    offset and size, the same places for what is no tensor."""
    return _layout(new) == old


CPU_LIBDEVICE = "_kloop_libdevice"   # the name the rebuilt module gives sandbox.libdevice_cpu


class _LibdeviceChains(ast.NodeTransformer):
    """`tl.extra.cuda.libdevice.erf` (libdevice reached through triton.language, which the rules allow) becomes
    sandbox.libdevice_cpu's erf: the interpreter cannot run the real libdevice."""

    PREFIXES = ("triton.language.extra.cuda.libdevice", "triton.language.extra.libdevice")

    def __init__(self, aliases: dict[str, str]) -> None:
        self.aliases = aliases

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        parts, base = [], node
        while isinstance(base, ast.Attribute):
            parts.insert(0, base.attr)
            base = base.value
        if isinstance(base, ast.Name) and base.id in self.aliases:
            dotted = ".".join([self.aliases[base.id], *parts])
            for prefix in self.PREFIXES:
                if dotted.startswith(prefix + "."):
                    *inner, last = dotted[len(prefix) + 1:].split(".")
                    value: ast.expr = ast.Name(CPU_LIBDEVICE, ast.Load())
                    for attr in inner:
                        value = ast.Attribute(value=value, attr=attr, ctx=ast.Load())
                    return ast.Attribute(value=value, attr=last, ctx=node.ctx)
        return self.generic_visit(node)


def _drop_docstrings(fn: ast.FunctionDef) -> None:
    """Remove the statements that are only a string (docstrings): they do nothing, and ast.unparse writes them over
    several lines, where Triton's interpreter looks for the function's `def` line by line (the last line starting
    with "def " wins), so a docstring could hand it code that was never checked."""
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and body and all(isinstance(s, ast.stmt) for s in body):
                kept = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                and isinstance(s.value.value, str))]
                body[:] = kept or [ast.Pass()]


def _interpreter_reads(kernel, checked: ast.FunctionDef) -> bool:
    """Whether Triton's interpreter, which re-reads a kernel's source from its file and compiles it from the last
    line that starts with "def " (triton.runtime.interpreter.FunctionRewriter), gets exactly the checked function."""
    import inspect
    import textwrap

    fn = getattr(kernel, "fn", kernel)
    try:
        lines, _ = inspect.getsourcelines(fn)
        start = max(i for i, line in enumerate(lines) if line.strip().startswith("def "))
        seen = ast.parse(textwrap.dedent("".join(lines[start:])))
    except (OSError, TypeError, ValueError, SyntaxError):
        return False
    if len(seen.body) != 1 or not isinstance(seen.body[0], ast.FunctionDef):
        return False
    expected = ast.FunctionDef(**{f: getattr(checked, f) for f in checked._fields})
    expected.decorator_list = []
    return ast.dump(seen.body[0]) == ast.dump(expected)


def _constexprs_are_values(plan: planfmt.Plan, kernels: list) -> None:
    """Triton's interpreter hands a tl.constexpr parameter its argument as it is: a tensor there would reach the
    kernel body as a torch.Tensor, whose methods (sum, softmax, ...) share names with Triton's. Numbers, dtypes and
    jit functions may fill those parameters; buffers may not (on a GPU Triton refuses a tensor constexpr too)."""
    from triton.runtime.interpreter import GridExecutor

    for step in plan.launches():
        if plan.kernels[step.kernel].kind != "interpreted":
            continue
        k, kernel = plan.kernels[step.kernel], kernels[step.kernel]
        constexprs = GridExecutor(kernel.fn, k.arg_names, tuple(step.grid)).constexprs
        for name, arg in zip(k.arg_names, step.args):
            if name in constexprs and _holds_buffer(arg):
                raise ExecutorError("rejected", f"kernel {k.name}: parameter {name} is a tl.constexpr, and was "
                                    "given a tensor")


def _holds_buffer(arg) -> bool:
    if isinstance(arg, tuple):
        return any(_holds_buffer(a) for a in arg)
    return isinstance(arg, (planfmt.Pointer, planfmt.Descriptor))


def _literal(value) -> str:
    if isinstance(value, str) and value.startswith("tl."):
        return f"triton.language.dtype({value[3:]!r})"
    if isinstance(value, float) and not math.isfinite(value):   # repr gives inf and nan, names no module defines
        return f"float({str(value)!r})"
    return repr(value)


def _constexpr(value):
    if isinstance(value, str) and value.startswith("tl."):
        import triton.language as tl

        return tl.dtype(value[3:])
    return value


def _is_interpreter_compile_failure(e: BaseException) -> bool:
    """Under the interpreter a kernel first meets its names when it runs: those errors are what Triton's compiler
    would have reported."""
    from triton.runtime.interpreter import InterpreterError

    return isinstance(e, InterpreterError) and isinstance(e.__cause__, (NameError, SyntaxError))


def serve(reply, workdir: Path) -> None:
    """Answer commands until stdin closes, `exit` comes, or the CUDA context is lost."""
    executor = Executor(workdir)
    for line in sys.stdin:
        fatal = False
        try:
            cmd = json.loads(line)
            op = cmd.pop("cmd")
            if op == "exit":
                break
            if op not in ("shape", "load", "inputs", "run", "share", "round", "unload", "release"):
                raise ExecutorError("runtime_error", f"unknown command {op!r}")
            answer = getattr(executor, op)(**cmd)
        except ExecutorError as e:
            answer, fatal = {"status": e.status, "message": str(e)}, e.fatal
        except planfmt.PlanError as e:
            answer = {"status": "rejected", "message": f"the launch plan is malformed: {e}"}
        except torch.OutOfMemoryError as e:
            executor.held.clear()
            answer = {"status": "runtime_error", "message": f"out of memory: {str(e).splitlines()[0][:300]}"}
        except BaseException as e:  # a kernel that crashed, or a bug of ours: report, and leave if CUDA is gone
            fatal = executor.cuda and is_cuda_failure(e)
            answer = {"status": "compile_error" if _is_interpreter_compile_failure(e) else "runtime_error",
                      "message": f"{type(e).__name__}: {str(e)[:2000]}",
                      "traceback": traceback.format_exc(limit=-6)[-4000:]}
        answer["fatal"] = fatal
        reply.write(json.dumps(answer) + "\n")
        if fatal:
            break


def profile_main(spec_path: str) -> None:
    """Standalone replay for Nsight Compute: load one plan, make inputs, run it a few times, exit."""
    import tempfile

    spec = json.loads(Path(spec_path).read_text())
    executor = Executor(Path(tempfile.mkdtemp(prefix="kloop-ncu-")))
    executor.shape("main", spec["target_source"], spec["overrides"])
    executor.load("main", spec["plan_dir"], "main")
    executor.inputs("main", spec["seed"])
    for _ in range(spec["calls"]):
        executor.run("main")


def main() -> None:
    """The long-lived executor of one GPU (trusted: it never runs candidate Python)."""
    pin_numeric_flags()
    if sys.argv[1] == "--profile":
        return profile_main(sys.argv[2])
    reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    if DEVICE.type == "cuda":
        torch.zeros(1, device=DEVICE)
    reply.write(json.dumps({"status": "ready"}) + "\n")
    serve(reply, Path(sys.argv[2]))
    reply.close()
    os._exit(0)


if __name__ == "__main__":
    main()
