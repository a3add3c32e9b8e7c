"""The rules of the game, checked on a candidate's source before it runs anywhere.

A candidate may import torch, triton, math, numpy (for launch scalars) and kloop's PTX helper, and write kernels.
It may not reach the process, the file system, the checker or PyTorch's dispatch machinery, and it may not fall back
to PyTorch when its kernel fails. Each broken rule is one reason; any reason makes the verdict `rejected`.
The sandbox backs this up at run time (PyTorch ops are recorded during forward, kernel launches are counted).
"""
from __future__ import annotations

import ast

ALLOWED_IMPORTS = {
    "torch", "torch.nn", "torch.nn.functional", "triton", "triton.language", "math", "numpy", "typing",
    "functools", "dataclasses", "tools.launch", "__future__",
}
# Modules that expose processes, files, memory or the interpreter itself.
FORBIDDEN_NAMES = {
    "eval", "exec", "compile", "__import__", "open", "globals", "locals", "vars", "setattr", "delattr",
    "getattr", "breakpoint", "input", "memoryview", "__builtins__", "__loader__", "__spec__",
}
# Attribute chains a candidate has no business touching (prefix match on the dotted name).
FORBIDDEN_ATTRS = (
    "torch._C", "torch._dynamo", "torch._inductor", "torch.ops", "torch.library", "torch.overrides",
    "torch.utils", "torch.compile", "torch.jit", "torch.cuda.Event", "torch.cuda.Stream", "torch.cuda.stream",
    "torch.cuda.graph", "torch.cuda.CUDAGraph", "torch.cuda.set_stream", "torch.backends", "torch.set_",
    "torch.manual_seed", "torch.random", "torch.hub", "torch.load", "torch.save", "torch.from_file",
    "triton.testing", "triton.runtime", "triton.compiler", "triton.knobs", "numpy.load", "numpy.save",
    "numpy.fromfile", "numpy.ctypeslib", "numpy.lib",
)
# numpy is there for launch scalars (np.int32(n)) only: its compute would escape the op recorder on CPU tensors.
NUMPY_SCALARS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                 "float64", "intp", "uintp", "dtype"}
# Methods that pull tensor values into Python or numpy, where the answer could be computed unseen.
VALUE_ESCAPES = {"numpy", "tolist", "from_numpy", "__array__", "__dlpack__", "untyped_storage", "storage"}
# Allocation and zero-fill are not "doing the work"; anything else from torch inside an except handler is a fallback.
ALLOCATION_CALLS = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like", "new_empty", "new_zeros",
    "new_full", "device", "dtype", "Size", "is_tensor", "numel", "cdiv", "next_power_of_2",
}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.aliases: dict[str, str] = {}  # local name -> module it stands for
        self.has_model_new = False

    def _flag(self, node: ast.AST, message: str) -> None:
        reason = f"line {getattr(node, 'lineno', '?')}: {message}"
        if reason not in self.reasons:
            self.reasons.append(reason)

    def _canonical(self, dotted: str) -> str:
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head, head)
        return f"{base}.{rest}" if rest else base

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in ALLOWED_IMPORTS:
                self._flag(node, f"import of {alias.name} is not allowed (allowed: {', '.join(sorted(ALLOWED_IMPORTS))})")
            self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level or module not in ALLOWED_IMPORTS:
            self._flag(node, f"import from {'.' * node.level}{module} is not allowed")
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if alias.name == "*":
                self._flag(node, "star imports are not allowed")
            elif any(full == f or full.startswith(f + ".") for f in FORBIDDEN_ATTRS):
                self._flag(node, f"{full} is off limits to candidates")
            self.aliases[alias.asname or alias.name] = full

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in FORBIDDEN_NAMES:
            self._flag(node, f"{node.id} is not allowed in a candidate")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr.startswith("__") and node.attr not in {"__init__", "__name__"}:
            self._flag(node, f"dunder attribute {node.attr} is not allowed (no reaching into objects' internals)")
        if node.attr in VALUE_ESCAPES:
            self._flag(node, f".{node.attr} moves tensor values out of the kernel's reach; not allowed")
        dotted = _dotted(node)
        if dotted:
            full = self._canonical(dotted)
            if full.startswith("numpy.") and full.split(".")[1] not in NUMPY_SCALARS:
                self._flag(node, f"{full}: numpy may only supply launch scalars ({', '.join(sorted(NUMPY_SCALARS))})")
            for prefix in FORBIDDEN_ATTRS:
                if full == prefix or full.startswith(prefix + ".") or (prefix.endswith("_") and full.startswith(prefix)):
                    self._flag(node, f"{full} is off limits to candidates")
                    return
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_store(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_store(node.target)
        self.generic_visit(node)

    def _check_store(self, target: ast.AST) -> None:
        # Assigning into an imported module (torch.allclose = ...) patches the world the checker lives in.
        if isinstance(target, ast.Attribute):
            root = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in self.aliases:
                self._flag(target, f"assigning to {_dotted(target)} patches an imported module")

    def visit_Global(self, node: ast.Global) -> None:
        self._flag(node, "global statements are not allowed (module state that survives calls can cache outputs)")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if node.name == "ModelNew":
            self.has_model_new = True
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        for handler in node.handlers:
            for inner in ast.walk(handler):
                if isinstance(inner, ast.Call):
                    name = _dotted(inner.func) or ""
                    full = self._canonical(name) if name else ""
                    leaf = full.rsplit(".", 1)[-1]
                    if (full.startswith(("torch.", "F.")) or "functional" in full) and leaf not in ALLOCATION_CALLS:
                        self._flag(inner, f"fallback to PyTorch ({full}) in an except handler")
        self.generic_visit(node)

    visit_TryStar = visit_Try


def check_source(source: str) -> list[str]:
    """Reasons this source breaks the rules (empty when it may run). A syntax error is reported by the caller."""
    tree = ast.parse(source)
    checker = _Checker()
    checker.visit(tree)
    if not checker.has_model_new:
        checker.reasons.append("no class ModelNew: a candidate defines ModelNew with the same constructor as Model")
    return checker.reasons


def detect_language(source: str) -> str:
    """ptx when the candidate launches PTX through kloop's helper, else triton."""
    return "ptx" if "PtxKernel" in source else "triton"
