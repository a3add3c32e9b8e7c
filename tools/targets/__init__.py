"""Built-in kloop targets: KernelBench modules, one file per op, in the order the CLI lists them."""
from __future__ import annotations

from pathlib import Path

BUILTIN_TARGETS = [
    "vector_add",
    "gelu",
    "softmax",
    "layernorm",
    "rmsnorm",
    "row_sum",
    "matmul_bf16",
    "matmul_bias_relu",
]

_HERE = Path(__file__).resolve().parent


def path_of(name: str) -> Path:
    """The source file of built-in target `name`."""
    if name not in BUILTIN_TARGETS:
        raise ValueError(f"unknown built-in target {name!r}; built-ins: {', '.join(BUILTIN_TARGETS)}")
    return _HERE / f"{name}.py"
