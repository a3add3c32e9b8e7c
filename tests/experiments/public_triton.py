"""Public Triton as kloop judges it (a corpus benchmark, not a test).

    python tests/experiments/public_triton.py [--packages DIR] [--tutorials PATH/python/tutorials] [--only NAME ...]
                                  [--show NAME]

Installs Liger-Kernel from the package index into --packages (pip install --no-deps --target), takes forward
kernels of Liger's ops and, given a Triton checkout's python/tutorials, of the tutorials, and wraps each as a
candidate: the definitions the entry point needs, copied as written from the installed package or the tutorial
file at run time (imports of the library's own modules replaced by the definitions they import, its module-level
`if` on the platform resolved the way the library resolves it here), and a ModelNew whose forward calls that entry
point. Each is evaluated by kloop's evaluator against a KernelBench-style reference written here. Prints, per
kernel, the verdict and the reason, the credited fraction last. --show NAME prints one built candidate instead.
Where the static rules refuse a kernel, its row also says what the planner and the replay make of it with the rules
off. A machine without the package index (the GPU machines) takes a --packages folder filled elsewhere: the script
installs nothing where the folder already holds this version.

FlagGems (flag-gems 5.0.2) and Unsloth (unsloth) are on the package index too; their kernels are not wrapped: a third
of FlagGems' ops are generated at run time (pointwise_dynamic) and its kernels call its own Triton shims
(tl_extra_shim, triton_lang_extension) through its package, and Unsloth's kernels/utils.py imports unsloth_zoo at
module level while its package needs an accelerator to import, so the branches of its platform checks cannot be
read here. kloop's own tests (tests/test_public_idioms.py) cover their idioms with kernels of kloop's.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import importlib.util
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LIGER = "liger-kernel==0.8.5"
INDEX = {"liger-kernel": "wrapped", "flag-gems": "published, not wrapped", "unsloth": "published, not wrapped"}


@dataclass(frozen=True)
class Case:
    name: str
    origin: str           # a module of an installed package, or a tutorial file's name
    entries: tuple        # the names the ModelNew uses
    model: str            # class ModelNew
    reference: str        # a KernelBench-style target


ROWS = """
batch_size = 32
hidden = 512
"""

# nn.LayerNorm over rows: the reference of Liger's LayerNorm and of the tutorial's
LAYER_NORM = ROWS + """
class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden]
"""

CASES = [
    Case("liger/rms_norm", "liger_kernel.ops.rms_norm", ("LigerRMSNormFunction",), """
class ModelNew(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return LigerRMSNormFunction.apply(x, self.weight, 1e-6, 0.0, "llama", False)
""", ROWS + """
class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype)


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden]
"""),
    Case("liger/layer_norm", "liger_kernel.ops.layer_norm", ("LigerLayerNormFunction",), """
class ModelNew(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.bias = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        return LigerLayerNormFunction.apply(x, self.weight, self.bias, 1e-5)
""", LAYER_NORM),
    Case("liger/swiglu", "liger_kernel.ops.swiglu", ("LigerSiLUMulFunction",), """
class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return LigerSiLUMulFunction.apply(a, b)
""", ROWS + """
class Model(nn.Module):
    def forward(self, a, b):
        return torch.nn.functional.silu(a) * b


def get_inputs():
    return [torch.randn(batch_size, hidden), torch.randn(batch_size, hidden)]


def get_init_inputs():
    return []
"""),
    Case("liger/geglu", "liger_kernel.ops.geglu", ("LigerGELUMulFunction",), """
class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return LigerGELUMulFunction.apply(a, b)
""", ROWS + """
class Model(nn.Module):
    def forward(self, a, b):
        return torch.nn.functional.gelu(a, approximate="tanh") * b


def get_inputs():
    return [torch.randn(batch_size, hidden), torch.randn(batch_size, hidden)]


def get_init_inputs():
    return []
"""),
    Case("liger/softmax", "liger_kernel.ops.softmax", ("LigerSoftmaxFunction",), """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return LigerSoftmaxFunction.apply(x)
""", ROWS + """
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return []
"""),
    Case("liger/relu_squared", "liger_kernel.ops.relu_squared", ("LigerReLUSquaredFunction",), """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return LigerReLUSquaredFunction.apply(x)
""", ROWS + """
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x) ** 2


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return []
"""),
    Case("liger/dyt", "liger_kernel.ops.dyt", ("LigerDyTFunction",), """
