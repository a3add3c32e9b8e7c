"""Is a training target one of the evaluation problems? Decided on the op it computes, not on its bytes.

Benchmarks change between releases (sizes, constants, comments, a docstring), so an exact source hash misses every
problem of an older checkout. A problem here is known by:
  op        the aten ops its reference's forward runs, in order, each with its tensor arguments' ranks and its flags,
            traced on the meta device (no data, no GPU) under a TorchDispatchMode, with sizes and numbers abstracted
            (23_Softmax's softmax(dim=1) over (16, 16384) and a softmax(dim=-1) over (8192, 8192) are one op)
  source    its source without comments, docstrings and layout, with number literals and module-level constant
            names renamed: an exact key, and 5-token shingles for a near-duplicate test where the op cannot be traced

A problem of the same name (the file's stem: a run of 38_L1Norm_ and level1/38_L1Norm_.py) matches first, as a
release may fix a reference's math (KernelBench's L1 norm went from a sum to a mean). Otherwise, where both ops were
traced, they decide: the same op graph matches, and two that differ never match on the source
(KernelBench's ReLU and Sigmoid differ by one token; a renamed constant may be a flag that changes the op). Where
either could not be traced, the same normalized source matches, or a near duplicate (5-token shingles' Jaccard >=
NEAR_DUPLICATE).
"""
from __future__ import annotations

import hashlib
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

NEAR_DUPLICATE = 0.8
SHINGLE = 5
_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}


class DecontaminationError(Exception):
    """An evaluation problem that cannot be read: one line for the user."""


@dataclass(frozen=True)
class Problem:
    name: str                      # where it came from: a file, or a run's target name
    source_key: str                # sha256 of the normalized source
    op: str | None                 # sha256 of the traced op graph; None when it could not be traced
    ops: tuple[str, ...]           # the graph's op names in order, for reports
    shingles: frozenset
    trace_error: str | None = None

    @property
    def group(self) -> str:
        """The key a split keeps on one side: the op where traced, else the normalized source."""
        return f"op:{self.op}" if self.op else f"source:{self.source_key}"


def problem(source: str, name: str) -> Problem:
    """A problem (or a run's target) from its KernelBench-style source; cached by source."""
    key = hashlib.sha256(source.encode()).hexdigest()
    if key not in _CACHE:
        tokens = normalized_tokens(source)
        graph, error = op_graph(source)
        _CACHE[key] = Problem(
            name=name, source_key=hashlib.sha256(" ".join(tokens).encode()).hexdigest(),
            op=hashlib.sha256("|".join(graph).encode()).hexdigest() if graph else None,
            ops=tuple(dict.fromkeys(node.split("(")[0] for node in graph or ())),
            shingles=frozenset(tuple(tokens[i:i + SHINGLE]) for i in range(max(1, len(tokens) - SHINGLE + 1))),
            trace_error=error)
    cached = _CACHE[key]
    return cached if cached.name == name else Problem(name, cached.source_key, cached.op, cached.ops, cached.shingles,
                                                      cached.trace_error)


_CACHE: dict[str, Problem] = {}


