"""The rules of the game, checked on a candidate's source before it runs anywhere.

A candidate may import torch, triton, math, numpy (for launch scalars) and kloop's PTX helper, and write kernels
as the public writes them (the Triton tutorials, Liger-Kernel, Unsloth: libdevice functions imported by name,
Triton functions under names of its own, triton.jit applied as a call, autograd.Function launch wrappers, Liger's
platform probes: importlib's version checks, and optional packages imported in a try that does without them).
`check_source` is early, readable feedback, not the security boundary (the sandbox and the trusted executor are):
every attribute chain rooted at an import is resolved against the real modules in this trusted process, step by
step and without calling anything, so no module is reached through another (what importlib imports by a run-time
name, or a probed package, is left unfollowed: the jail bounds it); PyTorch's dispatch machinery, side
streams, file I/O and fallbacks to PyTorch when a kernel fails are refused. Each broken rule is one reason, which
says what was written and what to write instead; any reason makes the verdict `rejected`.

The exception is a `@triton.jit` body: under the CPU interpreter the trusted executor runs it as Python, so the
Triton-language subset that `check_jit_function` enforces (and `check_source` on every kernel of a candidate) IS
the boundary there. Nothing here executes a candidate's source.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import sys
import textwrap
import types
from functools import cache

# What the prompt lists; _module_allowed is the exact policy (public torch submodules are fine too).
ALLOWED_IMPORTS = {
    "torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "triton.language.extra.libdevice",
    "triton.tools.tensor_descriptor", "math", "numpy", "typing", "functools", "dataclasses", "tools.launch",
    "__future__", "contextlib", "operator", "packaging.version", "triton.runtime", "torch.autograd", "torch.library",
    "importlib",
}
# Dotted prefixes off limits (an entry ending in "_" matches every name it begins): PyTorch's dispatch, compiler and
# autograd machinery, RNG state, files, and streams, events and graphs the timer on the current stream cannot see.
FORBIDDEN_ATTRS = (
    "torch.ops", "torch.library", "torch.overrides", "torch.utils", "torch.compile", "torch.compiler", "torch.jit",
    "torch.backends", "torch.hub", "torch.distributed", "torch.multiprocessing", "torch.fx", "torch.export",
    "torch.package", "torch.serialization", "torch.autograd", "torch.profiler", "torch.testing", "torch.random",
    "torch.classes", "torch.onnx",
    "torch.cuda.Event", "torch.cuda.Stream", "torch.cuda.ExternalStream", "torch.cuda.StreamContext",
    "torch.cuda.stream", "torch.cuda.streams", "torch.cuda.set_stream", "torch.cuda.get_stream_from_external",
    "torch.cuda.graph", "torch.cuda.graphs", "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables",
    "torch.cuda.jiterator", "torch.Stream", "torch.Event", "torch.accelerator.set_stream",
    "torch.set_", "torch.manual_seed", "torch.seed", "torch.load", "torch.save", "torch.from_file",
    "typing.get_type_hints", "typing.ForwardRef",  # both evaluate strings as code
)
# numpy is there for launch scalars (np.int32(n)) only: its compute would escape the op recorder on CPU tensors.
NUMPY_SCALARS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                 "float64", "intp", "uintp", "dtype", "bool_"}
# Modules whose members are allow-listed. functools.update_wrapper can rewrite any module's __dict__: functools.wraps
# only decorates a def, with no assigned= or updated= (`_wraps_ok`). torch.autograd and torch.library stay off limits
# but for what public Triton launches through: autograd.Function wrappers (Liger-Kernel) and Triton custom ops; their
# forward is recorded like any other (torch compute in it refuses the plan). triton.runtime only for its driver
# (the tutorials' `DEVICE = triton.runtime.driver.active.get_active_torch_device()`).
MEMBERS = {
    "numpy": NUMPY_SCALARS,
    "functools": {"partial", "lru_cache", "cache", "reduce", "cached_property", "cmp_to_key", "total_ordering",
                  "wraps"},
    "dataclasses": {"dataclass", "field", "fields", "asdict", "astuple", "replace", "InitVar", "KW_ONLY"},
    "contextlib": {"contextmanager", "nullcontext"},
    # version checks (compare_version(..., operator.ge, "3.0.0")); attrgetter and methodcaller would be getattr
    "operator": {"lt", "le", "eq", "ne", "ge", "gt", "add", "sub", "mul", "truediv", "floordiv", "mod", "neg",
                 "index", "itemgetter", "not_"},
    "packaging": {"version"},
    "packaging.version": {"Version", "parse"},
    # torch.distributed.tensor (DTensor checks and layouts before a launch, as Liger writes them); collectives and
    # process groups stay off limits
    "torch.distributed": {"tensor", "is_available", "is_initialized"},
    "tools.launch": {"PtxKernel", "NoGpuError"},
    "triton": {"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language", "tools",
               "set_allocator", "reinterpret", "TensorWrapper", "TritonError", "CompilationError", "OutOfResources",
               "InterpreterError", "runtime"},
    "triton.runtime": {"driver"},
    "torch.autograd": {"Function", "function"},
    "torch.autograd.function": {"Function", "FunctionCtx", "once_differentiable"},
    "torch.library": {"triton_op", "wrap_triton"},
    # version and platform probes (Liger's compare_version imports a package by name to read its __version__): a
    # module reached this way can be any module, so what it does is the jail's and the replay's to stop
    "importlib": {"import_module", "util", "metadata"},
    "importlib.util": {"find_spec"},
    "importlib.metadata": {"version", "PackageNotFoundError"},
    "triton.tools.tensor_descriptor": {"TensorDescriptor"},
    # Packages a candidate only passes through, on the way to the allowed module inside.
    "tools": {"launch"},
    "triton.tools": {"tensor_descriptor"},
}
TRANSIT = {"tools", "triton.tools", "packaging"}
# What the tutorials ask Triton's driver (the device, its target and properties); its launchers and binary loaders
# stay out of reach (a launch made past Triton's launcher is never recorded, so the replay never runs it).
DRIVER_PATHS = {"active", "active.utils", "active.get_active_torch_device", "active.get_current_target",
                "active.get_current_device", "active.utils.get_device_properties", "active.get_device_interface"}
# Where a function, class or object reached through an allowed module may come from (restricted modules are
# checked member by member, by identity).
TRUSTED_ORIGINS = {"torch", "triton", "math", "typing", "__future__"}
RESTRICTED_ORIGINS = {"numpy": "numpy", "functools": "functools", "_functools": "functools",
                      "dataclasses": "dataclasses", "tools": "tools.launch", "contextlib": "contextlib",
                      "operator": "operator", "_operator": "operator", "packaging": "packaging.version",
                      "importlib": "importlib", "importlib.util": "importlib.util",
                      "importlib.metadata": "importlib.metadata"}
FORBIDDEN_NAMES = {
    "eval", "exec", "compile", "__import__", "open", "globals", "locals", "vars", "setattr", "delattr",
    "getattr", "breakpoint", "input", "memoryview", "__builtins__", "__loader__", "__spec__",
}
# What to write instead, for the builtins that would reach past the checks.
INSTEAD = {"getattr": "name the attribute, as in torch.cuda.device(x.device); getattr is accepted with a literal "
                      "name, and as getattr(torch, device.type[, default])",
           "setattr": "assign the attribute by name", "delattr": "delete nothing of another module's",
           "open": "a kernel's data comes from its inputs and parameters",
           "eval": "write the code itself", "exec": "write the code itself", "compile": "write the code itself",
           "__import__": "import at the top of the module"}
# A try whose handler catches one of these makes the imports in its body probes for optional packages (Liger's
# is_npu_available: `try: from transformers.utils import is_torch_npu_available ... except Exception: return False`).
# Where the package is absent the probe fails soft; where it is there, the jail and the replay are the boundary.
PROBE_HANDLERS = {"ImportError", "ModuleNotFoundError", "Exception"}
# Packages no probe may name: the standard library (always there: a try around it probes nothing), those whose members
# the rules decide one by one, and kloop's own.
NOT_PROBED = {"torch", "triton", "numpy", "packaging", "tools", "sandbox", "agent"}
# Builtins a module-level constant may be computed with (float("-inf"), int(1e6), min(64, 2 ** 7)).
NUMERIC_BUILTINS = {"float", "int", "abs", "min", "max", "round", "pow"}
# Methods that pull tensor values into Python or numpy, where the answer could be computed unseen.
VALUE_ESCAPES = {"numpy", "tolist", "from_numpy", "__array__", "__dlpack__", "untyped_storage", "storage"}
# Allocation and zero-fill are not "doing the work"; anything else from torch inside an except handler is a fallback.
ALLOCATION_CALLS = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like", "new_empty", "new_zeros",
    "new_full", "device", "dtype", "Size", "is_tensor", "numel", "cdiv", "next_power_of_2",
}
# What a @triton.jit body may call besides Triton itself.
JIT_BUILTINS = {"range", "min", "max", "len", "int", "float", "bool", "print", "abs", "isinstance", "tuple", "zip",
                "enumerate", "list"}
# Instance attributes of Triton values (set in __init__, so dir() of their classes misses them); `handle` is not
# among them: under the interpreter it holds the numpy array behind a tensor, whose methods write files.
_VALUE_ATTRS = {"dtype", "shape", "numel", "type", "value", "values", "element_ty", "scalar", "name", "itemsize",
                "primitive_bitwidth", "fp_mantissa_width", "int_bitwidth", "int_signedness", "exponent_bias",
                "address_space", "const", "strides", "block_shape", "fields", "types"}
_NOT_IN_KERNELS = {
    ast.Import: "import", ast.ImportFrom: "import", ast.Global: "global", ast.Nonlocal: "nonlocal",
    ast.Lambda: "lambda", ast.FunctionDef: "a nested def", ast.AsyncFunctionDef: "a nested def",
    ast.ClassDef: "a nested class", ast.Try: "try", ast.TryStar: "try", ast.With: "with", ast.AsyncWith: "with",
    ast.Yield: "yield", ast.YieldFrom: "yield", ast.Await: "await", ast.Delete: "del", ast.Match: "match",
    ast.AsyncFor: "async for",
    # a comprehension's own scope would let `[tl.x for tl in (tl,)]` pass a module off as a local
    ast.ListComp: "a comprehension", ast.SetComp: "a comprehension", ast.DictComp: "a comprehension",
    ast.GeneratorExp: "a comprehension",
}
_MISSING = object()


class _Submodule:
    """A submodule that exists but is not imported yet (found without importing it)."""

    def __init__(self, name: str) -> None:
        self.name = name


# -- policy ----------------------------------------------------------------------------------------------------------
def _off_limits(path: str) -> bool:
    if _restricted_module(path) is not None:
        return False  # a module with listed members (torch.autograd) or inside one of them: MEMBERS decides
    return any(path == p or path.startswith(p + ".") or (p.endswith("_") and path.startswith(p))
               for p in FORBIDDEN_ATTRS)


def _restricted_module(path: str) -> str | None:
    """The module of MEMBERS that path is, or whose listed member path is or lies inside (torch.autograd.Function.apply
    -> torch.autograd); None when there is none."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        head = ".".join(parts[:end])
        if head in MEMBERS and (end == len(parts) or parts[end] in MEMBERS[head]):
            return head
    return None


