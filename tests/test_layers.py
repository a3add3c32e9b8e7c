"""The layers of docs/design.md's first screen, checked on every module's imports (parsed with `ast`, never imported):

    agent/    the loop, its policies and its command line       may import sandbox/ and tools/
    sandbox/  the evaluator and its processes                  may import tools/
    tools/    leaf blocks                                      imports neither

Inside tools/, the records (tools/records/: store, export, report, view, ...) are what a run leaves behind: agent/ reads
and writes them, and nothing on the GPU side (sandbox/, the other tools/) imports them, so the evaluator never depends
on how results are kept.

And inside agent/, nothing below the command line (graph, run, policies, ...) imports it (agent/cli.py, cmd_*.py):
other entry points call agent.run, not the CLI. The command modules are thin and side by side: only cli.py imports
them, and none imports another. Imports inside functions count as much as those at the top.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("agent", "sandbox", "tools")  # top to bottom: a module may import only its own layer and those below
CLI = ("agent.cli", "agent.cmd_")
RECORDS = "tools.records"


def modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement in the file, relative ones resolved."""
    package = list(path.relative_to(REPO).parts[:-1])  # the package the file is in (an __init__.py's own)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            # `from agent import cmd_loop` imports the module agent.cmd_loop
            found += [(node.lineno, f"{module}.{alias.name}" if not node.module or module in LAYERS else module)
                      for alias in node.names]
    return found


def wrong_way(path: Path) -> list[str]:
    own = path.relative_to(REPO).parts[0]
    allowed = LAYERS[LAYERS.index(own):]
    rel = path.relative_to(REPO).as_posix()
    is_cli = rel == "agent/cli.py" or (rel.startswith("agent/cmd_") and "/" not in rel[len("agent/"):])
    problems = []
    for line, module in imports(path):
        top = module.split(".")[0]
        if top in LAYERS and top not in allowed:
            problems.append(f"{rel}:{line} imports {module}: {own}/ may import only {' and '.join(f'{x}/' for x in allowed)}")
        elif module.startswith(RECORDS) and own != "agent" and not rel.startswith("tools/records/"):
            problems.append(f"{rel}:{line} imports {module}: the records are agent/'s; the GPU side never imports them")
        elif own == "agent" and not is_cli and module.startswith(CLI):
            problems.append(f"{rel}:{line} imports {module}: below the command line, agent/ calls agent.run, "
                            "never the CLI modules")
        elif is_cli and rel != "agent/cli.py" and module.startswith(CLI):
            problems.append(f"{rel}:{line} imports {module}: a command module shares code through agent/ below "
                            "the CLI (run, progress, output), never through another command module")
    return problems


def test_imports_point_down_only():
    problems = [p for layer in LAYERS for path in modules(layer) for p in wrong_way(path)]
    assert not problems, "wrong-way imports (docs/design.md, first screen):\n" + "\n".join(problems)


def test_the_check_sees_function_level_and_relative_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    (tmp_path / "tools").mkdir()
    (tmp_path / "agent").mkdir()
    leaf = tmp_path / "tools" / "leaf.py"
    leaf.write_text("import json\nfrom tools import result\n\ndef f():\n    from agent.policy import Message\n"
                    "    import sandbox.evaluate\n    from tools.records import store\n")
    assert [p.split(" imports ")[0] for p in wrong_way(leaf)] == ["tools/leaf.py:5", "tools/leaf.py:6", "tools/leaf.py:7"]
    (tmp_path / "tools" / "records").mkdir()
    (tmp_path / "tools" / "records" / "export.py").write_text("from tools.records.store import Store\nfrom tools import result\n")
    assert wrong_way(tmp_path / "tools" / "records" / "export.py") == []
    graph = tmp_path / "agent" / "graph.py"
    graph.write_text("from . import cmd_loop\nfrom .policy import Message\nfrom tools.records.store import Store\n")
    assert wrong_way(graph) == ["agent/graph.py:1 imports agent.cmd_loop: below the command line, agent/ calls "
                                "agent.run, never the CLI modules"]
    cli_module = tmp_path / "agent" / "cmd_x.py"
    cli_module.write_text("from agent.run import start\nfrom agent.output import fail\n")
    assert wrong_way(cli_module) == []
    cli_module.write_text("from agent.cmd_loop import x\nfrom agent.run import start\n")
    assert wrong_way(cli_module) == ["agent/cmd_x.py:1 imports agent.cmd_loop: a command module shares code through "
                                     "agent/ below the CLI (run, progress, output), never through another command "
                                     "module"]
    (tmp_path / "agent" / "cli.py").write_text("from agent import cmd_loop, cmd_x\n")
    assert wrong_way(tmp_path / "agent" / "cli.py") == []