def match(target: Problem, problems: Iterable[Problem]) -> tuple[Problem, str] | None:
    """The evaluation problem the target matches, and why; None when it matches none. A problem of the same name
    (a run of KernelBench's 38_L1Norm_ and level1/38_L1Norm_.py) goes first: a release may fix a reference's math."""
    problems = list(problems)
    stem = Path(target.name).stem
    for other in problems:
        if Path(other.name).stem == stem:
            return other, "the same problem name" + (" and op graph" if target.op and target.op == other.op else "")
    near = None
    for other in problems:
        if target.op and other.op:   # both traced: the op decides (a constant may be a flag that changes it)
            if target.op == other.op:
                return other, f"the same op graph ({', '.join(target.ops) or 'no ops'}; sizes and numbers abstracted)"
            continue
        untraced = target if target.op is None else other
        if target.source_key == other.source_key:
            return other, (f"the same source (comments, docstrings, layout and constants aside; op graph unknown, "
                           f"{untraced.name}: {untraced.trace_error})")
        similarity = jaccard(target.shingles, other.shingles)
        if similarity >= NEAR_DUPLICATE and (near is None or similarity > near[1]):
            near = (other, similarity, f"{untraced.name}: {untraced.trace_error}")
    if near:
        return near[0], f"a near-duplicate source (similarity {near[1]:.2f}; op graph unknown, {near[2]})"
    return None


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def load_problems(paths: Iterable[str | Path]) -> list[Problem]:
    """Every KernelBench-style .py file in the given files and folders (recursively), as problems."""
    problems = []
    for path in map(Path, paths):
        if path.is_dir():
            files = sorted(p for p in path.rglob("*.py") if p.is_file())
        elif path.is_file():
            files = [path]
        else:
            raise DecontaminationError(f"--exclude {path}: no such file or folder")
        for file in files:
            try:
                source = file.read_text()
            except (OSError, UnicodeDecodeError) as e:
                raise DecontaminationError(f"--exclude {file}: cannot read it ({e})") from None
            problems.append(problem(source, str(file.relative_to(path) if path.is_dir() else file.name)))
    return problems


def normalized_tokens(source: str) -> list[str]:
    """The source's tokens without comments, docstrings and layout; number literals become 0 and names assigned at
    module level (sizes, constants) become C. Text that is not Python is split on whitespace."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return source.split()
    constants = _module_constants(tokens)
    out, previous = [], tokenize.NEWLINE
    for tok in tokens:
        if tok.type == tokenize.STRING and previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            previous = tokenize.STRING   # a string statement: a docstring
            continue
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            previous = tok.type
        if tok.type in _LAYOUT:
            continue
        out.append("0" if tok.type == tokenize.NUMBER else "C" if tok.type == tokenize.NAME and tok.string in
                   constants else tok.string)
    return out


def _module_constants(tokens: list[tokenize.TokenInfo]) -> set[str]:
    """Names assigned at column 0 (`batch_size = 16`, `M, N = 64, 32`) other than classes and functions."""
    names, line_start = set(), True
    for i, tok in enumerate(tokens):
        if tok.type in (tokenize.NEWLINE, tokenize.NL):
            line_start = True
            continue
        if line_start and tok.type == tokenize.NAME and tok.start[1] == 0:
            j = i
            while j < len(tokens) and (tokens[j].type == tokenize.NAME or tokens[j].string == ","):
                j += 1
            if j < len(tokens) and tokens[j].string == "=":
                names.update(t.string for t in tokens[i:j] if t.type == tokenize.NAME)
        line_start = False
    return names


def op_graph(source: str) -> tuple[list[str] | None, str | None]:
    """The aten ops the reference's forward runs on meta tensors, each as `name(args)` with a tensor argument written
    as its rank (T2), a flag or a string as itself (a transposed convolution, a sum's reduction) and any number or
    size as _; (None, why) when it cannot run there."""
    try:
        import warnings

        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        from tools.target import module_from_source
    except ImportError as e:
        return None, f"no torch ({e})"

    if not re.search(r"^class Model\b", source, re.M) or not re.search(r"^def get_inputs\b", source, re.M):
        return None, "not a KernelBench-style module (no class Model and get_inputs): not run"
    graph: list[str] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            flat, _ = tree_flatten((args, kwargs or {}))
            kinds = [f"T{a.dim()}" if isinstance(a, torch.Tensor) else repr(a) if isinstance(a, (bool, str))
                     else "_" for a in flat]
            graph.append(f"{func.overloadpacket.__name__}({','.join(kinds)})")
            return func(*args, **(kwargs or {}))

    name = f"kloop_decontaminate_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    try:
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]), torch.no_grad(), torch.device("meta"):
            warnings.simplefilter("ignore")
            module = module_from_source(source, {}, name)
            inputs = module.get_inputs()
            model = module.Model(*module.get_init_inputs())
            with Recorder():
                model(*inputs)
    except Exception as e:   # data-dependent control flow, a host read, an op without a meta kernel, a bad file
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    return graph, None
