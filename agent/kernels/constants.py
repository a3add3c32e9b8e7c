r"""A kernel module's tunable constants: its UPPERCASE top-level names bound to a number literal on one line, read
and rewritten in place (a seed kernel's or an Inductor starter's tunables).

    >>> replace_constants("BLOCK = 128\nx = BLOCK * 2\n", {"BLOCK": 256})
    'BLOCK = 256\nx = BLOCK * 2\n'
"""
from __future__ import annotations

import ast
from typing import Any


def constants(tree: ast.Module) -> list[tuple[str, Any, ast.expr]]:
    """(name, value, the value's node) of each such constant, in source order."""
    found = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.isupper() and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, (int, float)) and node.value.lineno == node.value.end_lineno):
            found.append((node.targets[0].id, node.value.value, node.value))
    return found


def replace_constants(source: str, values: dict) -> str:
    """source with the constants named in `values` set to them; other names are left alone."""
    lines = source.split("\n")
    for name, _old, node in sorted(constants(ast.parse(source)), key=lambda c: -c[2].col_offset):
        if name in values:
            line = lines[node.lineno - 1]
            lines[node.lineno - 1] = line[:node.col_offset] + repr(values[name]) + line[node.end_col_offset:]
    return "\n".join(lines)
