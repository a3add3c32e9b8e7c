"""`kloop view`: one run, or a suite, as one self-contained HTML page (tools/records/view.py) to read offline in a browser."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from agent.output import fail, make_console
from tools.records.store import DEFAULT_DB


def view_command(
    run_id: Optional[str] = typer.Argument(None, help="The run to show (leave out with --suite)."),
    suite: bool = typer.Option(False, "--suite", help="The database's suite: its problems table, each problem linked to its run."),
    db: Path = typer.Option(DEFAULT_DB, "--db", metavar="PATH", help="Run database."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="FILE", help="The HTML file to write (default: RUN_ID.html, or suite.html, beside --db)."),
) -> None:
    """Write a run (plots, attempts, each attempt's source and its diff against its parent, reasons) or a suite as
    one HTML file that needs no server and no network."""
    if suite == (run_id is not None):
        fail("give a RUN_ID or --suite (one of them)")
    if not db.is_file():
        fail(f"no run database at {db}")
    out = out or db.parent / f"{run_id or 'suite'}.html"
    if out.is_dir():
        fail(f"--out {out} is a folder; give the HTML file to write")
    from tools.records.view import ViewError, write_run_view, write_suite_view

    try:
        if suite:
            rows, title = _suite_rows(db)
            written = write_suite_view(db, rows, out, title)
        else:
            written = write_run_view(db, run_id, out)
    except ViewError as e:
        fail(str(e))
    make_console().print(f"wrote {written} ({written.stat().st_size / 1024:.0f} KiB): open it in a browser",
                         highlight=False, markup=False)


def _suite_rows(db: Path) -> tuple[list[dict], str]:
    """Every problem row the database's suites recorded, in the order they were run."""
    from agent.suite import PROBLEMS_TABLE
    from tools.records.store import StoreError, open_db

    try:
        store = open_db(db, create=False, readonly=True)
    except StoreError as e:
        fail(str(e))
    if PROBLEMS_TABLE not in store.db.table_names():
        fail(f"{db} holds no suite (no {PROBLEMS_TABLE} table): `kloop view RUN_ID` shows one run")
    rows = list(store.db.query(f"SELECT * FROM {PROBLEMS_TABLE} ORDER BY id"))
    policies = ", ".join(dict.fromkeys(r["policy"] for r in rows if r["policy"]))
    return rows, f"kloop suite: {len(rows)} problems in {db.name}" + (f", {policies} policy" if policies else "")
