"""Load a target: a KernelBench-style module (`Model`, `get_inputs()`, `get_init_inputs()`), built-in or by path.

A shape is a JSON-encodable dict of overrides of the target's module-level assignments, e.g. `{"batch_size": 64}`
(a dtype is written "torch.float16"). `module_from_source` re-executes the source with each overridden right-hand
side replaced, so constants derived at import (`input_shape = (num_classes,)`) follow; `{}` is the main shape.

Each target is checked at the main shape and at hidden variants (never shown to the agent), at full size on a GPU
or at CPU size (`small`) under the Triton interpreter. A target may fix them with module globals:
  KLOOP_SMALL           overrides for the CPU-sized problem,
  KLOOP_VARIANTS        the hidden full-size shapes,
  KLOOP_SMALL_VARIANTS  the hidden CPU-size shapes, each merged over KLOOP_SMALL,
  KLOOP_DESCRIPTION     one line that describes the op.
What is absent is derived:
  size constants, found statically in the source, are module-level ints (literals or literal arithmetic such as
    `1024 * 2`, also the elements of a literal int tuple such as `input_shape = (32768,)`) of at least 8 that
    get_inputs() reads, directly or through derived constants; a name read only by get_init_inputs()
    (out_features, kernel_size, a reduction dim) keeps its value in hidden variants;
  hidden variants set every size s to an odd number near s/3 (>= 9), then to a prime near s/5 (>= 11, never the
    odd one), so tails and non-power-of-two paths run; where a floor would grow the inputs past the main shape's
    (past SMALL_ELEMENTS at CPU size), the sizes it grows stay as they were;
  CPU sizes divide every size, those only get_init_inputs() reads too (an 8192-wide Linear would cost a CPU round
    its time limit), by one power of two (each stays >= 2, odd sizes stay odd) until the inputs hold at most
    SMALL_ELEMENTS elements; their hidden variants apply the odd and prime rules (>= 3, >= 5) to get_inputs' sizes.
Every derived shape must run the reference on the meta device (within MAX_META_OPS ops); where a shape fails, each
size in turn falls back to the nearest value above its goal that keeps a divisor of its working value (channels
stay divisible by groups, a conv input stays larger than its kernel), else keeps that value. A reference that fails
on meta at the main shape gets no hidden full-size variants, and its CPU sizes are checked on the CPU instead.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import linecache
import operator
import sys
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SMALL_ELEMENTS = 2**15  # input elements of a CPU-sized problem: a level-1 op evaluates in seconds when interpreted
MAX_META_OPS = 5000  # ops of one meta check (the largest level-3 CNNs take under 2000)
MIN_SIZE = 8  # smaller ints are counts (channels=3, num_layers=6), not sizes worth varying


class TargetError(Exception):
    """The target cannot be used; the message is one line for the user."""


@dataclass
class Target:
    name: str
    path: Path
    source: str
    module: ModuleType
    builtin: bool
    _modules: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _plans: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # Why no kernel can be told from a constant on this target (check_reference): its reference's output is
    # constant, or does not depend on its inputs. None when it does, or before check_reference ran.
    degenerate: str | None = field(default=None, init=False, compare=False)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def description(self) -> str:
        return getattr(self.module, "KLOOP_DESCRIPTION", "")

    def module_for(self, shape: dict) -> ModuleType:
        """The target's module re-executed at `shape` (cached; `{}` is the unmodified module)."""
        if not shape:
            return self.module
        key = json.dumps(shape, sort_keys=True)
        if key not in self._modules:
            name = f"kloop_target_{self.sha256[:12]}_{hashlib.sha256(key.encode()).hexdigest()[:8]}"
            self._modules[key] = module_from_source(self.source, shape, name)
        return self._modules[key]

    def shapes(self, small: bool) -> list[dict]:
        """The checked shapes: the main shape first, then the hidden variants."""
        return [dict(shape) for shape in self._plan(small)[0]]

    def io_bytes(self, small: bool) -> int:
        """Bytes of one set of inputs and the outputs at the main shape: get_inputs and the reference on the meta
        device (no memory, no kernels); twice the inputs where the reference has no meta version, 0 where even
        get_inputs fails there."""
        key = ("io_bytes", small)
        if key not in self._plans:
            try:
                self._plans[key] = _meta_io_bytes(self.module_for(self.shapes(small)[0]))
            except TargetError:
                self._plans[key] = 0
        return self._plans[key]

    def state_bytes(self, small: bool) -> int:
        """Bytes of the reference Model's parameters and buffers, the most over the checked shapes, counted on the meta
        device (no memory); 0 where the Model cannot be built there. A candidate holds about as much of its own."""
        key = ("state_bytes", small)
        if key not in self._plans:
            try:
                self._plans[key] = max(_meta_state_bytes(self.module_for(shape)) for shape in self.shapes(small))
            except TargetError:
                self._plans[key] = 0
        return self._plans[key]

    def state_shapes(self) -> list[list[tuple[int, ...]]] | None:
        """The sizes of the reference Model's parameters and buffers, in Model's order, at each checked shape, full
        size and CPU size (built on the meta device: no memory); None where the Model cannot be built there."""
        if "state_shapes" not in self._plans:
            models = self._meta_models()
            self._plans["state_shapes"] = None if models is None else [
                [tuple(t.shape) for t in [*model.parameters(), *model.buffers()]] for model in models]
        return self._plans["state_shapes"]

    def module_ints(self) -> list[dict[str, int]] | None:
        """The int attributes of the reference's own modules (`attn.n_head`: what its forward may read besides its
        tensors; torch.nn's modules keep the sizes their weights carry), at each checked shape, full size and CPU
        size, built on the meta device as state_shapes; None where the Model cannot be built there."""
        if "module_ints" not in self._plans:
            models = self._meta_models()
            self._plans["module_ints"] = None if models is None else [
                {f"{path}.{name}".lstrip("."): value for path, sub in model.named_modules()
                 if not type(sub).__module__.startswith("torch.")
                 for name, value in vars(sub).items() if type(value) is int} for model in models]
        return self._plans["module_ints"]

    def _meta_models(self) -> list | None:
        """The reference Model at each checked shape, full size then CPU size, built once on the meta device for
        state_shapes and module_ints; None where one cannot be built there."""
        if "meta_models" not in self._plans:
            shapes = self.shapes(small=False) + self.shapes(small=True)
            models = [_meta_model(self.module_for(shape)) for shape in shapes]
            self._plans["meta_models"] = None if any(model is None for model in models) else models
        return self._plans["meta_models"]

    def shape_note(self, small: bool) -> str:
        """One line on where shapes(small) came from."""
        return self._plan(small)[1]

    def describe_shape(self, shape: dict) -> str:
        """`batch_size=4096, dim=393216`: the size constants at `shape`, then its other overrides."""
        sizes = self._search.sizes
        parts = [f"{name}={_show(shape.get(name, value), value)}" for name, value in sizes.items()]
        parts += [f"{name}={value}" for name, value in shape.items() if name not in sizes]
        return ", ".join(parts) or "the sizes written in get_inputs()"

    @cached_property
    def _search(self) -> _ShapeSearch:
        return _ShapeSearch(self.source)

    def _plan(self, small: bool) -> tuple[list[dict], str]:
        if small not in self._plans:
            self._plans[small] = self._derive(small)
        return self._plans[small]

    def _derive(self, small: bool) -> tuple[list[dict], str]:
        extras, search = vars(self.module), self._search
        if not small:
            if "KLOOP_VARIANTS" in extras:
                return [{}] + [_jsonable(v) for v in extras["KLOOP_VARIANTS"]], "hidden variants from KLOOP_VARIANTS"
            variants, note = search.variants({}, small=False)
            return [{}] + variants, note
        if "KLOOP_SMALL" in extras:
            base, note = _jsonable(extras["KLOOP_SMALL"]), "sizes from KLOOP_SMALL"
        else:
            base, note = search.small_base()
        if "KLOOP_SMALL_VARIANTS" in extras:
            variants = [{**base, **_jsonable(v)} for v in extras["KLOOP_SMALL_VARIANTS"]]
            return [base] + variants, f"{note}; hidden variants from KLOOP_SMALL_VARIANTS"
        variants, variant_note = search.variants(base, small=True)
        return [base] + variants, note if variant_note == note else f"{note}; {variant_note}"


