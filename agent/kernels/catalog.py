"""The catalog of starter kernels: one candidate module per file, agent/kernels/<target>/<variant>.py.

Tunables are top-level `NAME = literal` lines near the top of a starter; `render` rewrites them so a policy can
explore a starter's space without touching its code.

Convention of the Triton starters, which `ptx_edits.ptx_candidate_from_triton` relies on to turn a starter's compiled
PTX back into a PTX candidate:
- exactly one `@triton.jit` kernel per module;
- `ModelNew.forward` does only allocation and Python arithmetic (no `triton.*` calls, e.g. no `triton.cdiv`), then
  calls `self.launch(grid, args, constexprs)` once: `grid` a tuple of program counts, `args` the kernel's runtime
  arguments in parameter order, `constexprs` a dict of its `tl.constexpr` arguments;
- `ModelNew.launch` is the only place that launches the kernel:
  `kernel[grid](*args, **constexprs, num_warps=NUM_WARPS[, num_stages=NUM_STAGES])`;
- `NUM_WARPS` (and `NUM_STAGES` where it matters) are module tunables;
- optionally `MASKED_CONSTEXPRS = ("BLOCK_COLS",)`: constexprs the kernel masks against, so that code compiled with a
  larger value is still correct for the launch (a PTX candidate compiled at the main shape then serves smaller rows).
A PTX candidate keeps forward as is and replaces launch: it picks the specialized or the generic PTX (see
ptx_edits), drops the integer arguments the PTX has as the constant 1, appends the two scratch pointers Triton's PTX
takes (passed as NULL), and launches grid x (32 * num_warps) threads with the kernel's dynamic shared memory.
Starters with `ptx_twin=False` (the TMA matmuls: their PTX takes tensor maps or global scratch, which a PtxKernel
launch cannot pass) launch as they like and get no PTX twin.

A starter's `fits(values, gpu)` says why a configuration cannot run well on a GPU (None when it can): the search
sizes its space by the GPU's shared memory per block and SM (the evaluator's `gpu` dict; None: no limit, as under the
CPU interpreter).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable

KERNELS_DIR = Path(__file__).resolve().parent


@dataclass
class Starter:
    name: str                         # "<target>/<variant>"
    target: str
    language: str                     # triton or ptx
    path: Path
    tunables: dict[str, list]         # tunable -> values worth trying (the first is not necessarily the default)
    notes: str
    ptx_twin: bool = True             # follows the launch convention above, so its compiled PTX can stand in for it
    fits: Callable[[dict, dict | None], str | None] | None = None

    @property
    def source(self) -> str:
        return self.path.read_text()


def _starter(target: str, variant: str, tunables: dict[str, list], notes: str, **options) -> Starter:
    language = "ptx" if variant.startswith("ptx") else "triton"
    return Starter(f"{target}/{variant}", target, language, KERNELS_DIR / target / f"{variant}.py", tunables, notes,
                   **options)


_ELEMENTWISE_TRITON = {"BLOCK_SIZE": [1024, 2048, 4096, 8192], "NUM_WARPS": [4, 8, 16],
                       "EVICTION": ["", "evict_first", "evict_last"]}
_ELEMENTWISE_PTX = {"THREADS": [128, 256, 512, 1024], "ELEMS_PER_THREAD": [4, 8, 16, 32],
                    "LOAD_QUALIFIER": ["", ".nc", ".L1::no_allocate"], "STORE_QUALIFIER": ["", ".cs"]}
_ROW_TRITON = {"NUM_WARPS": [4, 8, 16, 32], "ROWS_PER_PROGRAM": [1, 2, 4]}
_LOOPED_TRITON = {"BLOCK_COLS": [512, 1024, 2048, 4096], "NUM_WARPS": [4, 8, 16]}
# Hopper, Triton 3.6 at 8192^3 (ptxas -v): 128x128x64 / 8 warps / 4 stages uses 128 registers and 128 KiB of shared
# memory, and does not spill even compiled generic (odd strides); 128x256x64 at 3 stages uses 220 registers (no
# spills when specialized, 640 B when generic). BLOCK_N comes first so that on a compute-bound kernel the policy's
# first tile step (after one more stage) is BLOCK_N 256.
_MATMUL_TRITON = {"BLOCK_N": [64, 128, 256], "BLOCK_M": [64, 128, 256], "BLOCK_K": [32, 64, 128],
                  "GROUP_M": [4, 8, 16], "NUM_WARPS": [4, 8], "NUM_STAGES": [3, 4, 5]}
# Hopper TMA starters, Triton 3.6 at sm_90 (ptxas -v, no spills): 128x256x64 / 8 warps / 3 stages persistent uses
# 161 registers and 176 KiB of shared memory; warp-specialized 128x256x64 / 4 (+8) warps uses 168 and 208 KiB.
_MATMUL_TMA_PERSISTENT = {"BLOCK_N": [128, 256], "BLOCK_M": [64, 128, 256], "BLOCK_K": [32, 64, 128],
                          "NUM_STAGES": [2, 3, 4, 5], "NUM_WARPS": [4, 8], "GROUP_M": [4, 8, 16],
                          "EPILOGUE_SUBTILE": [False, True], "FLATTEN": [False, True], "PROGRAMS_PER_SM": [1, 2]}
# Warp-specialized with 5 stages gave wrong results on an H100 (Triton 3.6: NaN at BLOCK_N 128, errors of 2.5 at
# BLOCK_K 32; results/matmul-hopper-h100): the evaluator refuses them, so the search does not spend attempts there.
_MATMUL_TMA_WS = {"BLOCK_N": [128, 256], "BLOCK_M": [128, 256], "BLOCK_K": [32, 64, 128], "NUM_STAGES": [2, 3, 4],
                  "GROUP_M": [4, 8, 16], "WARP_SPECIALIZE": [False, True]}
SM90_SMEM_PER_BLOCK = 227 * 1024   # opt-in maximum of one thread block on sm_90 (H100, H200)
SM90_SMEM_PER_SM = 228 * 1024


def matmul_fits(values: dict, gpu: dict | None, tma_epilogue: bool = True) -> str | None:
    """Why a matmul tile configuration would not run well on `gpu`: shared memory per block (the operand ring, plus
    the epilogue's staging tile when C leaves by TMA) or per SM (PROGRAMS_PER_SM programs side by side), or an fp32
    accumulator too big for the consumer warps' registers (more than 128 per thread spills)."""
    bm, bn, bk = values.get("BLOCK_M", 128), values.get("BLOCK_N", 128), values.get("BLOCK_K", 64)
    warps = values.get("NUM_WARPS", 4)
    if values.get("WARP_SPECIALIZE"):
        warps *= 2                     # Triton's Hopper warp specialization: two consumer warp groups
    if bm * bn // (32 * warps) > 128:
        return f"a {bm}x{bn} fp32 accumulator needs {bm * bn // (32 * warps)} registers per thread over {warps} warps"
    if gpu is None:
        return None
    ring = (bm + bn) * bk * 2 * values.get("NUM_STAGES", 3)
    epilogue = bm * bn * 2 // (2 if values.get("EPILOGUE_SUBTILE") else 1) if tma_epilogue else 0
    per_block = gpu.get("smem_per_block_bytes") or SM90_SMEM_PER_BLOCK
    per_sm = gpu.get("smem_per_sm_bytes") or SM90_SMEM_PER_SM
    if ring + epilogue > per_block:
        return f"{(ring + epilogue) // 1024} KiB of shared memory, more than the {per_block // 1024} KiB a block gets"
    if values.get("PROGRAMS_PER_SM", 1) * (ring + epilogue) > per_sm:
        return f"{values['PROGRAMS_PER_SM']} programs of {(ring + epilogue) // 1024} KiB do not fit one SM"
    return None

_pointer_matmul_fits = partial(matmul_fits, tma_epilogue=False)

_ROW_NOTES = "whole row in registers (BLOCK_COLS = next power of two of the row): one read, one write"
_LOOPED_NOTES = "loops over the row in BLOCK_COLS chunks: for rows too long for registers; second pass hits L2"

STARTERS: dict[str, list[Starter]] = {
    "vector_add": [
        _starter("vector_add", "triton_block", _ELEMENTWISE_TRITON, "one block per program, masked tail"),
        _starter("vector_add", "ptx_vec4", _ELEMENTWISE_PTX, "16-byte loads, all issued before the adds"),
    ],
    "gelu": [
        _starter("gelu", "triton_block", _ELEMENTWISE_TRITON, "tl.math.erf (libdevice erff)"),
        _starter("gelu", "ptx_vec4", _ELEMENTWISE_PTX, "16-byte loads, branch-free polynomial erf + ex2.approx"),
    ],
    "softmax": [
        _starter("softmax", "triton_row", _ROW_TRITON, _ROW_NOTES),
        _starter("softmax", "triton_online", _LOOPED_TRITON, "online max/sum pass, then a write pass; " + _LOOPED_NOTES),
    ],
    "layernorm": [
        _starter("layernorm", "triton_row", _ROW_TRITON, _ROW_NOTES + "; exact two-step variance"),
        _starter("layernorm", "triton_looped", _LOOPED_TRITON, "sum and sum of squares, then normalize; " + _LOOPED_NOTES),
    ],
    "rmsnorm": [
        _starter("rmsnorm", "triton_row", _ROW_TRITON, _ROW_NOTES),
        _starter("rmsnorm", "triton_looped", _LOOPED_TRITON, _LOOPED_NOTES),
    ],
    "row_sum": [
        _starter("row_sum", "triton_row", {"NUM_WARPS": [2, 4, 8, 16], "ROWS_PER_PROGRAM": [1, 2, 4]},
                 "a ROWS_PER_PROGRAM x row tile per program, few warps: many 16-byte loads in flight per thread"),
        _starter("row_sum", "triton_looped", _LOOPED_TRITON, "partial sums per lane across chunks, one final reduction"),
        _starter("row_sum", "ptx_vec4", {"THREADS": [128, 256, 512, 1024], "UNROLL": [1, 2, 4, 8],
                                         "LOAD_QUALIFIER": ["", ".nc", ".L1::no_allocate"]},
                 "one CTA per row, 16-byte loads, shuffle + shared-memory reduction; scalar path for unaligned rows"),
    ],
    "matmul_bf16": [
        _starter("matmul_bf16", "triton_tma_persistent", _MATMUL_TMA_PERSISTENT,
                 "persistent programs over GROUP_M-swizzled tiles, TMA loads/stores (device-side descriptors), "
                 "wgmma, subtiled epilogue", ptx_twin=False, fits=matmul_fits),
        _starter("matmul_bf16", "triton_tma_ws", _MATMUL_TMA_WS,
                 "one tile per program, TMA producer warp group + two wgmma consumer groups (warp specialization)",
                 ptx_twin=False, fits=matmul_fits),
        _starter("matmul_bf16", "triton_grouped", _MATMUL_TRITON,
                 "tl.dot (wgmma), fp32 accumulation, GROUP_M swizzle; shared = (BM + BN) * BK * 2 B * stages",
                 fits=_pointer_matmul_fits),
    ],
    "matmul_bias_relu": [
        _starter("matmul_bias_relu", "triton_tma_persistent", _MATMUL_TMA_PERSISTENT,
                 "persistent programs, TMA (host-side descriptors, W K-major), wgmma, bias + ReLU in registers, "
                 "subtiled TMA stores", ptx_twin=False, fits=matmul_fits),
        _starter("matmul_bias_relu", "triton_tma_ws", _MATMUL_TMA_WS,
                 "one tile per program, TMA producer warp group + two wgmma consumer groups, bias + ReLU fused",
                 ptx_twin=False, fits=matmul_fits),
        _starter("matmul_bias_relu", "triton_grouped", _MATMUL_TRITON,
                 "as matmul_bf16, W read K-major via strides, bias + ReLU fused in the epilogue",
                 fits=_pointer_matmul_fits),
    ],
}


def starters_for(target: str) -> list[Starter]:
    """The starters of a built-in target; an empty list for a target with none (a user's own target)."""
    return list(STARTERS.get(target, []))


def _top_level_assignments(source: str) -> dict[str, ast.Assign]:
    return {node.targets[0].id: node for node in ast.parse(source).body
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)}