class ModelNew(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.full((1,), 0.5))
        self.gamma = torch.nn.Parameter(torch.ones(hidden))
        self.beta = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        return LigerDyTFunction.apply(x, self.alpha, self.gamma, self.beta)
""", ROWS + """
class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.alpha = nn.Parameter(torch.full((1,), 0.5))
        self.gamma = nn.Parameter(torch.ones(hidden))
        self.beta = nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        return self.gamma * torch.tanh(self.alpha * x) + self.beta


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden]
"""),
    Case("liger/sparsemax", "liger_kernel.ops.sparsemax", ("LigerSparsemaxFunction",), """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return LigerSparsemaxFunction.apply(x, -1)
""", ROWS + """
class Model(nn.Module):
    def forward(self, x):
        z, _ = torch.sort(x, dim=-1, descending=True)
        k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype, device=x.device)
        cumsum = z.cumsum(-1)
        support = (1 + k * z) > cumsum
        k_max = support.sum(-1, keepdim=True)
        tau = (cumsum.gather(-1, k_max - 1) - 1) / k_max.to(x.dtype)
        return torch.clamp(x - tau, min=0)


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return []
"""),
    Case("liger/rope", "liger_kernel.ops.rope", ("LigerRopeFunction",), """
class ModelNew(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return LigerRopeFunction.apply(q, k, cos, sin)
""", """
batch_size = 2
heads = 4
seq = 16
head_dim = 64


def rotate_half(x):
    return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)