def _listed_members(path: str) -> str:
    """', from M candidates may use ...' for the restricted module an off-limits path lies in; '' when none."""
    parts = path.split(".")
    for end in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:end])
        if head in MEMBERS:
            return f" (from {head} candidates may use {', '.join(sorted(MEMBERS[head]))})"
    return ""


def _module_allowed(name: str) -> bool:
    """Whether a candidate may import or reach module `name` (TRANSIT packages only lead to their members)."""
    if name in ("math", "typing", "__future__") or (name in MEMBERS and name not in TRANSIT):
        return True
    if any(part.startswith("_") for part in name.split(".")):
        return False
    if name == "torch" or name.startswith("torch."):
        return not _off_limits(name)
    return name.startswith("triton.language.") or name == "triton.language"


def _probe_allowed(name: str) -> bool:
    """Whether an import of module `name` inside a try that catches its failure is a probe for an optional package."""
    parts = name.split(".")
    return parts[0] not in sys.stdlib_module_names and parts[0] not in NOT_PROBED and \
        not any(part.startswith("_") for part in parts)


def _catches_failed_import(handler: ast.ExceptHandler) -> bool:
    caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(c, ast.Name) and c.id in PROBE_HANDLERS for c in caught)


def _probe_imports(tree: ast.Module) -> set[int]:
    """The import statements a try runs in its body, whose handlers catch their failure (not those in a def there:
    they run later, outside the try)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Try, ast.TryStar)) and any(_catches_failed_import(h) for h in node.handlers):
            pending = list(node.body)
            while pending:
                inner = pending.pop()
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    found.add(id(inner))
                elif not isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    pending.extend(ast.iter_child_nodes(inner))
    return found


def _jit_module_allowed(name: str) -> bool:
    """Modules a kernel body may reach: the Triton language (libdevice, math, extra.* included)."""
    return (name == "triton.language" or name.startswith("triton.language.")) and \
        not any(part.startswith("_") for part in name.split("."))


@cache
def _import(name: str):
    """Only ever called with names the policy allows: importing trusted library code, never the candidate's."""
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def _step(obj, attr: str):
    """obj.attr without running descriptors or module __getattr__; a submodule not imported yet comes back as a
    _Submodule; _MISSING when it does not resolve statically (a method of a runtime object, say)."""
    try:
        return inspect.getattr_static(obj, attr)
    except AttributeError:
        pass
    if isinstance(obj, types.ModuleType) and isinstance(getattr(obj, "__name__", None), str):
        name = f"{obj.__name__}.{attr}"
        if name in sys.modules:
            return sys.modules[name]
        try:
            if importlib.util.find_spec(name) is not None:
                return _Submodule(name)
        except (ImportError, ValueError):
            pass
    return _MISSING


