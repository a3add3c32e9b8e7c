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
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent


@dataclass
class Starter:
    name: str                         # "<target>/<variant>"
    target: str
    language: str                     # triton or ptx
    path: Path
    tunables: dict[str, list]         # tunable -> values worth trying (the first is not necessarily the default)
    notes: str

    @property
    def source(self) -> str:
        return self.path.read_text()


def _starter(target: str, variant: str, tunables: dict[str, list], notes: str) -> Starter:
    language = "ptx" if variant.startswith("ptx") else "triton"
    return Starter(f"{target}/{variant}", target, language, KERNELS_DIR / target / f"{variant}.py", tunables, notes)


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
        _starter("matmul_bf16", "triton_grouped", _MATMUL_TRITON,
                 "tl.dot (wgmma), fp32 accumulation, GROUP_M swizzle; shared = (BM + BN) * BK * 2 B * stages"),
    ],
    "matmul_bias_relu": [
        _starter("matmul_bias_relu", "triton_grouped", _MATMUL_TRITON,
                 "as matmul_bf16, W read K-major via strides, bias + ReLU fused in the epilogue"),
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