class Model(nn.Module):
    def forward(self, q, k, cos, sin):
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def get_inputs():
    angles = torch.rand(1, seq, head_dim // 2) * 6.28
    emb = torch.cat((angles, angles), dim=-1)
    return [torch.randn(batch_size, heads, seq, head_dim), torch.randn(batch_size, heads, seq, head_dim),
            emb.cos(), emb.sin()]


def get_init_inputs():
    return []
"""),
]

TUTORIAL_CASES = [
    Case("tutorial/01-vector-add", "01-vector-add.py", ("add",), """
class ModelNew(torch.nn.Module):
    def forward(self, x, y):
        return add(x, y)
""", """
size = 98432


class Model(nn.Module):
    def forward(self, x, y):
        return x + y


def get_inputs():
    return [torch.rand(size), torch.rand(size)]


def get_init_inputs():
    return []
"""),
    Case("tutorial/02-fused-softmax", "02-fused-softmax.py", ("softmax",), """
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return softmax(x)
""", """
rows = 1823
cols = 781


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
"""),
    Case("tutorial/03-matrix-multiplication", "03-matrix-multiplication.py", ("matmul",), """
class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return matmul(a, b)
""", """
M = 512
K = 512
N = 512


class Model(nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    return [torch.randn(M, K, dtype=torch.float16), torch.randn(K, N, dtype=torch.float16)]


def get_init_inputs():
    return []
"""),
    Case("tutorial/05-layer-norm", "05-layer-norm.py", ("LayerNorm",), """
class ModelNew(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden))
        self.bias = torch.nn.Parameter(torch.zeros(hidden))

    def forward(self, x):
        return LayerNorm.apply(x, (x.shape[-1],), self.weight, self.bias, 1e-5)
""", LAYER_NORM),
]


# -- candidates: a library's definitions, as written, that an entry point needs -------------------------------------
class Source:
    """One module's top-level statements and the names each binds."""

    def __init__(self, path: Path) -> None:
        self.text = path.read_text()
        self.tree = ast.parse(self.text)
        self.binders: dict[str, list[ast.stmt]] = {}
        for stmt in self.tree.body:
            for name in _binds(stmt):
                self.binders.setdefault(name, []).append(stmt)

    def segment(self, stmt: ast.stmt) -> str:
        """The statement as written, decorators and comments inside it included, dedented."""
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        return textwrap.dedent("\n".join(self.text.splitlines()[first - 1:stmt.end_lineno]))


def _binds(stmt: ast.stmt) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    names = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def _reads(stmt: ast.stmt) -> set[str]:
    """The names a statement reads from its module: a function's own parameters and locals left out (roughly: one
    scope per top-level def or class, which is all that matters for finding the module names it needs)."""
    reads = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        local = {a.arg for n in ast.walk(stmt) if isinstance(n, ast.arguments)
                 for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg) if a}
        local |= {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        decorators = {n.id for d in getattr(stmt, "decorator_list", []) for n in ast.walk(d)
                      if isinstance(n, ast.Name)}
        reads = (reads - local) | decorators
    return reads


class Inliner:
    """The statements an entry point needs, gathered across the package's modules, in an order that runs."""

    def __init__(self, package: str | None) -> None:
        self.package = package
        self.sources: dict[str, Source] = {}
        self.taken: dict[str, list[tuple[int, str]]] = {}   # module -> [(position, text)]
        self.order: list[str] = []                            # modules, dependencies first
        self.done: set[tuple[str, str]] = set()

    def source(self, module: str, path: Path | None = None) -> Source:
        if module not in self.sources:
            if path is None:
                spec = importlib.util.find_spec(module)
                path = Path(spec.origin)
            self.sources[module] = Source(path)
        return self.sources[module]

    def need(self, module: str, name: str) -> None:
        if (module, name) in self.done or hasattr(builtins, name) and name not in self.source(module).binders:
            return
        self.done.add((module, name))
        source = self.source(module)
        for stmt in source.binders.get(name, []):
            self.take(module, source, stmt, name)

    def take(self, module: str, source: Source, stmt: ast.stmt, name: str) -> None:
        if isinstance(stmt, ast.ImportFrom) and self.package and (stmt.module or "").startswith(self.package):
            for alias in stmt.names:   # the library's own module: its definition instead of the import
                if (alias.asname or alias.name) == name:
                    if alias.asname and alias.asname != alias.name:
                        raise SystemExit(f"{module}: `import {alias.name} as {alias.asname}` cannot be inlined")
                    self.need(stmt.module, alias.name)
                    self.before(stmt.module, module)
            return
        if isinstance(stmt, ast.Import) and self.package and any(a.name.startswith(self.package)
                                                                 for a in stmt.names):
            raise SystemExit(f"{module}: `{ast.unparse(stmt)}` cannot be inlined")
        if isinstance(stmt, ast.If) and self.package:
            # the library's platform dispatch (Triton version, NPU, XPU): the branch it takes here
            branch = stmt.body if eval(compile(ast.Expression(stmt.test), module, "eval"),
                                       vars(importlib.import_module(module))) else stmt.orelse
            for inner in branch:
                if name in _binds(inner):
                    self.take(module, source, inner, name)
            return
        text = source.segment(stmt)
        entries = self.taken.setdefault(module, [])
        if (stmt.lineno, text) not in entries:
            entries.append((stmt.lineno, text))
        for read in sorted(_reads(stmt) - {name}):
            if read in source.binders:
                self.need(module, read)
        if module not in self.order:
            self.order.append(module)

    def before(self, dependency: str, module: str) -> None:
        """Put a module's definitions before those of a module that imports from it."""
        if dependency in self.order:
            self.order.remove(dependency)
        at = self.order.index(module) if module in self.order else len(self.order)
        self.order.insert(at, dependency)

    def text(self) -> str:
        parts, seen = [], set()
        for module in self.order:
            for _, text in sorted(self.taken[module]):
                if text not in seen:
                    seen.add(text)
                    parts.append(text)
        return "\n\n\n".join(parts) + "\n"


def build_candidate(case: Case, tutorials: Path | None) -> str:
    """The candidate: what the entry points need, as the library or tutorial wrote it, then ModelNew."""
    tutorial = case.origin.endswith(".py")
    inliner = Inliner(None if tutorial else case.origin.split(".")[0])
    if tutorial:
        inliner.source(case.origin, tutorials / case.origin)
    for name in case.entries:
        inliner.need(case.origin, name)
    return "import torch\n\n\n" + inliner.text() + "\n\n" + case.model.strip() + "\n"


# -- installing and judging ------------------------------------------------------------------------------------------
def install(packages: Path) -> None:
    marker = packages / ".installed"
    if marker.exists() and marker.read_text() == LIGER:
        return
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                           str(packages), LIGER], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"pip install {LIGER} failed: {done.stderr.strip().splitlines()[-1:]}")
    marker.write_text(LIGER)