def default_values(starter: Starter) -> dict:
    """The tunables' values as the starter's file sets them."""
    assignments = _top_level_assignments(starter.source)
    return {name: ast.literal_eval(assignments[name].value) for name in starter.tunables}


def render(starter: Starter, values: dict) -> str:
    """The starter's source with each `NAME = value` tunable line rewritten (comments after the value are kept)."""
    unknown = sorted(set(values) - set(starter.tunables))
    if unknown:
        raise ValueError(f"{starter.name} has no tunable(s) {', '.join(unknown)}; "
                         f"its tunables: {', '.join(starter.tunables)}")
    source = starter.source
    assignments = _top_level_assignments(source)
    lines = source.splitlines(keepends=True)
    for name, value in values.items():
        if not isinstance(value, (bool, int, float, str)):
            raise ValueError(f"{starter.name}: tunable {name} must be a bool, int, float or str, got {value!r}")
        node = assignments[name].value
        if node.lineno != node.end_lineno:
            raise ValueError(f"{starter.name}: tunable {name} spans several lines and cannot be rewritten")
        line = lines[node.lineno - 1].encode()  # ast column offsets count UTF-8 bytes
        lines[node.lineno - 1] = (line[:node.col_offset] + repr(value).encode() + line[node.end_col_offset:]).decode()
    return "".join(lines)