def module_from_source(source: str, overrides: dict, name: str = "kloop_target") -> ModuleType:
    """Execute a target's source as module `name`, with the right-hand side of each top-level assignment to a name
    in `overrides` replaced by that override's literal. Depends on nothing but its arguments, so every process
    builds the same module (and the same seeded inputs) from the same source and overrides."""
    tree = ast.parse(source)
    missing, body = set(overrides), []
    for stmt in tree.body:
        names = _assigned_names(stmt)
        if not any(n in overrides for n in names):
            body.append(stmt)
            continue
        missing -= set(names)
        for n in names:  # one statement per name, so `height = width = 128` can change height alone
            value = _literal(overrides[n], stmt.value) if n in overrides else stmt.value
            body.append(ast.copy_location(ast.Assign([ast.Name(n, ast.Store())], value), stmt))
    if missing:
        raise TargetError(f"the target has no module-level assignment to {', '.join(sorted(missing))} to override")
    tree.body = body
    filename = f"<{name}>"
    code = compile(ast.fix_missing_locations(tree), filename, "exec")
    module = ModuleType(name)
    sys.modules[name] = module  # dataclasses, pickle and typing look a class's module up by name
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show its lines
    exec(code, module.__dict__)
    return module


def load_target(spec: str) -> Target:
    """A built-in name (`vector_add`) or a path to a KernelBench-style module."""
    from tools.targets import BUILTIN_TARGETS, path_of

    builtin = spec in BUILTIN_TARGETS
    path = path_of(spec) if builtin else Path(spec)
    if not builtin and not path.is_file():
        known = ", ".join(BUILTIN_TARGETS)
        raise TargetError(f"unknown target {spec!r}: not a built-in ({known}) and no such file")
    source = path.read_text()
    try:
        module = module_from_source(source, {}, f"kloop_target_{hashlib.sha256(source.encode()).hexdigest()[:12]}")
    except Exception as e:
        raise TargetError(f"target {spec} failed to import: {type(e).__name__}: {e}") from None
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not callable(getattr(module, attr, None)):
            raise TargetError(f"target {spec} has no {attr}: a target defines Model, get_inputs() and get_init_inputs()")
    return Target(name=spec if builtin else path.stem, path=path.resolve(), source=source, module=module, builtin=builtin)