def judge(cases: list[Case], tutorials: Path | None) -> list[tuple[str, str, str]]:
    """Each case's verdict and reason; where the static rules refuse it, the verdict with them off follows (what
    the planner and the replay make of it), so a refusal by the rules alone shows as such."""
    from sandbox.evaluate import EvalSettings, Session, evaluate
    from tools import rules
    from tools.target import load_target

    check_source = rules.check_source
    rows = []
    with Session(spares=0) as session, tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            began = time.monotonic()
            try:
                source = build_candidate(case, tutorials)
            except (SystemExit, OSError, SyntaxError, ImportError) as e:
                rows.append((case.name, "not built", str(e).splitlines()[0][:300]))
                print(f"{case.name:<34} {'not built':<14} {rows[-1][2]}", flush=True)
                continue
            reference = Path(tmp) / f"{case.name.replace('/', '_').replace('-', '_')}.py"
            reference.write_text('"""KernelBench-style reference."""\nimport torch\nimport torch.nn as nn\n'
                                 + case.reference)
            target = load_target(str(reference))
            r = evaluate(target, source, EvalSettings(baselines=("eager",)), session)
            reason = " | ".join(r.reasons)[:300] if r.reasons else "-"
            if check_source(source):
                rules.check_source = lambda source: []
                try:
                    off = evaluate(target, source, EvalSettings(baselines=("eager",)), session)
                finally:
                    rules.check_source = check_source
                reason += f" || without the rules: {off.verdict}" + (f": {off.reasons[0][:200]}" if off.reasons
                                                                      else "")
            rows.append((case.name, r.verdict, reason))
            print(f"{case.name:<34} {r.verdict:<14} {reason}  ({time.monotonic() - began:.0f} s)", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", type=Path, default=Path(tempfile.gettempdir()) / "kloop-public-triton",
                        help="where Liger-Kernel is installed (pip --target); default %(default)s")
    parser.add_argument("--tutorials", type=Path, help="a Triton checkout's python/tutorials")
    parser.add_argument("--only", nargs="*", default=None, help="case names (e.g. liger/rms_norm)")
    parser.add_argument("--show", help="print this case's candidate and exit")
    args = parser.parse_args(argv)
    if args.tutorials and not (args.tutorials / "01-vector-add.py").is_file():
        print(f"error: {args.tutorials} holds no 01-vector-add.py (give a Triton checkout's python/tutorials)",
              file=sys.stderr)
        return 2
    known = {c.name for c in CASES + TUTORIAL_CASES}
    wanted = set(args.only or []) | ({args.show} if args.show else set())
    if wanted - known:
        print(f"error: no case {', '.join(sorted(wanted - known))} (cases: {', '.join(sorted(known))})",
              file=sys.stderr)
        return 2
    install(args.packages)
    sys.path.insert(0, str(args.packages))
    if args.show:
        case = next(c for c in CASES + TUTORIAL_CASES if c.name == args.show)
        print(build_candidate(case, args.tutorials))
        return 0
    for package, state in INDEX.items():
        print(f"# {package}: {state}")
    tutorials = [c for c in TUTORIAL_CASES if args.tutorials and (args.tutorials / c.origin).is_file()]
    for case in TUTORIAL_CASES:
        if args.tutorials and case not in tutorials:
            print(f"# {case.name}: no {case.origin} in {args.tutorials}, skipped")
    cases = [c for c in CASES + tutorials if not args.only or c.name in args.only]
    rows = judge(cases, args.tutorials)
    credited = sum(verdict == "correct" for _, verdict, _ in rows)
    print(f"credited {credited}/{len(rows)} ({credited / max(len(rows), 1):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
