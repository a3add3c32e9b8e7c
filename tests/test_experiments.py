"""tests/experiments/ holds scripts run by hand, mostly on a GPU, so nothing else notices when kloop moves a name they
use (`from tools import bench` outlived the records' move to tools/records/). Checked without running them: every
kloop name they import exists, and every script the README and docs/design.md name is there."""
from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPERIMENTS = REPO / "tests" / "experiments"
LAYERS = ("agent", "sandbox", "tools")


def exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:   # a parent that is missing or is a module, not a package
        return False


def top_level_names(module: str) -> set[str]:
    """The names a module defines or imports at its top level, read from its source (nothing is imported)."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return names


def missing_imports(source: str) -> list[str]:
    """Each kloop module or name the source imports that kloop does not have, with its line."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in LAYERS:
            if not exists(node.module):
                missing.append(f"line {node.lineno}: {node.module}")
                continue
            defined = top_level_names(node.module)
            missing += [f"line {node.lineno}: {node.module}.{alias.name}" for alias in node.names
                        if alias.name not in defined and not exists(f"{node.module}.{alias.name}")]
        elif isinstance(node, ast.Import):
            missing += [f"line {node.lineno}: {alias.name}" for alias in node.names
                        if alias.name.split(".")[0] in LAYERS and not exists(alias.name)]
    return missing


@pytest.mark.parametrize("script", sorted(EXPERIMENTS.rglob("*.py")), ids=lambda p: p.relative_to(EXPERIMENTS).as_posix())
def test_every_kloop_name_an_experiment_imports_exists(script):
    assert missing_imports(script.read_text()) == []


def test_an_import_of_a_moved_module_or_name_is_named():
    source = "from tools import bench\nfrom tools.records.store import open_db, no_such_name\nimport tools.store\n"
    assert missing_imports(source) == ["line 1: tools.bench", "line 2: tools.records.store.no_such_name",
                                       "line 3: tools.store"]


def test_every_script_the_docs_name_is_there():
    named = set()
    for doc in (REPO / "README.md", REPO / "docs" / "design.md"):
        named |= set(re.findall(r"tests/experiments/[\w/]+\.(?:py|sh)", doc.read_text()))
    assert len(named) >= 10
    assert sorted(path for path in named if not (REPO / path).is_file()) == []
