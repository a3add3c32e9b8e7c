"""The docs checked against the code, as sqlite-utils tests its docs: docs/design.md's first screen against the
folder tree, its lists of EvalResult fields, Proposal fields and run-database columns against the dataclasses and
the schema `open_db` creates, the README's SQL against a database kloop made, and every `kloop` command the README
shows against the CLI. A field, column, command or option added, renamed or dropped fails here until the docs say
so."""
from __future__ import annotations

import dataclasses
import re
import sqlite3
from pathlib import Path

import pytest

from agent.policy import Proposal
from tools.result import EvalResult
from tools.records.store import JSON_COLUMNS, attempt_columns, open_db

REPO = Path(__file__).resolve().parents[1]
DESIGN = (REPO / "docs" / "design.md").read_text()
README = (REPO / "README.md").read_text()


def without_parentheses(text: str) -> str:
    """The text with every (possibly nested) parenthesized part removed."""
    out, depth = [], 0
    for ch in text:
        depth += ch == "("
        if not depth:
            out.append(ch)
        depth -= ch == ")" and depth > 0
    return "".join(out)


def documented_columns(table: str) -> dict[str, bool]:
    """{column: marked json} from design.md's bullet "- `table`: col TYPE (what), col json, ... ." (the list ends at
    the first full stop outside parentheses)."""
    match = re.search(rf"^- `{table}`: (.*?)(?=^- |^\n|\Z)", DESIGN, re.S | re.M)
    assert match, f"docs/design.md has no '- `{table}`: ...' column list"
    listed = re.split(r"\.\s", without_parentheses(" ".join(match.group(1).split())), maxsplit=1)[0]
    columns = {}
    for item in listed.rstrip(".").split(","):
        words = item.split()
        columns[words[0]] = "json" in words[1:]
    return columns


@pytest.mark.parametrize("layer", ["agent", "sandbox", "tools"])
def test_the_first_screen_names_every_module(layer):
    """docs/design.md's first screen is the architecture: every module and package of each layer is on it
    (the command modules as cmd_*.py)."""
    screen = DESIGN.split("```", 2)[1]
    missing = []
    for path in sorted((REPO / layer).iterdir()):
        if path.name.startswith(("_", ".")) or not (path.is_dir() or path.suffix == ".py"):
            continue
        name = "cmd_*.py" if path.name.startswith("cmd_") else f"{path.name}/" if path.is_dir() else path.stem
        if not re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", screen):
            missing.append(f"{layer}/{path.name}")
    assert not missing, f"not on docs/design.md's first screen: {', '.join(missing)}"


def test_the_evalresult_fields_are_the_documented_ones():
    paragraph = DESIGN.split("`EvalResult` is one typed record:", 1)[1].split("`to_dict()`", 1)[0]
    documented = {}
    for token in re.findall(r"`([^`]+)`", paragraph):
        name, _, kind = token.partition(":")
        documented[name.strip()] = kind.strip()
    fields = {f.name: str(f.type) for f in dataclasses.fields(EvalResult)}
    assert set(documented) == set(fields), (f"in docs/design.md only: {sorted(set(documented) - set(fields))}; "
                                            f"in EvalResult only: {sorted(set(fields) - set(documented))}")
    for name, kind in documented.items():   # `time_us: Timing`: the record type named is the field's
        for record in re.findall(r"[A-Z]\w+", kind):
            assert record in fields[name], f"docs/design.md says {name} holds {record}; EvalResult: {fields[name]}"


def test_the_proposal_fields_are_the_documented_ones():
    (listed,) = re.findall(r"`Proposal\(([^)]*)\)`", DESIGN)
    names = [f.name for f in dataclasses.fields(Proposal)]
    assert [n.strip() for n in listed.split(",")] == names[:len(listed.split(","))]