def _meta_io_bytes(module: ModuleType) -> int:
    nbytes = lambda xs: sum(x.untyped_storage().nbytes() for x in xs if isinstance(x, torch.Tensor))  # noqa: E731
    try:
        with torch.device("meta"):
            inputs = module.get_inputs()
    except Exception:
        return 0
    try:
        with torch.device("meta"), torch.no_grad():
            out = module.Model(*module.get_init_inputs())(*inputs)
        outputs = output_list(out)
    except Exception:
        return 2 * nbytes(inputs)
    return nbytes(inputs) + nbytes(outputs)


def _meta_model(module: ModuleType):
    """The target's Model built on the meta device (no memory), or None where it cannot be built there."""
    try:
        with torch.device("meta"):
            model = module.Model(*module.get_init_inputs())
    except Exception:
        return None
    return model if isinstance(model, torch.nn.Module) else None


def _meta_state_bytes(module: ModuleType) -> int:
    model = _meta_model(module)
    if model is None:
        return 0
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


def check_reference(target: Target) -> None:
    """A target whose own reference fails is the user's problem, said in one line (TargetError) before any candidate
    runs: its Model runs once at every checked shape (CPU sizes without a GPU), and twice at the main shape, where
    both calls must agree: a kernel is checked against a function of its inputs."""
    from tools.inputs import DEVICE

    for i, shape in enumerate(target.shapes(small=DEVICE.type != "cuda")):
        failure = _reference_failure(target, shape, twice=i == 0)
        if DEVICE.type == "cuda":  # at full size the run's tensors held tens of GB in kloop's own process for good
            torch.cuda.empty_cache()
        if failure:
            raise TargetError(f"target {target.name}: the reference fails at {shape or 'its main shape'}: {failure}")
    target.degenerate = _degenerate(target, target.shapes(small=True)[0])


