"""PTX-level edits for the offline policy: cache-hint variants of compiled PTX, a Triton starter's kernel compiled to
PTX without a GPU, and a PTX candidate module that launches such PTX the way the Triton starter launched its kernel
(see the launch convention in agent/kernels/catalog.py).

Like Triton's own launcher, a generated PTX candidate carries two compilations of the kernel: one specialized the way
the launcher specializes the main shape's launch (16-byte-aligned pointers, integers that are multiples of 16 or equal
to 1), and a generic one that assumes nothing about the arguments. At each launch it takes the first whose assumptions
the arguments meet (cheap checks: data_ptr() % 16, n % 16, n == 1) and raises for a launch neither was compiled for."""
from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

# A global load/store with no cache qualifier yet: the type (optionally vectorized) follows `.global.` directly.
_PLAIN_LOAD = re.compile(r"\bld\.global\.(?=(?:v[248]\.)?[bfsu]\d+\b)")
_PLAIN_STORE = re.compile(r"\bst\.global\.(?=(?:v[248]\.)?[bfsu]\d+\b)")

_LOAD_HINTS = {
    "loads_nc": "nc.",                        # read-only (texture) path; only valid for data the kernel never writes
    "loads_l1_no_allocate": "L1::no_allocate.",
    "loads_l1_evict_first": "L1::evict_first.",
}
_STORE_HINTS = {"stores_cs": "cs."}           # streaming store: evict first from L1 and L2


def cache_hint_variants(ptx: str) -> dict[str, str]:
    """Variants of `ptx` with cache qualifiers added to its plain global loads and/or stores.

    Only variants that change the text are returned. `loads_nc` assumes no loaded buffer is written by the kernel.
    """
    variants = {}
    for name, hint in _LOAD_HINTS.items():
        variants[name] = _PLAIN_LOAD.sub(r"ld.global." + hint, ptx)
    for name, hint in _STORE_HINTS.items():
        variants[name] = _PLAIN_STORE.sub(r"st.global." + hint, ptx)
    variants["loads_nc_stores_cs"] = _PLAIN_STORE.sub("st.global.cs.", variants["loads_nc"])
    return {name: text for name, text in variants.items() if text != ptx}


def entry_param_bytes(ptx: str, entry: str) -> list[int]:
    """Byte size of each `.param` of `.entry entry(...)` in order."""
    match = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\(([^)]*)\)", ptx)
    if match is None:
        raise ValueError(f"the PTX has no .entry {entry}")
    sizes = re.findall(r"\.param\s+\.[bsuf](8|16|32|64)\b", match.group(1))
    return [int(bits) // 8 for bits in sizes]


@dataclass
class TritonPtx:
    """One compilation of a Triton starter's kernel, and the launches it is valid for."""
    ptx: str
    entry: str
    num_warps: int
    num_stages: int
    shared_bytes: int
    constexprs: dict          # the launch's constexpr arguments it was compiled with
    ones: list[int]           # runtime-argument indices compiled as the constant 1 (they are not PTX parameters)
    divisible: list[int]      # integer runtime-argument indices assumed to be multiples of 16
    aligned: bool             # every pointer argument assumed 16-byte aligned


_TRITON_TYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                 "torch.int32": "i32", "torch.int64": "i64", "torch.int8": "i8", "torch.uint8": "u8"}
GENERIC_SUFFIX = "_generic"   # the generic compilation's entry name: a module's entries must differ


def _import_source(source: str):
    # @triton.jit reads its function's source from disk when it decorates, so the module is imported from a file.
    name = f"kloop_starter_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="kloop-starter-") as directory:
        path = Path(directory) / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            del sys.modules[name]
    return module