@pytest.mark.parametrize("table", ["runs", "attempts", "messages"])
def test_the_run_database_columns_are_the_documented_ones(tmp_path, table):
    store = open_db(tmp_path / "kloop.db")
    actual = set(store.db[table].columns_dict)
    store.close()
    documented = documented_columns(table)
    assert set(documented) == actual, (f"in docs/design.md only: {sorted(set(documented) - actual)}; "
                                       f"in the schema only: {sorted(actual - set(documented))}")
    marked = {name for name, is_json in documented.items() if is_json}
    assert marked == JSON_COLUMNS & actual, f"json marks in docs/design.md differ: {sorted(marked ^ (JSON_COLUMNS & actual))}"


def test_the_meta_table_is_the_documented_one(tmp_path):
    (listed,) = re.findall(r"^- `meta\(([^)]*)\)`", DESIGN, re.M)
    store = open_db(tmp_path / "kloop.db")
    columns = set(store.db["meta"].columns_dict)
    store.close()
    assert {item.split()[0] for item in listed.split(",")} == columns == {"key", "value"}


def test_the_readme_sql_runs_on_a_database_kloop_made(tmp_path):
    """Every query of the README's "Browsing a run database" block runs on a run database with an attempt (made
    by the code that makes them: open_db, attempt_columns), so every table and column it names exists."""
    block = README.split("### Browsing a run database", 1)[1].split("```sql", 1)[1].split("```", 1)[0]
    queries = [q.strip() for q in re.sub(r"--[^\n]*", "", block).split(";") if q.strip()]
    assert len(queries) >= 5
    store = open_db(tmp_path / "kloop.db")
    run_id = store.create_run(target_name="vector_add", policy="offline", gpu_name="NVIDIA H200")
    attempt = store.add_attempt(run_id, source="...", **attempt_columns(EvalResult(verdict="correct")))
    store.update_run(run_id, best_attempt_id=attempt)
    store.close()
    conn = sqlite3.connect(tmp_path / "kloop.db")
    for query in queries:
        try:
            conn.execute(query, {"run": run_id}).fetchall()
        except sqlite3.Error as e:
            pytest.fail(f"README query fails ({e}):\n{query}")
    conn.close()


def readme_commands() -> list[str]:
    """Every `kloop ...` command line of the README's bash blocks (continuations joined, comments dropped), and the
    synopsis opening each row of its command table (`kloop CMD [SUBCMD] ... [--option ...]`: the command words and
    the options)."""
    commands = []
    for synopsis in re.findall(r"^\| `(kloop [^`]*)`", README, re.M):
        words = synopsis.replace("\\|", " ").split()[1:]
        # the command alone: `kloop memory list|show|forget ... [--retired]` is checked against all its subcommands
        commands.append(" ".join(["kloop", words[0], *re.findall(r"--[a-z][a-z0-9-]*", synopsis)]))
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" # ", 1)[0].strip()
            words = line.split()
            while words and re.match(r"^[A-Z_]+=", words[0]):   # ANTHROPIC_API_KEY=... kloop ...
                words.pop(0)
            if words[:1] == ["kloop"]:
                commands.append(" ".join(words))
    return commands


def test_every_kloop_command_in_the_readme_exists_with_its_options():
    import typer

    from agent.cli import app

    commands = readme_commands()
    assert len(commands) >= 20
    for command in commands:
        words = command.split()[1:]
        root = cli = typer.main.get_command(app)
        while hasattr(cli, "commands") and words and words[0] in cli.commands:   # groups (typer vendors click)
            cli = cli.commands[words.pop(0)]
        assert cli is not root, f"README: no such kloop command in {command!r}"
        subcommands = list(cli.commands.values()) if hasattr(cli, "commands") else [cli]
        known = {opt for c in subcommands for param in c.params for opt in param.opts + param.secondary_opts}
        unknown = [w.split("=")[0] for w in words if w.startswith("--") and w.split("=")[0] not in known]
        assert not unknown, f"README: {command!r} uses {unknown}, which kloop {cli.name} does not take"