DEGENERACY_FAMILIES = ("own", "signed", "positive", "large")   # enough to make an op that reads its inputs vary


def _degenerate(target: Target, shape: dict) -> str | None:
    """Whether the reference's outputs, on inputs of a few families (tools/inputs.py) at `shape` (a CPU size), are
    the same whatever the inputs (constant, like KernelBench level 2's 80): then a kernel that writes them without
    reading its inputs passes every check. On the CPU: a family outside the op's domain makes some references
    device-assert on a GPU (binary_cross_entropy), which would end this process's CUDA context."""
    from tools.inputs import RANDOM_STATE, make_inputs
    from tools.verify import fingerprint

    cpu = torch.device("cpu")
    module = target.module_for(shape)
    seen = []
    for seed, family in enumerate(DEGENERACY_FAMILIES):
        try:
            with RANDOM_STATE, torch.no_grad():
                model = module.Model(*module.get_init_inputs()).to(cpu)
                outputs = [t for t in output_list(model(*make_inputs(module, seed, family, cpu)))
                           if isinstance(t, torch.Tensor)]
        except Exception:  # noqa: BLE001  a family outside the op's domain says nothing here
            continue
        seen.append([fingerprint(t) for t in outputs])
        del model, outputs
    if len(seen) > 1 and all(f == seen[0] for f in seen):
        return "its reference's output is the same whatever its inputs: a kernel writing it without reading them passes"
    return None


def _reference_failure(target: Target, shape: dict, twice: bool = False) -> str | None:
    """Why the reference fails at `shape`, in one line; None when it runs. twice: it runs again on a copy of the
    same inputs (its random draws go on from where the first call left them) and must give the same outputs, within
    the evaluator's tolerances. Nothing it made outlives the call (an exception's frames would keep its tensors)."""
    from tools.inputs import DEVICE, RANDOM_STATE, make_inputs

    module = target.module_for(shape)
    try:
        with RANDOM_STATE, torch.no_grad():   # its weights' and its dropout's draws too
            model = module.Model(*module.get_init_inputs()).to(DEVICE)
            inputs = make_inputs(module, 0)
            # a copy, not inputs made again from the seed: that would seed the random state again, and a reference's
            # own draws (dropout) must go on from the first call's to be seen
            again = [_aside(x, copy=True) if isinstance(x, torch.Tensor) else x for x in inputs] if twice else None
            first = [_aside(t) for t in output_list(model(*inputs)) if isinstance(t, torch.Tensor)]
            del inputs
            differ = _disagreement(model, again, first) if twice else None
            del again, first
    except Exception as e:
        return f"{type(e).__name__}: {e}".splitlines()[0]
    if differ:
        return (f"two calls on the same inputs disagree ({differ}): it draws random numbers as it runs (dropout in "
                "training mode, torch.rand) or changes its own state, so no kernel can be checked against it")
    return None


def _disagreement(model, inputs: list, first: list[torch.Tensor]) -> str | None:
    """How a second call on `inputs` differs from the first's outputs; None when it agrees, or when it does not fit
    in memory beside them (then nothing is known)."""
    from tools.inputs import DEVICE
    from tools.verify import compare

    try:
        second = output_list(model(*[x.to(DEVICE) if isinstance(x, torch.Tensor) else x for x in inputs]))
    except torch.OutOfMemoryError:
        return None
    second = [t for t in second if isinstance(t, torch.Tensor)]
    return next((reason for a, b in zip(first, second) for reason in compare(b.to(a.device), a)[0]), None)


def output_list(out) -> list:
    """A forward's outputs as a list: a tuple's or list's items, else the one output (how the evaluator counts them)."""
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _aside(t: torch.Tensor, copy: bool = False) -> torch.Tensor:
    """t (a copy of it: copy), kept for a second call: on its GPU while twice its size is free there, else copied to
    host memory."""
    if t.is_cuda and torch.cuda.mem_get_info(t.device)[0] < 2 * t.untyped_storage().nbytes():
        return t.cpu()
    return t.clone() if copy else t


