"""results/ keeps what a reader needs: its README names every entry, its run databases are compressed (no loose
database, no -wal or -shm beside one), and kloop given a compressed database says how to unpack it."""
from __future__ import annotations

import lzma
import re
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from tools.records.store import StoreError, open_db

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
README = (RESULTS / "README.md").read_text()


def tracked() -> list[str]:
    """The paths git keeps under results/, relative to it."""
    listed = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True, check=True)
    return [line.removeprefix("results/") for line in listed.stdout.splitlines()]


def first_cells(section: str) -> set[str]:
    """The names in the first column of the README's table under `## section` (a cell may list several: "a, b")."""
    table = README.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+) \|", table, re.M)[1:]   # past the header
    return {name for row in rows for name in row.split(", ")}


def test_the_readme_has_a_line_for_every_entry():
    entries = {path.split("/")[0] + ("/" if "/" in path else "") for path in tracked()} - {"README.md"}
    assert len(entries) > 20
    assert first_cells("Every entry") == entries


def test_databases_are_kept_compressed_and_each_says_what_rests_on_it():
    paths = tracked()
    assert [p for p in paths if p.endswith((".db", "-wal", "-shm"))] == []
    databases = {p for p in paths if p.endswith((".db.xz", ".db.gz"))}
    named = {name.replace("{1,2}", level) for name in first_cells("Databases") for level in "12"}
    assert len(databases) >= 8 and named == databases


def test_a_compressed_database_is_refused_with_the_command_that_unpacks_it(tmp_path):
    plain = tmp_path / "runs.db"
    open_db(plain).close()
    packed = tmp_path / "runs.db.xz"
    packed.write_bytes(lzma.compress(plain.read_bytes()))
    with pytest.raises(StoreError) as refused:
        open_db(packed, create=False, readonly=True)
    assert str(refused.value) == f"{packed} is compressed: unpack it first (xz -dc {packed} > runs/runs.db)"

    result = CliRunner().invoke(app, ["runs", "--db", str(packed)])
    assert result.exit_code == 2
    assert result.output == f"error: {packed} is compressed: unpack it first (xz -dc {packed} > runs/runs.db)\n"
