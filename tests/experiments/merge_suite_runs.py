"""Copy some problems' latest runs from one suite database into another (not a test): two GPU calls that each
continued the same committed database, one rerunning some problems and one others, become one database.

    python tests/experiments/merge_suite_runs.py INTO.db FROM.db 'GLOB,GLOB,...'

For each problem key matching a glob: its suite_problems row in FROM replaces INTO's (same settings key), and its
run is copied whole (the run, its attempts with new ids, their parents and the run's best remapped, its messages);
the starters FROM kept for those sources too. INTO's earlier runs of the problem stay, as a rerun leaves them.
"""
from __future__ import annotations

import fnmatch
import sqlite3
import sys


def copy_rows(into: sqlite3.Connection, table: str, rows: list[sqlite3.Row], **changes) -> None:
    for row in rows:
        values = {**dict(row), **{k: f(row) for k, f in changes.items()}}
        names = ", ".join(f'"{k}"' for k in values)
        into.execute(f'INSERT OR REPLACE INTO "{table}" ({names}) VALUES ({", ".join("?" * len(values))})',
                     list(values.values()))


def merge(into: sqlite3.Connection, source: sqlite3.Connection, globs: list[str]) -> list[str]:
    merged = []
    for row in source.execute("SELECT * FROM suite_problems").fetchall():
        if not any(fnmatch.fnmatch(row["problem"].split("/")[-1], g) for g in globs):
            continue
        run_id = row["run_id"]
        if run_id is not None and into.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            attempts = source.execute("SELECT * FROM attempts WHERE run_id = ? ORDER BY id", (run_id,)).fetchall()
            first = into.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM attempts").fetchone()[0]
            new_id = {a["id"]: first + k for k, a in enumerate(attempts)}
            copy_rows(into, "runs", source.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchall(),
                      best_attempt_id=lambda r: new_id.get(r["best_attempt_id"]))
            copy_rows(into, "attempts", attempts, id=lambda a: new_id[a["id"]],
                      parent_attempt_id=lambda a: new_id.get(a["parent_attempt_id"]))
            messages = source.execute("SELECT * FROM messages WHERE run_id = ?", (run_id,)).fetchall()
            first = into.execute("SELECT COALESCE(MAX(id), 0) + 1 FROM messages").fetchone()[0]
            ids = iter(range(first, first + len(messages)))
            copy_rows(into, "messages", messages, id=lambda m: next(ids),
                      attempt_id=lambda m: new_id.get(m["attempt_id"]))
        into.execute("DELETE FROM suite_problems WHERE settings_key = ? AND problem = ? AND target_sha256 = ?",
                     (row["settings_key"], row["problem"], row["target_sha256"]))
        copy_rows(into, "suite_problems", [row], id=lambda r: None)
        copy_rows(into, "suite_starters", source.execute("SELECT * FROM suite_starters WHERE target_sha256 = ?",
                                                         (row["target_sha256"],)).fetchall())
        merged.append(row["problem"])
    return merged


def main(argv: list[str]) -> int:
    into, source = sqlite3.connect(argv[0]), sqlite3.connect(argv[1])
    into.row_factory = source.row_factory = sqlite3.Row
    with into:
        merged = merge(into, source, [g.strip() for g in argv[2].split(",") if g.strip()])
    print(f"{len(merged)} problems merged: {', '.join(merged)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
