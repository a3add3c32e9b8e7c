"""PTX-level edits for the offline policy: cache-hint variants of compiled PTX, a Triton starter's kernel compiled to
PTX without a GPU, and a PTX candidate module that launches such PTX the way the Triton starter launched its kernel
(see the launch convention in agent/kernels/catalog.py)."""
from __future__ import annotations

import ast
import importlib.util
import re
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
    ptx: str
    entry: str
    num_warps: int
    num_stages: int
    shared_bytes: int


_TRITON_TYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                 "torch.int32": "i32", "torch.int64": "i64", "torch.int8": "i8", "torch.uint8": "u8"}


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


def compile_triton_starter(source: str, init_inputs: list, inputs: list, arch: int = 90,
                           ptx_version: int = 90, specialize_divisibility: bool = False) -> TritonPtx:
    """Compile a Triton starter's kernel to PTX for sm_`arch` with no GPU, for the launch its forward would make.

    forward runs on the given (CPU) inputs with the launch intercepted, so only its allocations execute. Pointers
    are assumed 16-byte aligned, as fresh torch allocations are. By default integer arguments are not specialized
    on divisibility by 16, so the PTX stays valid for every size; `specialize_divisibility=True` does what Triton's
    launcher does (faster code, e.g. pipelined cp.async in matmuls) but the PTX is then wrong for sizes that are
    not multiples of 16 where these were. `ptx_version` 90 is the newest PTX ISA ptxas 13.0 reads.
    """
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from triton.runtime.jit import JITFunction

    if triton.knobs.runtime.interpret:
        # The interpreter has replaced triton.language's own jit functions (tl.max, tl.sum, ...) in this process.
        raise RuntimeError("compile_triton_starter cannot run with TRITON_INTERPRET=1; use a process without it")
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

    signature, constants, attrs = {}, dict(constexprs), {}
    runtime_names = [p.name for p in kernel.params if not p.is_constexpr]
    if len(runtime_names) != len(args):
        raise ValueError(f"{kernel.__name__} takes {len(runtime_names)} runtime arguments, launch passed {len(args)}")
    for index, param in enumerate(kernel.params):
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            continue
        value = args[runtime_names.index(param.name)]
        if isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _TRITON_TYPES[str(value.dtype)]
            attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            if value == 1:  # as Triton's launcher does: 1 becomes a constant and leaves the parameter list
                signature[param.name] = "constexpr"
                constants[param.name] = 1
            else:
                signature[param.name] = "i32" if -2**31 <= value < 2**31 else "i64"
                if specialize_divisibility and value % 16 == 0:
                    attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise ValueError(f"argument {param.name} has unsupported type {type(value).__name__}")
    num_warps = int(getattr(module, "NUM_WARPS", 4))
    num_stages = int(getattr(module, "NUM_STAGES", 3))
    compiled = triton.compile(ASTSource(kernel, signature, constants, attrs),
                              target=GPUTarget("cuda", arch, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages, "ptx_version": ptx_version})
    return TritonPtx(compiled.asm["ptx"], compiled.metadata.name, num_warps, num_stages, compiled.metadata.shared)


_PTX_LAUNCH = '''
def launch(self, grid, args, constexprs):
    # Triton turns integer arguments equal to 1 into constants and appends two scratch pointers (global, profile).
    params = [a for a in args if not (type(a) is int and a == 1)]
    if len(params) + 2 != len(PTX_PARAM_BYTES):
        raise RuntimeError(f"{PTX_ENTRY} takes {len(PTX_PARAM_BYTES) - 2} kernel arguments, the launch passes "
                           f"{len(params)}: the PTX was compiled for another specialization")
    values = [np.int64(a) if type(a) is int and size == 8 else a for a, size in zip(params, PTX_PARAM_BYTES)]
    grid = tuple(grid) + (1,) * (3 - len(grid))
    self.ptx_kernel.launch(grid, (PTX_THREADS, 1, 1), values + [None, None], shared_mem=PTX_SHARED_BYTES)
'''


def _is_triton_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import):
        return all(alias.name.split(".")[0] == "triton" for alias in node.names)
    return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton"


def _is_jit(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)


def ptx_candidate_from_triton(triton_source: str, ptx: str, entry: str, num_warps: int, shared_bytes: int) -> str:
    """Source of a PTX candidate that runs `ptx` (the compiled kernel of the Triton starter `triton_source`) with the
    starter's own forward: same allocations, grid and arguments, 32 * num_warps threads, `shared_bytes` of dynamic
    shared memory. The starter must follow the launch convention in agent/kernels/catalog.py."""
    param_bytes = entry_param_bytes(ptx, entry)
    tree = ast.parse(triton_source)
    body = [node for node in tree.body if not _is_triton_import(node) and not _is_jit(node)]
    model = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"), None)
    if model is None:
        raise ValueError("the Triton source defines no ModelNew class")
    methods = {n.name: n for n in model.body if isinstance(n, ast.FunctionDef)}
    if "launch" not in methods:
        raise ValueError("ModelNew has no launch(self, grid, args, constexprs) method (see agent/kernels/catalog.py)")
    model.body[model.body.index(methods["launch"])] = ast.parse(_PTX_LAUNCH).body[0]
    build = ast.parse("self.ptx_kernel = PtxKernel(PTX, PTX_ENTRY)").body[0]
    if "__init__" in methods:
        methods["__init__"].body.append(build)
    else:
        init = ast.parse("def __init__(self):\n    super().__init__()").body[0]
        init.body.append(build)
        model.body.insert(0, init)

    header = ast.parse(
        "import numpy as np\nfrom tools.launch import PtxKernel\n"
        f"PTX_ENTRY = {entry!r}\nPTX_PARAM_BYTES = {param_bytes!r}\nPTX_THREADS = {32 * num_warps}\n"
        f"PTX_SHARED_BYTES = {int(shared_bytes)}\nPTX = None\n").body
    header[-1].value = ast.Constant(ptx)
    tree.body = header + body
    leftover = sorted({n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in ("triton", "tl")})
    if leftover:
        raise ValueError(f"the Triton source uses {', '.join(leftover)} outside its kernel; forward must not")
    source = ast.unparse(ast.fix_missing_locations(tree))
    return f'"""PTX candidate generated from a Triton starter\'s compiled kernel {entry}."""\n' + source + "\n"