def _origin(obj) -> str | None:
    """The module a function or class was defined in, or an object's class was; None for plain data."""
    if inspect.isclass(obj) or callable(obj):
        module = getattr(obj, "__module__", None)
        if isinstance(module, str):
            return module
    module = type(obj).__module__
    return None if module == "builtins" else module


@cache
def _allowed_ids(module: str) -> dict[int, object]:
    mod = _import(module)
    found = {}
    for name in MEMBERS[module]:
        value = getattr(mod, name, None)
        if value is not None:
            found[id(value)] = value  # kept, so the id stays this object's
    return found


@cache
def _forbidden_objects() -> dict[int, tuple[str, object]]:
    """The functions and classes FORBIDDEN_ATTRS names, by identity: the same object reached under another name
    (torch.cuda.streams.Stream is torch.cuda.Stream) is just as off limits."""
    found = {}
    for entry in FORBIDDEN_ATTRS:
        parts = entry.split(".")
        obj = _import(parts[0])
        for attr in parts[1:-1]:
            obj = None if obj is None else _step(obj, attr)
            obj = None if obj is _MISSING or isinstance(obj, _Submodule) else obj
        if obj is None:
            continue
        last = parts[-1]
        names = [n for n in dir(obj) if n.startswith(last)] if last.endswith("_") else [last]
        for name in names:
            value = _step(obj, name)
            if inspect.isclass(value) or inspect.isroutine(value):
                found[id(value)] = (f"{obj.__name__}.{name}", value)
    return found


def _foreign(obj, parent) -> str | None:
    """Where obj comes from, when that is somewhere a candidate may not go (os.system imported into a torch module,
    functools.wraps inside Triton); None when it is fine."""
    origin = _origin(obj)
    if origin is None or (inspect.isclass(parent) and origin == getattr(parent, "__module__", None)):
        return None
    top = origin.split(".")[0]
    if top in TRUSTED_ORIGINS:
        return None
    restricted = RESTRICTED_ORIGINS.get(origin) or RESTRICTED_ORIGINS.get(top)
    if restricted and id(obj) in _allowed_ids(restricted):
        return None
    return f"{origin}.{getattr(obj, '__qualname__', type(obj).__name__)}"


def _is_triton_decorator(obj, names=("jit", "autotune", "heuristics")) -> bool:
    return getattr(obj, "__module__", None) in ("triton.runtime.jit", "triton.runtime.autotuner") and \
        getattr(obj, "__name__", None) in names


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _chain(node: ast.Attribute) -> tuple[list[ast.Attribute], ast.AST]:
    """The attribute nodes of a chain, outermost last, and the expression it starts from."""
    links = []
    while isinstance(node, ast.Attribute):
        links.append(node)
        node = node.value
    return links[::-1], node


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value is None or isinstance(node.value, (bool, int, float, str))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))
    return isinstance(node, ast.Tuple) and all(_is_literal(e) for e in node.elts)


# -- the Triton-language subset of a @triton.jit body -----------------------------------------------------------------
@cache
def _tensor_attrs() -> frozenset[str]:
    """Attributes a kernel may use on its values: the public API of Triton's value and type classes."""
    from triton.language import core

    names = set(_VALUE_ATTRS)
    for cls in ("tensor", "dtype", "pointer_type", "block_type", "constexpr", "tuple", "tuple_type",
                "tensor_descriptor_base", "tensor_descriptor"):
        names |= {n for n in dir(getattr(core, cls, object)) if not n.startswith("_")}
    return frozenset(names - {"handle"})


def _triton_language_object(obj) -> bool:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return True
    if isinstance(obj, tuple):
        return all(v is None or isinstance(v, (bool, int, float, str)) for v in obj)
    if (_origin(obj) or "").startswith("triton.language"):
        return True
    # tl.sigmoid, tl.cdiv, ... are jit functions themselves
    return type(obj).__module__ in ("triton.runtime.jit", "triton.runtime.interpreter") and \
        type(obj).__name__ in ("JITFunction", "InterpretedFunction")


def _walkable(obj) -> bool:
    """Objects whose attributes a kernel may name: Triton modules, classes and type objects (tl.float32), never
    functions."""
    if isinstance(obj, types.ModuleType):
        return True
    if inspect.isroutine(obj) or not (_origin(obj) or "").startswith("triton.language"):
        return False
    return inspect.isclass(obj) or not callable(obj)