def _ptx_version(arch: int, max_ptx_version: int) -> int | None:
    """The PTX ISA version to emit: Triton's default for its own ptxas (which assembles the PTX inside
    triton.compile: CUDA 12.8 in Triton 3.6, 13.x in 3.9), capped at what kloop's ptxas reads."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas, ptx_get_version
        return min(max_ptx_version, ptx_get_version(get_ptxas(arch).version))
    except (ImportError, AttributeError, TypeError, ValueError, RuntimeError, OSError) as e:  # keep its default
        print(f"kloop: cannot read Triton's ptxas version ({e}); using Triton's default PTX version", file=sys.stderr)
        return None


def compile_triton_starter(source: str, init_inputs: list, inputs: list, specialize: bool, arch: int = 90,
                           max_ptx_version: int = 90) -> TritonPtx:
    """Compile a Triton starter's kernel to PTX for sm_`arch` with no GPU, for the launch its forward would make.

    forward runs on the given (CPU) inputs with the launch intercepted, so only its allocations execute.
    `specialize=True` does what Triton's launcher does for this launch: pointers 16-byte aligned, integers equal to 1
    become constants, multiples of 16 are marked divisible (faster code, e.g. vector loads); `specialize=False`
    assumes nothing, so the PTX is valid for every argument value (its entry gets GENERIC_SUFFIX).
    `max_ptx_version` 90 is the newest PTX ISA ptxas 13.0 reads. Works with Triton 3.6 through 3.9.
    """
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    if triton.knobs.runtime.interpret:
        # The interpreter has replaced triton.language's own jit functions (tl.max, tl.sum, ...) in this process.
        raise RuntimeError("compile_triton_starter cannot run with TRITON_INTERPRET=1; use compile_for_target, "
                           "which compiles in a process without it")
    module = _import_source(source)
    kernels = [v for v in vars(module).values() if isinstance(v, JITFunction)]
    if len(kernels) != 1:
        raise ValueError(f"a Triton starter must define exactly one @triton.jit kernel, found {len(kernels)}")
    kernel = kernels[0]
    model = module.ModelNew(*init_inputs)
    launches = []
    model.launch = lambda grid, args, constexprs: launches.append((grid, list(args), dict(constexprs)))
    with torch.no_grad():
        model(*inputs)
    if len(launches) != 1:
        raise ValueError(f"ModelNew.forward must call self.launch once, called it {len(launches)} times")
    _, args, constexprs = launches[0]

    signature, constants, attrs, ones, divisible = _launch_signature(kernel, args, constexprs, specialize)
    num_warps = int(getattr(module, "NUM_WARPS", 4))
    num_stages = int(getattr(module, "NUM_STAGES", 3))
    options = {"num_warps": num_warps, "num_stages": num_stages}
    ptx_version = _ptx_version(arch, max_ptx_version)
    if ptx_version is not None:
        options["ptx_version"] = ptx_version
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    ptx, entry = compiled.asm["ptx"], compiled.metadata.name
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if getattr(compiled.metadata, scratch, 0):  # the PTX candidate passes NULL for Triton's scratch pointers
            raise ValueError(f"{entry} needs Triton {scratch.replace('_', ' ')} {getattr(compiled.metadata, scratch)}"
                             " bytes, which a PTX candidate does not allocate")
    if not specialize:
        ptx = re.sub(r"\b" + re.escape(entry) + r"\b", entry + GENERIC_SUFFIX, ptx)
        entry += GENERIC_SUFFIX
    return TritonPtx(ptx, entry, num_warps, num_stages, int(compiled.metadata.shared), dict(constexprs), ones,
                     divisible, specialize)


def _launch_signature(kernel, args: list, constexprs: dict, specialize: bool) -> tuple[dict, dict, dict, list, list]:
    """Triton's signature, constants and attributes for this launch (see compile_triton_starter's `specialize`), with
    the positions of the runtime arguments that became the constant 1 and of those marked divisible by 16."""
    import torch

    runtime_names = [p.name for p in kernel.params if not p.is_constexpr]
    if len(runtime_names) != len(args):
        raise ValueError(f"{kernel.__name__} takes {len(runtime_names)} runtime arguments, launch passed {len(args)}")
    signature, constants, attrs, ones, divisible = {}, dict(constexprs), {}, [], []
    for index, param in enumerate(kernel.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            continue
        arg_index = runtime_names.index(param.name)
        value = args[arg_index]
        if isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _TRITON_TYPES[str(value.dtype)]
            if specialize:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            if specialize and value == 1:  # Triton's launcher makes it a constant, out of the parameter list
                signature[param.name] = "constexpr"
                constants[param.name] = 1
                ones.append(arg_index)
                continue
            signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if specialize and value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
                divisible.append(arg_index)
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise ValueError(f"argument {param.name} has unsupported type {type(value).__name__}")
    return signature, constants, attrs, ones, divisible


def compile_for_target(source: str, target: str, small: bool = False, timeout_s: float = 300) -> list[TritonPtx]:
    """The Triton starter `source` compiled for the main shape of `target` (a load_target spec): the specialized
    compilation, then the generic one. Runs in a fresh process without TRITON_INTERPRET (no GPU needed);
    `small` uses the target's CPU-sized main shape."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "agent.kernels.ptx_edits", target] + (["--small"] if small else [])
    try:
        done = subprocess.run(command, input=source, capture_output=True, text=True, env=env, cwd=repo,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"compiling the Triton starter to PTX took over {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise RuntimeError(f"compiling the Triton starter to PTX failed:\n{done.stderr[-4000:]}")
    return [TritonPtx(**fields) for fields in json.loads(done.stdout.strip().splitlines()[-1])]


def _compile_main(target_spec: str, small: bool) -> None:
    from tools.target import load_target

    source = sys.stdin.read()
    target = load_target(target_spec)
    module = target.module_for(target.shapes(small=small)[0])
    init_inputs, inputs = module.get_init_inputs(), module.get_inputs()
    compiled = [compile_triton_starter(source, init_inputs, inputs, specialize=s) for s in (True, False)]
    print(json.dumps([dataclasses.asdict(c) for c in compiled]))


_PTX_LAUNCH = """
def launch(self, grid, args, constexprs):
    # Triton appends two scratch pointers (global, profile) to its kernels' parameters: they go as NULL.
    for variant, kernel in zip(PTX_VARIANTS, self.ptx_kernels):
        if ptx_variant_fits(variant, kernel, args, constexprs):
            params = [a for i, a in enumerate(args) if i not in variant['ones']]
            sizes = PTX_PARAM_BYTES[variant['entry']]
            values = [np.int64(a) if type(a) is int and size == 8 else a for a, size in zip(params, sizes)]
            grid = tuple(grid) + (1,) * (3 - len(grid))
            kernel.launch(grid, (32 * variant['num_warps'], 1, 1), values + [None, None],
                          shared_mem=variant['shared_bytes'])
            return
    compiled = [v['constexprs'] for v in PTX_VARIANTS]
    raise RuntimeError(f"no compiled PTX fits this launch (constexprs {constexprs}); it has {compiled}")
"""

_PTX_FITS = """
def ptx_variant_fits(variant, kernel, args, constexprs):
    # A masked constexpr (e.g. BLOCK_COLS) compiled larger than the launch asks for still computes the right thing.
    compiled = variant['constexprs']
    if set(compiled) != set(constexprs):
        return False
    for name, value in constexprs.items():
        if compiled[name] != value and not (name in PTX_MASKED_CONSTEXPRS and compiled[name] > value):
            return False
    if variant['aligned'] and any(isinstance(a, torch.Tensor) and a.data_ptr() % 16 for a in args):
        return False
    if any(not (type(args[i]) is int and args[i] == 1) for i in variant['ones']):
        return False
    if any(args[i] % 16 for i in variant['divisible']):
        return False
    params = [a for i, a in enumerate(args) if i not in variant['ones']]
    sizes = PTX_PARAM_BYTES[variant['entry']]
    return len(params) + 2 == len(sizes) and all(
        not (type(a) is int and size == 4 and not -2**31 <= a < 2**31) for a, size in zip(params, sizes))
"""


def _is_triton_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return all(alias.name.split(".")[0] == "triton" for alias in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton"


def _is_jit(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)


def _masked_constexprs(tree: ast.Module) -> tuple:
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "MASKED_CONSTEXPRS"):
            return tuple(ast.literal_eval(node.value))
    return ()


def ptx_candidate_from_triton(triton_source: str, compiled: list[TritonPtx]) -> str:
    """Source of a PTX candidate that runs the compiled kernels of the Triton starter `triton_source` with the
    starter's own forward (same allocations, grid and arguments). At each launch it takes the first of `compiled`
    whose assumptions the arguments meet (so: specialized first, generic last) and raises if none does. The starter
    must follow the launch convention in agent/kernels/catalog.py."""
    if not compiled:
        raise ValueError("no compiled PTX given")
    entries = [c.entry for c in compiled]
    if len(set(entries)) != len(entries):
        raise ValueError(f"the compiled PTX texts must have distinct entry names, got {entries}")
    param_bytes = {c.entry: entry_param_bytes(c.ptx, c.entry) for c in compiled}
    tree = ast.parse(triton_source)
    body = [node for node in tree.body if not _is_triton_import(node) and not _is_jit(node)]
    model = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if model is None:
        raise ValueError("the Triton source defines no ModelNew class")
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    if "launch" not in methods:
        raise ValueError("ModelNew has no launch(self, grid, args, constexprs) method (see agent/kernels/catalog.py)")
    model.body[model.body.index(methods["launch"])] = ast.parse(_PTX_LAUNCH).body[0]
    build = ast.parse("self.ptx_kernels = [PtxKernel(text, v['entry']) for text, v in zip(PTX_TEXTS, PTX_VARIANTS)]"
                      ).body[0]
    if "__init__" in methods:
        methods["__init__"].body.append(build)
    else:
        init = ast.parse("def __init__(self):\n    super().__init__()").body[0]
        init.body.append(build)
        model.body.insert(0, init)

    variants = [{"entry": c.entry, "num_warps": c.num_warps, "shared_bytes": c.shared_bytes,
                 "constexprs": c.constexprs, "ones": c.ones, "divisible": c.divisible, "aligned": c.aligned}
                for c in compiled]
    header = ast.parse(
        "import numpy as np\nfrom tools.launch import PtxKernel\n"
        f"PTX_VARIANTS = {variants!r}\nPTX_PARAM_BYTES = {param_bytes!r}\n"
        f"PTX_MASKED_CONSTEXPRS = {_masked_constexprs(tree)!r}\nPTX_TEXTS = None\n").body
    header[-1].value = ast.List([ast.Constant(c.ptx) for c in compiled], ast.Load())
    tree.body = header + body + ast.parse(_PTX_FITS).body
    leftover = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("triton", "tl")})
    if leftover:
        raise ValueError(f"the Triton source uses {', '.join(leftover)} outside its kernel; forward must not")
    source = ast.unparse(ast.fix_missing_locations(tree))
    return f'"""PTX candidate generated from a Triton starter\'s compiled kernel {entries[0]}."""\n' + source + "\n"


if __name__ == "__main__":  # python -m agent.kernels.ptx_edits TARGET [--small] < starter.py (see compile_for_target)
    _compile_main(sys.argv[1], "--small" in sys.argv[2:])
