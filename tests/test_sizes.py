"""Sizes, checked on every module of agent/, sandbox/ and tools/ (parsed with `ast`, never imported): a function
longer than MAX_LINES lines says why in its docstring, in a sentence that starts with REASON."""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("agent", "sandbox", "tools")
MAX_LINES = 80
REASON = "Over 80 lines:"


def unexplained_long_functions(path: Path, root: Path = REPO) -> list[str]:
    """'file:line name (N lines)' for each function (nested ones too) over MAX_LINES lines without REASON in its
    docstring."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno > MAX_LINES:
            if REASON not in (ast.get_docstring(node) or ""):
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {node.name} "
                             f"({node.end_lineno - node.lineno} lines)")
    return found


def test_every_function_over_80_lines_says_why():
    found = [f for layer in LAYERS for path in sorted((REPO / layer).rglob("*.py"))
             if "__pycache__" not in path.parts for f in unexplained_long_functions(path)]
    assert not found, (f"functions over {MAX_LINES} lines: split them, or say why in the docstring "
                       f"('{REASON} ...'):\n" + "\n".join(found))


def test_the_check_sees_nested_functions_and_the_reason(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(
        f"def short():\n{body}\n"                                              # 80 lines after its def: allowed
        f"def long():\n    y = 0\n{body}\n"                                     # 81
        f"def explained():\n    '''Big. {REASON} a table.'''\n{body}\n"
        f"def outer():\n    def inner():\n        '''Nested, {REASON} too.'''\n{body.replace('    ', '        ')}"
        f"        y = 0\n    return inner\n")
    # inner's reason is its own: outer, 84 lines long around it, still needs one
    assert unexplained_long_functions(tmp_path / "m.py", tmp_path) == ["m.py:83 long (81 lines)",
                                                                       "m.py:249 outer (84 lines)"]