class _Kernel(ast.NodeVisitor):
    """One @triton.jit function against the Triton-language subset. `aliases` maps names to the modules they
    stand for; `hints` explains other names of the candidate's module a body may not use. With `defined` (the
    names a module binds, builtins included), a name outside it is left to the compiler: it can reach nothing."""

    def __init__(self, fn: ast.FunctionDef, constants: set[str], kernels: set[str], aliases: dict[str, str],
                 hints: dict[str, str] | None = None, defined: set[str] | None = None) -> None:
        self.fn, self.constants, self.kernels, self.aliases = fn, constants, kernels, aliases
        self.hints = hints or {}
        self.defined = defined
        self.reasons: list[tuple[int, str]] = []
        args = fn.args
        self.params = [a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a]
        self.locals = {a.arg for a in self.params} | {
            n.id for stmt in fn.body for n in ast.walk(stmt)
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}

    def _flag(self, node: ast.AST, message: str) -> None:
        line = getattr(node, "lineno", self.fn.lineno)
        reason = (line, f"line {line}: inside @triton.jit kernel {self.fn.name}: {message}")
        if reason not in self.reasons:
            self.reasons.append(reason)

    def run(self) -> list[tuple[int, str]]:
        args = self.fn.args
        positional = [*args.posonlyargs, *args.args]
        defaults = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for param, default in defaults:  # evaluated where the kernel is defined, as Triton allows
            if _is_literal(default) or (isinstance(default, ast.Name) and default.id in self.constants):
                continue
            base = _chain(default)[1] if isinstance(default, ast.Attribute) else None
            if isinstance(base, ast.Name) and base.id in self.aliases:  # tl.float32: checked as in a body
                self.visit(default)
                continue
            self._flag(default, f"the default of {param.arg} must be a literal, a module constant or a Triton "
                                "dtype")
        for param in self.params:
            if param.annotation is not None:
                self.visit(param.annotation)
        if self.fn.returns is not None:
            self.visit(self.fn.returns)
        for stmt in self.fn.body:
            self.visit(stmt)
        return self.reasons

    def visit(self, node: ast.AST) -> None:
        word = _NOT_IN_KERNELS.get(type(node))
        if word:
            self._flag(node, f"{word} is not allowed")
        else:
            super().visit(node)

    def _name(self, node: ast.Name, root: bool) -> str | None:
        """What the name is (local, module, kernel, constant, builtin), or None after flagging it."""
        name = node.id
        if name.startswith("__"):
            self._flag(node, f"name {name} is not allowed")
        elif name in self.locals:
            return "local"
        elif name in self.aliases:
            module = self.aliases[name]
            if not (module == "triton" or _jit_module_allowed(module)):
                self._flag(node, f"{name} is module {module}, which kernels may not use")
            elif not root:
                self._flag(node, f"module {name} used as a value")
            else:
                return "module"
        elif name in self.kernels:
            return "kernel"
        elif name in self.constants:
            return "constant"
        elif name in self.hints:
            self._flag(node, f"{name} is {self.hints[name]}")
        elif name in JIT_BUILTINS:
            return "builtin"
        elif self.defined is not None and name not in self.defined:
            return None
        else:
            self._flag(node, f"{name} is not a parameter, local, kernel, module constant, Triton module or "
                             "allowed builtin")
        return None

    def visit_Name(self, node: ast.Name) -> None:
        self._name(node, root=False)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        links, base = _chain(node)
        attrs = [link.attr for link in links]
        private = next((a for a in attrs if a.startswith("_")), None)
        if private:
            return self._flag(node, f"attribute {private} is not allowed (private or dunder)")
        if not isinstance(node.ctx, ast.Load):
            return self._flag(node, "assigning to an attribute is not allowed")
        if isinstance(base, ast.Name):
            kind = self._name(base, root=True)
            if kind == "module":
                return self._module_chain(node, base.id, attrs)
            if kind != "local":
                if kind is not None:
                    self._flag(node, f"{base.id}.{attrs[0]}: only Triton modules and values have attributes "
                                     "in a kernel")
                return None
        else:
            self.visit(base)
        unknown = next((a for a in attrs if a not in _tensor_attrs()), None)
        if unknown:
            self._flag(node, f".{unknown} is not an attribute of Triton values")

    def _module_chain(self, node: ast.AST, name: str, attrs: list[str]) -> None:
        module = self.aliases[name]
        if module == "triton":
            if attrs[0] in ("cdiv", "next_power_of_2"):
                return None if len(attrs) == 1 else \
                    self._flag(node, f"{name}.{'.'.join(attrs)} is not part of the Triton language")
            if attrs[0] != "language":
                return self._flag(node, f"{name}.{attrs[0]} is not allowed in a kernel (only triton.language, "
                                        "triton.cdiv, triton.next_power_of_2)")
        obj, shown = _import(module), name
        for attr in attrs:
            if obj is None or not _walkable(obj):
                return self._flag(node, f"{shown}.{attr} is not part of the Triton language")
            shown += "." + attr
            nxt = _step(obj, attr)
            if isinstance(nxt, _Submodule) and _jit_module_allowed(nxt.name):
                nxt = _import(nxt.name)
            if isinstance(nxt, (types.ModuleType, _Submodule)):
                reached = nxt.name if isinstance(nxt, _Submodule) else nxt.__name__
                if not _jit_module_allowed(reached):
                    return self._flag(node, f"{shown} reaches module {reached}, which kernels may not use")
            elif nxt is _MISSING or not _triton_language_object(nxt):
                return self._flag(node, f"{shown} is not part of the Triton language")
            obj = nxt
        if isinstance(obj, types.ModuleType):  # a module in a local would dodge these checks
            self._flag(node, f"module {shown} used as a value")
        return None

    def visit_Call(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg is None:
                self._flag(keyword.value, "** unpacking in a call is not allowed")
            elif keyword.arg.startswith("_"):
                self._flag(keyword.value, f"keyword {keyword.arg} is not allowed (private)")
        self.generic_visit(node)


def check_jit_function(source: str, constants: set[str], kernels: set[str], aliases: dict[str, str]) -> list[str]:
    """Reasons the source of one @triton.jit function (decorators, if any, are ignored: the caller replaces them)
    leaves the Triton-language subset; empty when it may run in the interpreter. `constants` and `kernels` are the
    module-level names it may read or call, `aliases` maps names to the modules they stand for (tl ->
    triton.language). Parses only, never executes; malformed source is a reason, not an exception."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except (SyntaxError, ValueError) as e:
        return [f"line {getattr(e, 'lineno', None) or 1}: syntax error: {getattr(e, 'msg', e)}"]
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        return ["line 1: a kernel's source must be exactly one function definition"]
    return [text for _, text in _Kernel(tree.body[0], set(constants), set(kernels), dict(aliases)).run()]


# -- the whole candidate ---------------------------------------------------------------------------------------------
def _module_scope(body: list[ast.stmt]):
    """Statements that run at module level (into if/for/while/with/try blocks, not into defs or classes)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _module_scope(getattr(stmt, field, None) or [])
        for handler in getattr(stmt, "handlers", None) or []:
            yield from _module_scope(handler.body)


def _bound_names(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
        targets = [stmt.target]
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        targets = [item.optional_vars for item in stmt.items if item.optional_vars]
    else:
        targets = []
    names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    names |= {h.name for h in getattr(stmt, "handlers", None) or [] if h.name}
    return names


def _local_names(params: list[ast.arg], body: list[ast.AST]) -> set[str]:
    """Names a function binds in its own scope (parameters, assignments, nested defs), less those it declares
    global or nonlocal. Nested functions, classes and comprehensions have scopes of their own: their names are
    left out, so that they can never hide an import from the checks (`[t for torch in (torch,)]`)."""
    names, declared = {a.arg for a in params}, set()
    pending = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared |= set(node.names)
        pending.extend(ast.iter_child_nodes(node))
    return names - declared


class _CandidateChecker(ast.NodeVisitor):
    """The rules on a whole candidate; its kernels go to _Kernel with what the module defines."""

    def __init__(self, tree: ast.Module) -> None:
        self.reasons: list[tuple[int, str]] = []
        self.bindings: dict[str, tuple[str, object]] = {}  # imported name -> (dotted name, object or None)
        self.has_model_new = False
        self._roots: set[int] = set()       # Name nodes that start an attribute chain
        self._decorators: set[int] = set()  # expressions in decorator position, or applying Triton's as a call
        self._exempt: set[int] = set()      # nodes of the accepted forms of wraps and getattr
        self._scopes: list[set[str]] = []   # names local to the functions being visited
        self._probes = _probe_imports(tree)  # imports in a try that does without them
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self._import(node)
            elif isinstance(node, ast.ImportFrom):
                self._import_from(node)
        self._applications(tree)
        self._module_names(tree)

    def _flag(self, node: ast.AST, message: str) -> None:
        line = getattr(node, "lineno", 0)
        reason = (line, f"line {line}: {message}")
        if reason not in self.reasons:
            self.reasons.append(reason)

    # -- imports and what they bind ----------------------------------------------------------------------------------
    def _refuse_import(self, node: ast.Import | ast.ImportFrom, written: str, module: str) -> None:
        allowed = ", ".join(sorted(ALLOWED_IMPORTS))
        if _probe_allowed(module):
            instead = "; a probe for an optional package imports it inside try: ... except ImportError:"
        elif id(node) in self._probes and module.split(".")[0] in sys.stdlib_module_names:
            instead = "; the standard library is always there, so a try around its import probes nothing"
        else:
            instead = ""
        self._flag(node, f"{written} is not allowed (allowed: {allowed}){instead}")

    def _probe(self, node: ast.Import | ast.ImportFrom, module: str) -> bool:
        """Whether this import is a probe for an optional package: its names are bound, unresolved (the module is
        never imported here), and what the candidate does with them is left to the jail and the replay."""
        return id(node) in self._probes and _probe_allowed(module)

    def _import(self, node: ast.Import) -> None:
        for alias in node.names:
            top = alias.name.split(".")[0]
            if self._probe(node, alias.name):
                name, module = (alias.asname, alias.name) if alias.asname else (top, top)
                self.bindings[name] = (module, None)
            elif not _module_allowed(alias.name):
                self._refuse_import(node, f"import of {alias.name}", alias.name)
            elif alias.asname:
                self.bindings[alias.asname] = (alias.name, _import(alias.name))
            else:  # `import a.b` binds a, a package this walks through like any other
                _import(alias.name)
                self.bindings[top] = (top, _import(top))

    def _import_from(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            return self._flag(node, f"import from {'.' * node.level}{module} is not allowed (a candidate is one "
                                    "module)")
        probe = self._probe(node, module)
        if not (probe or _module_allowed(module) or module in TRANSIT):
            return self._refuse_import(node, f"import from {module}", module)
        parent = None if probe else _import(module)
        for alias in node.names:
            if alias.name == "*":
                self._flag(node, f"star imports are not allowed (name what you need: from {module} import ...)")
                continue
            obj = None if probe else self._walk(parent, module, [alias.name], node)
            self.bindings[alias.asname or alias.name] = (f"{module}.{alias.name}", obj)
        return None

    def _walk(self, obj, shown: str, attrs: list[str], node: ast.AST):
        """Resolve the chain shown.attrs from obj (None: not resolved) one attribute at a time, flagging the first
        step that breaks a rule. Returns what the chain names, or None when it does not resolve statically."""
        path = obj.__name__ if isinstance(obj, types.ModuleType) else shown  # the name prefixes are checked on
        for attr in attrs:
            if attr.startswith("__"):
                return None  # flagged as a dunder where the chain is visited
            parent = obj
            shown, path = f"{shown}.{attr}", f"{path}.{attr}"
            if _off_limits(path):
                self._flag(node, f"{shown} is off limits to candidates" + (f" ({path})" if path != shown else "")
                           + _listed_members(path))
                return None
            if parent is None:
                continue
            obj = _step(parent, attr)
            if isinstance(obj, (types.ModuleType, _Submodule)):
                name = obj.name if isinstance(obj, _Submodule) else obj.__name__
                if not (_module_allowed(name) or name in TRANSIT):
                    self._flag(node, f"{shown} reaches module {name}, which candidates may not use"
                               + _listed_members(name))
                    return None
                obj, path = _import(name), name
            reason = self._member_reason(parent, attr, obj, shown)
            if reason:
                self._flag(node, reason)
                return None
            if obj is _MISSING:
                obj = None
        return obj

    @staticmethod
    def _member_reason(parent, attr: str, obj, shown: str) -> str | None:
        """Why parent.attr (= obj) is not for candidates: a restricted module's unlisted member, a forbidden
        object under another name, or something from a module candidates may not use."""
        allowed = MEMBERS.get(parent.__name__) if isinstance(parent, types.ModuleType) else None
        if allowed is not None and attr not in allowed:
            if parent.__name__ == "numpy":
                return f"{shown}: numpy may only supply launch scalars ({', '.join(sorted(NUMPY_SCALARS))})"
            return f"{shown} is not allowed (from {parent.__name__} candidates may use {', '.join(sorted(allowed))})"
        if obj is _MISSING or obj is None or isinstance(obj, types.ModuleType):
            return None
        forbidden = _forbidden_objects().get(id(obj))
        if forbidden:
            return f"{shown} is {forbidden[0]}, which is off limits to candidates"
        origin = _foreign(obj, parent)
        return f"{shown} is {origin}, which candidates may not use" if origin else None

    def _resolve(self, node: ast.AST):
        """What a Name or attribute chain rooted at an import names, without flagging anything."""
        dotted = _dotted(node)
        if not dotted or dotted.split(".")[0] not in self.bindings:
            return None
        head, *attrs = dotted.split(".")
        obj = self.bindings[head][1]
        for attr in attrs:
            obj = None if obj is None or attr.startswith("__") else _step(obj, attr)
            obj = None if obj is _MISSING or isinstance(obj, _Submodule) else obj
        return obj

    def _binding(self, name: str) -> tuple[str, object] | None:
        """The import a name stands for here, unless a function being visited binds that name itself."""
        if any(name in scope for scope in self._scopes):
            return None
        return self.bindings.get(name)

    def _canonical(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.bindings[head][0] if head in self.bindings else head
        return f"{base}.{rest}" if rest else base

    # -- module-level names: constants and kernels -----------------------------------------------------------------
    def _is_kernel(self, node: ast.AST) -> bool:
        return isinstance(node, ast.FunctionDef) and (id(node) in self._applied_defs or any(
            _is_triton_decorator(self._resolve(d.func if isinstance(d, ast.Call) else d), ("jit",))
            for d in node.decorator_list))

    def _applied_decorator(self, call: ast.Call) -> ast.AST | None:
        """The Triton decorator `call` applies to its argument (triton.jit in `triton.jit(fn)`, triton.heuristics in
        `triton.heuristics({...})(fn)`); None when it applies none."""
        if call.args and _is_triton_decorator(self._resolve(call.func), ("jit",)):
            return call.func
        if isinstance(call.func, ast.Call) and _is_triton_decorator(self._resolve(call.func.func)):
            return call.func.func
        return None

    def _applications(self, tree: ast.Module) -> None:
        """Triton's decorators applied as calls, as the tutorials and Unsloth write them (`k = triton.jit(fn)`,
        `fn = triton.heuristics({...})(triton.jit(fn))`). Module-level statements are followed in order, every
        binding of a name kept (a def in either branch of an `if` may be the one bound): an application must reach
        only defs of this module or kernels; a jit among its decorators makes those defs kernels, checked like
        decorated ones. Applications elsewhere (in a function) see the module's final bindings."""
        state: dict[str, list] = {name: ["other"] for node in ast.walk(tree) if isinstance(node, ast.Global)
                                  for name in node.names}
        self._applied_defs: set[int] = set()
        handled: set[int] = set()

        def kernel_item(item) -> bool:
            return item == "kernel" or (isinstance(item, ast.FunctionDef) and self._is_kernel(item))

        def apply(call: ast.Call) -> bool:
            """Whether the application makes a kernel (flagging it when it applies to anything else)."""
            chain, target = [], call
            while isinstance(target, ast.Call) and self._applied_decorator(target) is not None:
                chain.append(self._applied_decorator(target))
                handled.add(id(target))
                target = target.args[0] if len(target.args) == 1 or chain[-1] is target.func else None
            self._decorators.update(id(d) for d in chain)
            jit = any(_is_triton_decorator(self._resolve(d), ("jit",)) for d in chain)
            shown = _dotted(chain[0]) or "a Triton decorator"
            items = state.get(target.id, []) if isinstance(target, ast.Name) else []
            if items and all(isinstance(i, ast.FunctionDef) or i == "kernel" for i in items):
                if jit:
                    self._applied_defs.update(id(i) for i in items if isinstance(i, ast.FunctionDef))
                    return True
                if all(kernel_item(i) for i in items):
                    return True
                self._flag(call, f"{shown} applied to {target.id}, a def that is not a @triton.jit kernel: apply "
                                 f"triton.jit first ({shown}(...)(triton.jit({target.id})))")
                return False
            what = ast.unparse(target)[:60] if target is not None else "more than one argument"
            self._flag(call, f"{shown} applied to {what}: Triton's decorators apply to a def of this module (write "
                             "@triton.jit on the def, or triton.jit(name_of_the_def)), so that its body is checked")
            return False

        for stmt in _module_scope(tree.body):
            value = getattr(stmt, "value", None)
            made_kernel = False
            if isinstance(value, ast.Call) and self._applied_decorator(value) is not None:
                made_kernel = apply(value)
            if isinstance(stmt, ast.FunctionDef):
                state.setdefault(stmt.name, []).append(stmt)
                continue
            simple = isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            for name in _bound_names(stmt):
                state.setdefault(name, []).append("kernel" if made_kernel and simple else "other")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and id(node) not in handled and self._applied_decorator(node) is not None:
                apply(node)
        self.jit_names = {name for name, items in state.items()
                          if "kernel" in items and all(kernel_item(i) for i in items)}

    def _constant_expr(self, node: ast.AST, constants: set[str]) -> bool:
        """Literals, tuples and arithmetic of them, earlier constants, math's constants and functions and the
        numeric builtins applied to them, tl.constexpr(<one of those>), tl dtypes."""
        if isinstance(node, ast.Constant):
            return node.value is None or isinstance(node.value, (bool, int, float, str))
        if isinstance(node, ast.Tuple):
            return all(self._constant_expr(e, constants) for e in node.elts)
        if isinstance(node, ast.UnaryOp):
            return self._constant_expr(node.operand, constants)
        if isinstance(node, ast.BinOp):
            return self._constant_expr(node.left, constants) and self._constant_expr(node.right, constants)
        if isinstance(node, ast.Name):
            return node.id in constants
        if isinstance(node, ast.Call):
            if node.keywords or not all(self._constant_expr(a, constants) for a in node.args):
                return False
            if isinstance(node.func, ast.Name) and node.func.id in NUMERIC_BUILTINS:
                return node.func.id not in self.bindings
            func = self._resolve(node.func)
            if getattr(func, "__module__", None) == "math":   # math.log(2.0): a number, computed where it is defined
                return True
            return getattr(func, "__module__", None) == "triton.language.core" and \
                getattr(func, "__name__", None) == "constexpr" and len(node.args) == 1
        if isinstance(node, ast.Attribute):
            value = self._resolve(node)
            if isinstance(value, (int, float)) and not isinstance(value, bool):   # math.pi, math.inf
                return True
            return type(value).__module__ == "triton.language.core" and type(value).__name__ == "dtype"
        return False

    def _bound_values(self, stmt: ast.stmt) -> dict[str, tuple[str, object]]:
        """What a module-level statement binds each name to, as (what the candidate wrote, the object or None), for
        `from m import f` and `f = <attribute chain>`; other statements bind their names to ('', None)."""
        if isinstance(stmt, ast.ImportFrom) and not stmt.level:
            module = stmt.module or ""
            # a module the rules refuse, a probe's included, is never imported here
            parent = _import(module) if _module_allowed(module) or module in TRANSIT else None
            values = {}
            for alias in stmt.names:
                obj = _MISSING if parent is None else _step(parent, alias.name)
                values[alias.asname or alias.name] = (f"from {stmt.module} import {alias.name}",
                                                      None if obj is _MISSING or isinstance(obj, _Submodule) else obj)
            return values
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and \
                isinstance(stmt.value, (ast.Name, ast.Attribute)) and _dotted(stmt.value):
            return {stmt.targets[0].id: (_dotted(stmt.value), self._resolve(stmt.value))}
        return {name: ("", None) for name in _bound_names(stmt)}

    def _triton_function(self, stmt: ast.stmt, written: str, obj) -> bool:
        """A binding a kernel may call: a Triton function (tl.cast, a libdevice function), or a name of a
        triton.language module that this Triton lacks (a fallback's other branch, tl.math.tanh of older Tritons:
        it binds a Triton function or fails)."""
        if isinstance(stmt, ast.FunctionDef):
            return self._is_kernel(stmt)   # Unsloth's `@triton.jit def triton_cast` where tl.cast is missing
        if isinstance(obj, types.ModuleType) or not written or written.split()[-1].rsplit(".", 1)[-1].startswith("_"):
            return False
        if obj is None:
            module = (stmt.module or "") if isinstance(stmt, ast.ImportFrom) else \
                self._canonical(written).rsplit(".", 1)[0]
            return _jit_module_allowed(module) and (isinstance(stmt, ast.ImportFrom) or written.count(".") > 0)
        return callable(obj) and _triton_language_object(obj)

    def _module_names(self, tree: ast.Module) -> None:
        constants: set[str] = set()
        bound: set[str] = set()
        functions: dict[str, bool] = {}            # name -> every binding is a Triton function
        first_other: dict[str, tuple[int, str]] = {}  # name -> (line, what) of its first binding that is not one
        for stmt in _module_scope(tree.body):
            for name, (written, obj) in self._bound_values(stmt).items():
                ok = self._triton_function(stmt, written, obj)
                functions[name] = functions.get(name, True) and ok
                if not ok and name not in first_other:
                    first_other[name] = (stmt.lineno, written)
            names = _bound_names(stmt)
            simple = (isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets)) or \
                (isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name))
            # a constant is bound only ever to constant expressions
            if simple and self._constant_expr(stmt.value, constants) and not names & (bound - constants):
                constants |= names
            else:
                constants -= names
            bound |= names
        # a name some function rebinds through `global` is state, not a constant
        rebound = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
        self.constants = constants - rebound
        self.kernels = {s.name for s in _module_scope(tree.body) if self._is_kernel(s)} | self.jit_names
        self.aliases = {name: obj.__name__ for name, (_, obj) in self.bindings.items()
                        if isinstance(obj, types.ModuleType)}
        # Triton functions under names of the candidate's own (`from ...libdevice import rsqrt`, Liger's fallback
        # chain of such imports, Unsloth's `triton_tanh = tl.math.tanh`): every binding of the name must be one
        self.functions = {name for name, ok in functions.items() if ok} - rebound - set(self.aliases)
        advice = ("a kernel calls only tl.*, libdevice.* and @triton.jit functions, and reads literal module "
                  "constants; pass anything else as an argument")
        self.hints = {}
        for name in (bound | rebound | set(self.bindings)) - self.constants - self.kernels - self.functions - \
                set(self.aliases):
            line, written = first_other.get(name, (0, ""))
            if written.startswith("from "):
                self.hints[name] = f"imported by `{written}` (line {line}), not a Triton function: {advice}"
            elif written and name not in rebound:
                self.hints[name] = f"bound to {written} (line {line}), not a Triton function: {advice}"
            else:
                self.hints[name] = f"a module-level object, not a constant: {advice}"
        self.defined = bound | rebound | set(self.bindings) | set(dir(builtins))
        self.module_bound = bound | rebound

    def _builtin(self, name: str) -> bool:
        """Whether a name, here, is Python's builtin of that name (not a def or local of the candidate's)."""
        return name not in self.module_bound and not any(name in scope for scope in self._scopes)

    # -- visiting ----------------------------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        pass  # checked up front, with what they bind

    visit_ImportFrom = visit_Import

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES and not any(node.id in scope for scope in self._scopes) and \
                id(node) not in self._exempt:
            # the builtin; a function's own parameter or local of that name (forward(self, input)) is not it
            instead = f": {INSTEAD[node.id]}" if node.id in INSTEAD else ""
            self._flag(node, f"{node.id} is not allowed in a candidate{instead}")
        binding = self._binding(node.id)
        if id(node) not in self._roots and isinstance(node.ctx, ast.Load) and binding:
            self._check_value(node, *binding)

    def _check_value(self, node: ast.AST, dotted: str, obj) -> None:
        """A module passed around as a value escapes the chain checks; triton.jit passed around skips the kernel
        checks; functools.wraps with assigned= or updated= rewrites any object's attributes."""
        if id(node) in self._exempt:
            return
        if isinstance(obj, types.ModuleType):
            self._flag(node, f"module {dotted} used as a value (name its members instead)")
        elif _is_triton_decorator(obj) and id(node) not in self._decorators:
            self._flag(node, f"{dotted} used as a value: write @{dotted} on a def of this module, or "
                             f"{dotted}(name_of_the_def) (so the kernel's body is checked)")
        elif obj is _import("functools").wraps:
            self._flag(node, f"{dotted} may only decorate a def, as @{dotted}(fn) with no other arguments "
                             "(assigned= and updated= rewrite another object's attributes)")

    def _mark_decorators(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            func = decorator.func if isinstance(decorator, ast.Call) else decorator
            self._decorators.add(id(func))
            if isinstance(decorator, ast.Call) and len(decorator.args) == 1 and not decorator.keywords and \
                    self._resolve(func) is _import("functools").wraps:
                self._exempt.add(id(func))   # @functools.wraps(fn): copies fn's name and docstring onto this def

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if not (isinstance(func, ast.Name) and self._builtin(func.id)):
            return self.generic_visit(node)
        if func.id == "hasattr" and args:
            self._exempt.add(id(args[0]))   # hasattr(torch, "npu") answers a bool: the module goes nowhere
        if not (func.id == "getattr" and len(args) in (2, 3) and not node.keywords):
            return self.generic_visit(node)
        name = args[1].value if isinstance(args[1], ast.Constant) else None
        if isinstance(name, str) and name.isidentifier() and not name.startswith("_"):
            # getattr(torch.npu, "amp", None) is torch.npu.amp, checked as that chain
            self._exempt.add(id(func))
            self.visit(ast.copy_location(ast.Attribute(value=args[0], attr=name, ctx=ast.Load()), node))
            for default in args[2:]:
                self.visit(default)
            return None
        if isinstance(args[0], ast.Name) and (self._binding(args[0].id) or ("", None))[1] is _import("torch") \
                and isinstance(args[1], ast.Attribute) and args[1].attr == "type":
            # getattr(torch, device.type): Liger's device_context picks torch.cuda / torch.xpu by the device's type
            self._exempt.update((id(func), id(args[0])))
        return self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        links, base = _chain(node)
        for link in links:
            if link.attr.startswith("__") and link.attr not in {"__init__", "__name__", "__version__"}:
                self._flag(link, f"dunder attribute {link.attr} is not allowed (no reaching into objects' internals)")
            if link.attr in VALUE_ESCAPES:
                self._flag(link, f".{link.attr} moves tensor values out of the kernel's reach; not allowed (compute "
                                 "with the values in a kernel)")
        if not isinstance(base, ast.Name):
            self.visit(base)
            return
        self._roots.add(id(base))
        self.visit_Name(base)
        binding = self._binding(base.id)
        if binding:
            dotted, obj = binding
            path = self._canonical(_dotted(node) or "")
            if path.startswith("triton.runtime.driver.") and path[len("triton.runtime.driver."):] not in DRIVER_PATHS:
                calls = ", ".join(f"triton.runtime.driver.{c}()" for c in sorted(DRIVER_PATHS) if "get_" in c)
                self._flag(node, f"{_dotted(node)} is not for candidates (they may call {calls})")
                return
            final = self._walk(obj, dotted, [link.attr for link in links], node)
            if final is not None and isinstance(node.ctx, ast.Load):
                self._check_value(node, f"{dotted}.{'.'.join(link.attr for link in links)}", final)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._mark_decorators(node)
        if not self._is_kernel(node):
            self._in_scope(node)
            return
        for decorator in node.decorator_list:  # host code (autotune configs, heuristics), not the kernel
            self.visit(decorator)
        self.reasons += _Kernel(node, self.constants, self.kernels | self.functions, self.aliases, self.hints,
                                self.defined).run()

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._mark_decorators(node)
        self._in_scope(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._in_scope(node)

    def _in_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        """Visit a function whose own names shadow imports (`math = []` in a function is a list, not the module).
        Decorators, defaults and annotations run in the enclosing scope, so they are visited outside it."""
        args = node.args
        params = [a for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a]
        for expr in (*getattr(node, "decorator_list", []), *args.defaults, *args.kw_defaults,
                     *(a.annotation for a in params), getattr(node, "returns", None)):
            if expr is not None:
                self.visit(expr)
        body = node.body if isinstance(node.body, list) else [node.body]
        self._scopes.append(_local_names(params, body))
        for stmt in body:
            self.visit(stmt)
        self._scopes.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name == "ModelNew":
            self.has_model_new = True
        self._mark_decorators(node)
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_store(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_store(node.target)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_store(target)
        self.generic_visit(node)

    def _check_store(self, target: ast.AST) -> None:
        # Assigning into an imported module or object (torch.allclose = ...) patches the world the checker lives in.
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_store(element)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            root = target
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(root, ast.Name) and self._binding(root.id):
                shown = _dotted(target) or _dotted(target.value) or root.id
                self._flag(target, f"assigning to {shown} patches an imported module (keep state in names of your "
                                   "own module)")

    def visit_Try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            for inner in ast.walk(handler):
                if isinstance(inner, ast.Call):
                    name = _dotted(inner.func) or ""
                    full = self._canonical(name) if name else ""
                    leaf = full.rsplit(".", 1)[-1]
                    if (full.startswith(("torch.", "F.")) or "functional" in full) and leaf not in ALLOCATION_CALLS:
                        self._flag(inner, f"fallback to PyTorch ({full}) in an except handler (let the error "
                                          "surface, or fall back to another kernel)")
        self.generic_visit(node)

    visit_TryStar = visit_Try


def check_source(source: str) -> list[str]:
    """Reasons this source breaks the rules (empty when it may run), in line order. A syntax error is raised for the
    caller to report."""
    tree = ast.parse(source)
    checker = _CandidateChecker(tree)
    checker.visit(tree)
    reasons = [text for _, text in sorted(checker.reasons, key=lambda reason: reason[0])]
    if not checker.has_model_new:
        reasons.append("line 1: no class ModelNew: a candidate defines ModelNew with the same constructor as Model")
    return reasons


def detect_language(source: str) -> str:
    """ptx when the candidate launches PTX through kloop's helper, else triton."""
    return "ptx" if "PtxKernel" in source else "triton"
