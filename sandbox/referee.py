"""The referee: the reference model, the comparison, and the baselines' timings, in a trusted process of their own.

It makes the same inputs as the executor from the same seed (tools/inputs.py), computes the reference outputs,
and reads the candidate's outputs and inputs back from the executor (CUDA IPC views of the executor's memory, or
files the executor wrote where the evaluator told it to), checking sizes before reading anything. On a GPU it is a
separate process, so no kernel of a candidate ever shares a CUDA context with a reference output; on the CPU it
runs inside the evaluator.

    referee.shape("s0", target_source, overrides, init_seed)
    referee.time("eager", "s0", seed)          # timed like the executor times the candidate; keeps the output
    referee.check("s0", seed, outputs, inputs) # {"reasons": [...], "stats": {...}}
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from sandbox.plan import ITEMSIZE, PlanError, read_untrusted
from sandbox.process import is_cuda_failure
from tools import verify, weights
from tools.inputs import DEVICE, OWN, make_inputs
from tools.numerics import pin_numeric_flags
from tools.target import module_from_source, output_list
from tools.timing import flush_buffer, timed_call

# Reference outputs above this fraction of the GPU's memory are dropped while torch.compile's baseline makes its own
# (and computed again for the check): at KernelBench's full sizes a third set may not fit beside the executor's.
LARGE_FRACTION = 1 / 16
MOVED_SEED = 20261126   # the rounding steps of _moved_output: fixed, so a verdict is the same on every run


class Referee:
    def __init__(self) -> None:
        self.modules: dict[str, object] = {}
        self.models: dict[str, torch.nn.Module] = {}
        self.compiled: dict[tuple[str, str], object] = {}   # (shape, torch.compile mode) -> compiled model
        self.doubles: dict[str, torch.nn.Module] = {}   # shape -> the model in float64, for near misses
        self.held: dict[str, tuple[int, list, list]] = {}   # shape -> (seed, inputs, expected outputs)
        self.mapped: dict[tuple, torch.UntypedStorage] = {}   # stable IPC buffers, kept mapped until release
        self.mapped_inputs: set[tuple] = set()   # those of them that are the executor's inputs (a set it may free)
        self._transient: dict[tuple, torch.UntypedStorage] = {}   # the others, mapped for the check in progress
        self.counts: dict[str, dict] = {}   # shape -> roofline counts (they depend on the shape only)
        self.init_seeds: dict[str, int] = {}   # shape -> the seed its model's weights were made with
        self.module_names = itertools.count()   # each reference module a name of its own (it goes in sys.modules)
        self.cuda = DEVICE.type == "cuda"
        if self.cuda:
            self.flush = flush_buffer(DEVICE)

    def shape(self, shape: str, target_source: str, overrides: dict, init_seed: int, perturb: int | None = None,
              matched: list | None = None) -> dict:
        """The reference model at `shape`. perturb: a weights trial's seed; its constant entries and those the
        candidate holds as they are (`matched`, the planner's word: a lie only fails the candidate) are drawn at
        random (tools/weights.py)."""
        if shape in self.models and self.init_seeds[shape] != init_seed:
            # Another evaluation's secret seed: other weights. What was made from the old model goes with it.
            del self.models[shape]
            self.held.pop(shape, None), self.doubles.pop(shape, None)
            for key in [k for k in self.compiled if k[0] == shape]:
                del self.compiled[key]
        if shape not in self.models:
            self.init_seeds[shape] = init_seed
            module = module_from_source(target_source, overrides, f"kloop_reference_{next(self.module_names)}")
            torch.manual_seed(init_seed)
            init_inputs = module.get_init_inputs()
            torch.manual_seed(init_seed)
            # Left in training mode, as KernelBench runs it: BatchNorm normalizes with the batch's own statistics.
            self.modules[shape], self.models[shape] = module, module.Model(*init_inputs).to(DEVICE)
            if perturb is not None:
                weights.perturb_reference(self.models[shape], int(perturb), [str(n) for n in matched or []])
        return {"status": "ok"}

    def forget(self) -> dict:
        """Drop every shape (the next target's come next)."""
        self.modules.clear(), self.models.clear(), self.compiled.clear(), self.held.clear(), self.counts.clear()
        self.doubles.clear(), self.init_seeds.clear()
        self.mapped.clear(), self.mapped_inputs.clear()
        if self.cuda:
            torch.cuda.empty_cache()
        return {"status": "ok"}

    def release(self, deep: bool = True) -> dict:
        """Between candidates: unmap the executor's buffers, free the held inputs and outputs (the models stay for
        the same target's next); deep: and the allocator's cache."""
        self.held.clear()
        self.mapped.clear()
        self.mapped_inputs.clear()
        if self.cuda and deep:
            torch.cuda.empty_cache()
        return {"status": "ok"}

    # -- reference outputs ------------------------------------------------------------------------------------------
    def _inputs(self, shape: str, seed: int, family: str = OWN) -> list:
        held = self.held.get(shape)
        if held and held[0] == (seed, family):
            return held[1]
        # Another shape's set goes back to the device when it is freed: a smaller set carved out of its cached blocks
        # leaves them too small for the next full-size one, which then takes new ones. The same shape's next set
        # (and the baselines' outputs) take the freed blocks of the same sizes again: for 5-20 ms after a large free
        # to the driver every kernel on an H100 runs ~18% slower (tests/experiments/fresh_memory.py), which made the
        # baselines (and the candidate, when it came next) slower than they are.
        give_back = self.cuda and shape not in self.held
        held = None  # free the old set before making the new one (this name kept it alive too): two may not fit
        self.held.clear()
        if give_back:
            torch.cuda.empty_cache()
        inputs = make_inputs(self.modules[shape], seed, family)
        self.held[shape] = ((seed, family), inputs, [])
        return inputs

    def _expected(self, shape: str, seed: int, family: str = OWN) -> list:
        self._inputs(shape, seed, family)
        held = self.held[shape]
        if not held[2]:
            held[2].extend(output_list(self._on_inputs(shape, self.models[shape])))
        return held[2]

    def _on_inputs(self, shape: str, fn):
        """fn(*inputs) on the shape's held inputs, without grad (`_watched_inputs`)."""
        with self._watched_inputs(shape) as inputs, torch.no_grad():
            return fn(*inputs)

    @contextlib.contextmanager
    def _watched_inputs(self, shape: str):
        """The shape's held inputs, for a block that runs the reference on them. A reference that changed them in
        place (nn.ReLU(inplace=True); their version counters tell) gets ours made again from their seed after the
        block: the candidate's inputs are checked against ours bit for bit."""
        inputs = self.held[shape][1]
        before = _versions(inputs)
        yield inputs
        held = self.held.get(shape)
        if held is not None and held[1] is inputs and _versions(inputs) != before:
            seed, family = held[0]
            self.held[shape] = (held[0], make_inputs(self.modules[shape], seed, family), held[2])

    def expect(self, shape: str, seed: int) -> dict:
        outputs = self._expected(shape, seed)
        return {"status": "ok", "outputs": [{"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                                            for t in outputs]}

    def check(self, shape: str, seed: int, outputs: list, inputs: list, directory: str | None = None,
              family: str = OWN) -> dict:
        """Compare the candidate's outputs with the reference on this seed's inputs in `family` (tools/inputs.py),
        and its inputs with ours, bit for bit. The answer also has a `fingerprint` of the reference's outputs (do
        they depend on the inputs at all? A target whose outputs never change is degenerate). A family other than the target's
        own whose reference fails or is nowhere finite is `skipped` (it left the op's domain: log, sqrt,
        probabilities, a BCE loss), never held against the candidate."""
        try:
            return self._check(shape, seed, outputs, inputs, directory, family)
        finally:
            if self.cuda:
                self._release_unopened(outputs, inputs)

    def _release_unopened(self, outputs: list, inputs: list) -> None:
        """Map every storage handed over that this check did not map, then drop the check's transient mappings, and
        the stable mappings of inputs the executor has since replaced (until we drop them, it cannot free them: a
        full-size set would outlive its shape's turn beside the next one). Stable outputs stay mapped until
        `release`. The executor's shared blocks are reference-counted across processes, once per share: a storage
        never mapped, or mapped twice, would leave its count wrong, and its memory would never be freed (or freed
        while still mapped)."""
        current = set()
        for kind, descs in (("outputs", outputs), ("inputs", inputs)):
            for desc in descs:
                if isinstance(desc, dict) and "handle" in desc:
                    try:
                        key = self._key(desc)
                        self._storage(desc)
                    except Exception:  # a descriptor we cannot map was never counted for us either
                        continue
                    if kind == "inputs" and desc.get("stable"):
                        current.add(key)
        for key in self.mapped_inputs - current:
            self.mapped.pop(key, None)
        self.mapped_inputs = current
        self._transient.clear()

    @staticmethod
    def _key(desc: dict) -> tuple:
        return desc["device"], desc["handle"], desc["size"], desc["offset"]

    def _storage(self, desc: dict) -> torch.UntypedStorage:
        """The executor's storage behind an IPC description, mapped once per check (stable ones: until release)."""
        from sandbox.ipc import open_storage

        mapped = self.mapped if desc.get("stable") else self._transient
        key = self._key(desc)
        if key not in mapped:
            mapped[key] = open_storage(desc)
        return mapped[key]

    def _check(self, shape: str, seed: int, outputs: list, inputs: list, directory: str | None,
               family: str) -> dict:
        own = family == OWN
        try:
            expected = self._expected(shape, seed, family)
            if not own and self.cuda:  # a device-side assert on these inputs surfaces here, not in the next command
                torch.cuda.synchronize()
        except torch.OutOfMemoryError:
            raise
        except Exception as e:
            if own:
                raise
            # binary_cross_entropy refuses predictions outside [0, 1]: on a GPU with a device-side assert, after
            # which this process's CUDA context is gone (fatal: the evaluator starts another referee)
            return {"status": "ok", "reasons": [], "stats": {}, "skipped": f"the reference fails on {family} "
                    f"inputs: {type(e).__name__}: {str(e)[:200]}", "fatal": self.cuda and is_cuda_failure(e)}
        floating = [t for t in expected if t.is_floating_point()]
        if not own and floating and not any(_any_finite(t) for t in floating):
            return {"status": "ok", "reasons": [], "stats": {}, "skipped": f"the reference is nowhere finite on "
                    f"{family} inputs"}
        if len(outputs) != len(expected):
            return {"status": "ok", "reasons": [f"forward returned {len(outputs)} outputs, the reference returns "
                                                f"{len(expected)}"], "stats": {}}
        reasons, stats = [], {"max_abs_err": 0.0, "max_rel_err": 0.0, "norm_err": 0.0}
        for i, (desc, ref) in enumerate(zip(outputs, expected)):
            want = (str(ref.dtype).removeprefix("torch."), list(ref.shape))
            if (desc.get("dtype"), list(desc.get("shape") or [])) != want:  # before anything is read or mapped
                reasons.append(f"output {i} has dtype {desc.get('dtype')} and shape {tuple(desc.get('shape') or [])}, "
                               f"expected {want[0]} and {tuple(want[1])}")
                continue
            try:
                out = self._open(desc, directory)
            except (PlanError, ValueError, TypeError) as e:
                return {"status": "ok", "reasons": [f"output {i}: {e}"], "stats": stats}
            found, s = verify.compare(out, ref, i, to_scale=not own, masked=not own)
            if found and not s.get("nonfinite_off") and ref.is_floating_point() and ref.dtype != torch.float64:
                # a near miss, no NaN at stake (integers and bools are exact: there is nothing to judge again)
                found = self._judge_against_float64(shape, i, out, ref, s, found)
                if not found and "norm_err" in s.get("float64", {}):   # judged against the truth, not the reference
                    s["norm_err"] = s["float64"]["norm_err"]
            del out
            reasons += found
            for key in ("max_abs_err", "max_rel_err", "norm_err"):
                if s.get(key) is not None and math.isfinite(s[key]):
                    stats[key] = max(stats[key], s[key])
            if "worst" in s:
                stats["worst"] = s["worst"]
            if not found and s.get("float64", {}).get("chaotic"):
                stats["chaotic"] = True
        ours = self.held[shape][1]   # as made again, if a float64 reference above changed them
        for i, x in enumerate(ours):  # every input of ours, whatever the executor's answer lists
            if not isinstance(x, torch.Tensor):
                continue
            desc = inputs[i] if i < len(inputs) else None
            if not isinstance(desc, dict):
                reasons.append(f"input {i} was not handed over to be checked for changes")
                continue
            layout = dict(desc, dtype=str(x.dtype).removeprefix("torch."), shape=list(x.shape))
            try:
                seen = self._open(layout, directory, original=desc)
            except (PlanError, ValueError, TypeError) as e:
                return {"status": "ok", "reasons": [f"input {i}: {e}"], "stats": stats}
            if not verify.same_bits(seen, x):
                reasons.append(f"input {i} was modified by forward (inputs must be left unchanged)")
            del seen
        if self.cuda:  # nothing of ours still reads the executor's buffers when it is told to go on
            torch.cuda.synchronize()
        return {"status": "ok", "reasons": reasons, "stats": stats,
                "fingerprint": [verify.fingerprint(t) for t in expected]}

    def _judge_against_float64(self, shape: str, i: int, out: torch.Tensor, ref: torch.Tensor, stats: dict,
                               reasons: list[str]) -> list[str]:
        """Output i, outside either rule against the reference (tools/verify.py), judged against the reference
        computed in float64: no reasons when every element is within its tolerance of that, or no further from it
        than twice the reference there, or than verify.SENSITIVITY_FACTOR times the float32 reference's move under a
        rounding step of its inputs and weights (`_moved_output`), or than twice the largest of either among its
        verify.LOCAL_BLOCK neighbours, or the output is the reference's peer (verify.exchanged: as often beyond it as
        the reverse), and the output's relative L2 distance from it is within the dtype's norm floor,
        verify.NORM_REFERENCE_FACTOR times the reference's own, or SENSITIVITY_FACTOR times the moved reference's (an
        ill-conditioned op: LayerNorm of values near 1); else the reasons, with the distances. Where float64 does
        not fit or does not run, they stand."""
        exact = self._float64_output(shape, i, ref)
        if exact is None:
            return reasons
        moved = self._moved_output(shape, i, ref)
        found = []
        if stats.get("mismatches"):
            bad, own, theirs = verify.against_float64(out, ref, exact, stats["atol"], stats["rtol"], moved)
            stats["float64"] = {"elements_off": bad, "tolerances_off": own, "reference_tolerances_off": theirs}
            if bad:
                beyond_out, beyond_ref = verify.exchanged(out, ref, exact, stats["atol"], stats["rtol"])
                stats["float64"]["exchanged"] = [beyond_out, beyond_ref]
                # passed only as a chaotic op's peer: these inputs could not judge the counts (sandbox/stages/checks.py)
                stats["float64"]["chaotic"] = not verify.counts_within(beyond_out, beyond_ref, ref.numel())
                if not verify.a_peer_of_the_reference(beyond_out, beyond_ref, own, theirs, ref.numel()):
                    found.append(f"{reasons[0]}; against the reference computed in float64, {bad} elements are "
                                 f"further than their tolerance, twice the reference and "
                                 f"{verify.SENSITIVITY_FACTOR:g} times its move under a rounding step of the inputs "
                                 f"and weights, and twice the largest of those two among their {verify.LOCAL_BLOCK} "
                                 f"neighbours (up to {own:.3g} tolerances off, the reference's draws "
                                 f"{theirs:.3g}); judged both ways, {beyond_out} of its elements are beyond the "
                                 f"reference's noise and {beyond_ref} of the reference's beyond its")
        if stats.get("norm_off"):
            own, theirs = verify.norm_against_float64(out, ref, exact)
            # the op's own conditioning: how far rounding the inputs moves the reference, in the same measure
            sensitivity = verify.norm_against_float64(moved, ref, exact)[0] if moved is not None else 0.0
            allowed = max(stats["norm_floor"], verify.NORM_REFERENCE_FACTOR * theirs,
                          verify.SENSITIVITY_FACTOR * sensitivity)
            stats.setdefault("float64", {}).update(norm_err=own, reference_norm_err=theirs)
            if own > allowed:
                found.append(f"output {i}: off the reference computed in float64 by {own:.3g} of its norm (relative "
                             f"L2 error), where {str(ref.dtype).removeprefix('torch.')} arithmetic allows "
                             f"{stats['norm_floor']:.3g} and the reference itself is {theirs:.3g} off: coarser "
                             "arithmetic than the target's (lower-precision operands, an approximate function, a "
                             "skipped term)")
        del moved
        return found

    def _moved_output(self, shape: str, i: int, ref: torch.Tensor) -> torch.Tensor | None:
        """Output i of a copy of the reference (its own buffers stay as they were) with every floating-point element
        of the shape's inputs and of the copy's parameters and buffers moved by one rounding step, up or down at
        random (a fixed seed): how far rounding alone moves that output. The weights move too: where a bias
        dwarfs its layer's product (a convolution's on small inputs, then InstanceNorm), a step of the inputs
        changes no rounding after the bias is added, while an honest kernel adding it in another order rounds
        differently. Tensors of whole numbers (labels, counts, masks as floats) stay: a step down would change what
        they mean. None where it does not fit or does not run."""
        inputs = self.held[shape][1]
        moving = {id(x): x for x in inputs if _steppable(x)}
        model = self.models[shape]
        if not moving and not any(_steppable(t) for t in itertools.chain(model.parameters(), model.buffers())):
            return None

        def run():
            generator = torch.Generator(device=ref.device).manual_seed(MOVED_SEED)
            moved = [_stepped(x, generator) if id(x) in moving else x for x in inputs]
            copied = copy.deepcopy(model)
            for t in itertools.chain(copied.parameters(), copied.buffers()):
                if _steppable(t):
                    t.data = _stepped(t.data, generator)
            return copied(*moved)

        weights_bytes = sum(t.numel() * t.element_size() for t in itertools.chain(model.parameters(), model.buffers()))
        need = sum(x.numel() * x.element_size() for x in moving.values()) + weights_bytes + \
            2 * ref.numel() * ref.element_size()
        return self._another_run(shape, i, ref, need, run)

    def _float64_output(self, shape: str, i: int, ref: torch.Tensor) -> torch.Tensor | None:
        inputs = self.held[shape][1]

        def run():
            if shape not in self.doubles:
                self.doubles[shape] = copy.deepcopy(self.models[shape]).double()
            wide = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            return self.doubles[shape](*wide)   # a float64 input is its own wide copy: watched

        need = 8 * (sum(x.numel() for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point())
                    + 2 * ref.numel())
        return self._another_run(shape, i, ref, need, run)

    def _another_run(self, shape: str, i: int, ref: torch.Tensor, need: int, run) -> torch.Tensor | None:
        """Output i of `run()`, a run of the reference other than the trial's (in float64, on moved inputs), with
        the shape's inputs watched; None where twice `need` bytes are not free on the GPU, where it fails (out of
        memory, an op without float64, a reference that refuses the inputs), or where output i has another shape."""
        if self.cuda and 2 * need > torch.cuda.mem_get_info(DEVICE)[0]:
            return None
        try:
            with self._watched_inputs(shape), torch.no_grad():
                outputs = output_list(run())
        except Exception:
            if self.cuda:
                torch.cuda.empty_cache()
            return None
        out = outputs[i] if i < len(outputs) else None
        return out if isinstance(out, torch.Tensor) and tuple(out.shape) == tuple(ref.shape) else None

    def _open(self, desc: dict, directory: str | None, original: dict | None = None) -> torch.Tensor:
        dtype = desc.get("dtype")
        if dtype not in ITEMSIZE:
            raise ValueError(f"dtype {dtype!r} is not one kloop compares")
        if "handle" in desc:
            from sandbox.ipc import open_view

            return open_view(desc, self._storage(original or desc))
        shape = [int(s) for s in desc["shape"]]
        count = 1
        for s in shape:
            count *= s
        nbytes = count * ITEMSIZE[dtype]
        data = read_untrusted(Path(directory) / Path(desc["file"]).name, nbytes, exact=nbytes)
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
        t = raw.to(torch.bool) if dtype == "bool" else raw.view(getattr(torch, dtype))
        return t.reshape(shape).to(DEVICE)

    # -- baselines ------------------------------------------------------------------------------------------------
    def time(self, name: str, shape: str, seed: int, mode: str = "max-autotune-no-cudagraphs",
             family: str = OWN) -> dict:
        """One timed call of the reference (eager) or of torch.compile's version of it (in `mode`), on this seed's
        inputs in `family`."""
        inputs = self._inputs(shape, seed, family)
        expected = self.held[shape][2]
        if self.cuda and _large(expected):
            # a second full-size output beside it may not fit: eager's output takes its place (below); after a
            # compiled call the next check computes it again
            expected.clear()
        del expected
        fn = self.models[shape] if name == "eager" else self._compiled(shape, mode)
        # compiling ran the reference, which may have made the inputs again: the held ones are watched from here
        with self._watched_inputs(shape) as inputs, torch.no_grad():
            if not self.cuda:
                began = time.perf_counter()
                out = fn(*inputs)
                return {"status": "ok", "wall_ms": (time.perf_counter() - began) * 1e3}
            out, ms, wall_ms = timed_call(lambda: fn(*inputs), self.flush)
        held = self.held[shape]
        if name == "eager" and not held[2]:
            held[2].extend(output_list(out))  # eager's output is this round's reference: no second computation
        del out
        return {"status": "ok", "ms": ms, "wall_ms": wall_ms}

    def _compiled(self, shape: str, mode: str):
        if (shape, mode) not in self.compiled:
            compiled = torch.compile(self.models[shape], mode=mode)
            if self.cuda:  # compile and autotune now, then give back what autotuning's copies left in the cache
                self._on_inputs(shape, compiled)
                torch.cuda.empty_cache()
            self.compiled[shape, mode] = compiled
        return self.compiled[shape, mode]

    def roofline_counts(self, shape: str, seed: int) -> dict:
        if shape not in self.counts:
            self.counts[shape] = self._roofline_counts(shape, seed)
        return self.counts[shape]

    def _roofline_counts(self, shape: str, seed: int) -> dict:
        from tools.profile import count_bytes_and_flops

        outputs = self._expected(shape, seed)
        with self._watched_inputs(shape) as inputs:
            nbytes, flops = count_bytes_and_flops(self.models[shape], inputs, outputs)
        dtype = next((x.dtype for x in inputs if isinstance(x, torch.Tensor)), torch.float32)
        return {"status": "ok", "bytes": nbytes, "flops": flops, "dtype": str(dtype).removeprefix("torch."),
                "io_bytes": sum(x.untyped_storage().nbytes() for x in inputs if isinstance(x, torch.Tensor))
                + sum(t.untyped_storage().nbytes() for t in outputs)}

    def gpu(self) -> dict:
        from tools.profile import gpu_info

        return {"status": "ok", "gpu": gpu_info(DEVICE.index or 0) if self.cuda else None}


def _versions(values: list) -> list[int]:
    """The tensors' version counters: every in-place change of a tensor moves its own."""
    return [t._version for t in values if isinstance(t, torch.Tensor)]


def _nbytes(values: list) -> int:
    return sum(t.untyped_storage().nbytes() for t in values if isinstance(t, torch.Tensor))


def _large(values: list) -> bool:
    """More than LARGE_FRACTION of the GPU's memory."""
    return _nbytes(values) > torch.cuda.get_device_properties(DEVICE).total_memory * LARGE_FRACTION


def _any_finite(t: torch.Tensor) -> bool:
    return bool(any(torch.isfinite(part).any() for part in t.reshape(-1).split(verify.CHUNK)))


def _whole(x: torch.Tensor) -> bool:
    """Every element a whole number (or not finite), a slice at a time."""
    return all(torch.equal(part, part.round()) for part in x.reshape(-1).split(verify.CHUNK))


def _steppable(x) -> bool:
    """A tensor `_moved_output` moves: floating point, not all whole numbers."""
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.numel() > 0 and not _whole(x)


def _stepped(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """x with each element one rounding step up or down, at random."""
    step = torch.empty(x.shape, dtype=x.dtype, device=generator.device).bernoulli_(0.5, generator=generator)
    return step.mul_(2).sub_(1).mul_(torch.finfo(x.dtype).eps).add_(1).to(x.device).mul_(x)


COMMANDS = ("shape", "forget", "release", "expect", "check", "time", "roofline_counts", "gpu")


def main() -> None:
    """The referee as a process (GPU): JSON-line commands on stdin, replies on the control fd."""
    pin_numeric_flags()
    reply = os.fdopen(int(sys.argv[1]), "w", buffering=1)
    if DEVICE.type == "cuda":
        torch.zeros(1, device=DEVICE)
        if os.environ.get("KLOOP_REFEREE_WARM_UP"):
            warm_up()
    referee = Referee()
    reply.write(json.dumps({"status": "ready", "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
        except ValueError as e:
            cmd = {"cmd": f"unreadable: {e}"}
        if not isinstance(cmd, dict):
            cmd = {"cmd": f"not an object: {str(cmd)[:100]}"}
        if cmd.get("cmd") == "exit":
            break
        told = answer(referee, cmd)
        reply.write(json.dumps(told) + "\n")
        if told.get("fatal"):  # the CUDA context is gone: the evaluator starts another referee
            break
    reply.close()
    os._exit(0)


def warm_up() -> None:
    """The process's one-time costs, paid before it says it is ready rather than by the first candidate, which other
    candidates queue behind: a session starts its referees beside its planners' spares, which take longer (the
    device's first referee only: KLOOP_REFEREE_WARM_UP). The first FLOP count (FakeTensorMode and FlopCounterMode:
    1.8 s against 1 ms after, on a CPU; 5.1 s of the first candidate of an H100 run) and the first torch.compile
    (Dynamo, Inductor, Triton: 15 s against 2 s for the next model, on a CPU; the first candidate's baseline timing
    took 6.4 s on an H100, the next target's 1.7 s). On a GPU also the compile of the output check's first pass
    (tools/verify.py's kernel, specialized as for a float32 output of a multiple of 16 blocks). A failure here costs
    nothing but the head start."""
    from tools.profile import count_bytes_and_flops

    try:
        tiny = torch.nn.Linear(4, 4).to(DEVICE)
        x = torch.randn(2, 4, device=DEVICE)
        with torch.no_grad():
            count_bytes_and_flops(tiny, [x], [tiny(x)])
            torch.compile(lambda t: t * 2 + 1)(x)   # pointwise: no GEMM to autotune
            output = torch.randn(16 * verify.FUSED_BLOCK, device=DEVICE)
            verify.compare(output, output)
    except Exception:  # noqa: BLE001
        pass


def answer(referee: Referee, cmd: dict) -> dict:
    """One command's reply: the reference's own failures (an exception, running out of memory) become a status the
    evaluator reads, never an exception in its caller (on the CPU the referee runs inside the evaluator)."""
    cmd = dict(cmd)
    op = cmd.pop("cmd", None)
    try:
        if op not in COMMANDS:
            return {"status": "runtime_error", "message": f"unknown command {op!r}"}
        return getattr(referee, op)(**cmd)
    except torch.OutOfMemoryError as e:
        referee.held.clear()
        return {"status": "runtime_error", "message": f"out of memory in the reference: {str(e)[:300]}"}
    except Exception as e:
        return {"status": "error", "message": f"{type(e).__name__}: {str(e)[:2000]}",
                "traceback": traceback.format_exc(limit=-6)[-4000:], "fatal": referee.cuda and is_cuda_failure(e)}


if __name__ == "__main__":
    main()