def shown_source(source: str) -> str:
    """The target as a policy sees it: the hidden shape variants (KLOOP_*VARIANTS) removed; they are checked, never
    shown."""
    lines = source.split("\n")
    for node in reversed(ast.parse(source).body):
        names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
        if any(name.startswith("KLOOP_") and name.endswith("VARIANTS") for name in names):
            del lines[node.lineno - 1:node.end_lineno]
    return "\n".join(lines)

# --- overrides -------------------------------------------------------------------------------------------------

def _assigned_names(stmt: ast.stmt) -> list[str]:
    """The names a top-level `NAME = ...`, `A = B = ...` or `NAME: T = ...` assigns; [] for other statements."""
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        return [t.id for t in stmt.targets]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return [stmt.target.id]
    return []


def _literal(value, original: ast.expr | None) -> ast.expr:
    """The expression for an override value; a list replaces a tuple as a tuple."""
    dtype = value[6:] if isinstance(value, str) and value.startswith("torch.") else None
    if dtype and isinstance(getattr(torch, dtype, None), torch.dtype):
        return ast.Attribute(ast.Name("torch", ast.Load()), dtype, ast.Load())
    if isinstance(value, list):
        items = [_literal(v, None) for v in value]
        return ast.Tuple(items, ast.Load()) if isinstance(original, ast.Tuple) else ast.List(items, ast.Load())
    if value is None or isinstance(value, (bool, int, float, str)):
        return ast.Constant(value)
    raise TargetError(f"shape override {value!r} is not JSON: ints, floats, bools, strings, lists ('torch.float16')")


def _jsonable(shape: dict) -> dict:
    """A KLOOP_* shape as JSON values: tuples become lists, dtypes their 'torch.float16' names."""
    def encode(v):
        if isinstance(v, torch.dtype):
            return str(v)
        return [encode(x) for x in v] if isinstance(v, (list, tuple)) else v
    return {k: encode(v) for k, v in shape.items()}


def _show(value, written) -> str:
    return str(value) if isinstance(written, int) else repr(type(written)(value))


# --- size constants --------------------------------------------------------------------------------------------

_INT_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
            ast.Mod: operator.mod, ast.Pow: operator.pow, ast.LShift: operator.lshift}


def _int_of(node: ast.expr) -> int | None:
    """The value of an int literal or of int arithmetic on literals (`1024 * 2`, `2**26`), else None."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _int_of(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and type(node.op) in _INT_OPS:
        a, b = _int_of(node.left), _int_of(node.right)
        big_exponent = isinstance(node.op, (ast.Pow, ast.LShift)) and not 0 <= (b or 0) <= 64
        if a is None or b is None or big_exponent or (b == 0 and isinstance(node.op, (ast.FloorDiv, ast.Mod))):
            return None
        return _INT_OPS[type(node.op)](a, b)
    return None


def _reads(node: ast.AST) -> set[str]:
    """Names a definition reads; a function's own locals and arguments are not module names."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(node, ast.FunctionDef):
        names -= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        names -= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    return names


def size_constants(source: str, reader: str = "get_inputs") -> dict:
    """Name -> value as written (an int, or a tuple/list of ints) of the constants that size `reader`'s result."""
    tree = ast.parse(source)
    defs: dict[str, ast.AST] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef):
            defs[stmt.name] = stmt
        defs.update((name, stmt.value) for name in _assigned_names(stmt))
    read, todo = set(), [reader]
    while todo:  # the reader, then the derived constants and helpers it reads, transitively
        name = todo.pop()
        if name in defs and name not in read:
            read.add(name)
            todo.extend(_reads(defs[name]))
    sizes = {}
    for name, node in defs.items():
        if name not in read:
            continue
        if (value := _int_of(node)) is not None and value >= MIN_SIZE:
            sizes[name] = value
        elif isinstance(node, (ast.Tuple, ast.List)) and node.elts:
            items = [_int_of(e) for e in node.elts]
            if None not in items and max(items) >= MIN_SIZE:
                sizes[name] = (tuple if isinstance(node, ast.Tuple) else list)(items)
    return sizes


# --- derivation ------------------------------------------------------------------------------------------------

def _shrink(s: int, factor: int) -> int:
    v = max(2, round(s / factor))
    return v + 1 if s % 2 and not v % 2 else v  # an odd size keeps its ragged tail


def _odd(s: int, floor: int) -> int:
    return max(floor, round(s / 3)) | 1


def _prime(s: int, floor: int, odd: int) -> int:
    n = max(floor, round(s / 5))
    while n == odd or any(n % d == 0 for d in range(2, int(n**0.5) + 1)):  # never the odd variant's size again
        n += 1
    return n


def _fallbacks(start: int, goal: int) -> list[int]:
    """Values to try for a size that should go from `start` to `goal`: the goal, then the values above it that keep
    a divisor of `start` (whatever divisibility the op needs, the working value has), then `start`."""
    if goal >= start:
        return [goal, start]
    divisors = {d for i in range(2, int(start**0.5) + 1) if start % i == 0 for d in (i, start // i)}
    above = sorted({-(-goal // d) * d for d in divisors} - {goal, start})
    return [goal, *(v for v in above if v < start), start]


class _OpBudget(TorchDispatchMode):
    """Stops a meta run past MAX_META_OPS ops: meta tensors cost no memory, but an RNN unrolled over a long sequence
    costs Python time per op (half a millisecond each), and a check must stay cheap."""

    def __init__(self):
        super().__init__()
        self.left = MAX_META_OPS

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.left -= 1
        if self.left < 0:
            raise RuntimeError(f"over {MAX_META_OPS} ops on the meta device")
        return func(*args, **(kwargs or {}))


class _ShapeSearch:
    """Derives the shapes of one source; every candidate runs the reference on the meta device (or on the CPU)."""

    def __init__(self, source: str):
        self.source = source
        self.sizes = size_constants(source)
        # Sizes only the constructor reads (out_features = 8192): CPU sizes divide them too, variants keep them.
        self.init_sizes = {name: value for name, value in size_constants(source, "get_init_inputs").items()
                           if name not in self.sizes}
        # One slot per size: (name, None) for an int, (name, index) for an element of an int tuple.
        self.main, self.init_main = self._slots(self.sizes), self._slots(self.init_sizes)
        self._probes: dict[tuple, int | None] = {}

    @staticmethod
    def _slots(sizes: dict) -> dict:
        slots = {}
        for name, value in sizes.items():
            items = [(None, value)] if isinstance(value, int) else enumerate(value)
            slots.update(((name, i), v) for i, v in items if v >= MIN_SIZE)
        return slots

    @cached_property
    def device(self) -> str | None:
        """Where candidates are checked: meta if the main shape runs there, the CPU if only get_inputs does."""
        if self._probe({}, "meta", forward=True) is not None:
            return "meta"
        return "cpu" if self._elements({}) is not None else None

    def _shape(self, base: dict, values: dict) -> dict:
        shape = dict(base)
        for (name, i), v in values.items():
            if i is None:
                shape[name] = v
            else:  # a fresh list: `base` may hold this tuple's list
                shape[name] = list(shape.get(name, {**self.init_sizes, **self.sizes}[name]))
                shape[name][i] = v
        return shape

    def _values_at(self, shape: dict) -> dict:
        values = {}
        for name, i in self.main:
            value = shape.get(name, self.sizes[name])
            values[(name, i)] = value if i is None else value[i]
        return values

    def _elements(self, shape: dict) -> int | None:
        """The input elements at `shape` (get_inputs on the meta device), None where get_inputs fails."""
        return self._probe(shape, "meta", forward=False)

    def _runs(self, shape: dict) -> bool:
        return self._probe(shape, self.device, forward=True) is not None

    def _probe(self, shape: dict, device: str, forward: bool) -> int | None:
        key = (json.dumps(shape, sort_keys=True), device, forward)
        if key not in self._probes:
            self._probes[key] = self._run(shape, device, forward)
        return self._probes[key]

    def _run(self, shape: dict, device: str, forward: bool) -> int | None:
        """Input elements if get_inputs (and with `forward` the reference) runs at `shape` on `device`, else None."""
        from tools.inputs import RANDOM_STATE   # its draws land in torch's random state, which fork_rng then restores

        elements = self._elements(shape) if forward else None
        if forward and (elements is None or device == "cpu" and elements > 4 * SMALL_ELEMENTS):
            return None  # the CPU checks tiny shapes only
        budget = _OpBudget() if device == "meta" else contextlib.nullcontext()
        with RANDOM_STATE, warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.no_grad():
            warnings.simplefilter("ignore")
            try:
                module = module_from_source(self.source, shape, "kloop_shape_probe")
                with torch.device(device):
                    inputs = module.get_inputs()
                    if forward:
                        with budget:
                            module.Model(*module.get_init_inputs())(*inputs)
            except Exception:
                return None
        return elements if forward else sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))

    def _fit(self, base: dict, start: dict, goal: dict) -> dict | None:
        """Slot values as close to `goal` as the reference allows, starting from the working `start`."""
        if self._runs(self._shape(base, goal)):
            return goal
        if self.device != "meta":  # on the CPU only the goal is tried: a fallback may keep a full-size value
            return None
        values = dict(start)
        for slot in values:
            for v in _fallbacks(start[slot], goal[slot]):
                if self._runs(self._shape(base, {**values, slot: v})):
                    values[slot] = v
                    break
        return values

    def small_base(self) -> tuple[dict, str]:
        """The CPU-sized shape: every size (those only the constructor reads too) divided by the smallest power of
        two that fits the inputs into SMALL_ELEMENTS."""
        if not self.main:
            return {}, "no size constants found: the main shape only"
        if self.device is None:
            return {}, "get_inputs() does not run on the meta device: the main shape only"
        factor, every = 1, {**self.main, **self.init_main}
        while True:
            values = {slot: _shrink(s, factor) for slot, s in every.items()}
            floored = values == {slot: _shrink(s, 2 * factor) for slot, s in every.items()}
            elements = self._elements(self._shape({}, values))
            if floored or (elements is not None and elements <= SMALL_ELEMENTS):
                fitted = self._fit({}, every, values)
                shape = None if fitted is None else self._shape({}, fitted)
                if floored or (shape and self._elements(shape) <= SMALL_ELEMENTS):
                    break  # else a fallback kept some size large: divide the others further
            factor *= 2
        if not shape:
            return {}, "no CPU sizes run the reference: the main shape only"
        if factor == 1:
            return {}, f"the main shape fits the CPU ({self._elements({})} input elements)"
        names = ", ".join({**self.sizes, **self.init_sizes})
        return shape, f"CPU sizes derived from {names} (x1/{factor}, {self._elements(shape)} input elements)"

    def variants(self, base: dict, small: bool) -> tuple[list[dict], str]:
        """Hidden variants of `base`: every size odd near a third, then prime near a fifth."""
        if not self.main:
            return [], "no size constants found: the main shape only"
        if self.device != "meta" and (not small or self.device is None):
            return [], f"the reference does not run on the meta device (in {MAX_META_OPS} ops): no hidden variants"
        start = self._values_at(base)
        floor = 3 if small else 9
        odd = {slot: _odd(s, floor) for slot, s in start.items()}
        prime = {slot: _prime(s, floor + 2, odd[slot]) for slot, s in start.items()}
        limit = max(SMALL_ELEMENTS if small else 0, self._elements(base) or 0)
        found = []
        for goal in (odd, prime):
            if (self._elements(self._shape(base, goal)) or 0) > limit:  # floors grew small sizes: keep those
                goal = {slot: min(v, start[slot]) for slot, v in goal.items()}
            values = self._fit(base, start, goal)
            shape = None if values is None or values == start else self._shape(base, values)
            if shape and shape not in found:
                found.append(shape)
        names = ", ".join(self.sizes)
        return found, f"{len(found)} hidden variant(s) derived from {names} (odd, prime)"
