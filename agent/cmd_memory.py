"""`kloop memory list|show|forget`: inspect and prune the memory kept across runs (tools/records/memory.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from agent.output import fail
from agent.output import make_console
from tools.records.store import DEFAULT_DB

console = make_console()
app = typer.Typer(help="Inspect and prune the memory kept across runs (tunings, lessons).", no_args_is_help=True)
DEFAULT_MEMORY = DEFAULT_DB.parent / "memory.db"
MEMORY_OPTION = typer.Option(DEFAULT_MEMORY, "--memory", help="Memory file.")


def _open(path: Path):
    from tools.records.memory import MemoryFileError, open_memory

    try:
        return open_memory(path, create=False)
    except MemoryFileError as e:
        fail(str(e))


@app.command("list")
def list_command(memory: Path = MEMORY_OPTION,
                 as_json: bool = typer.Option(False, "--json", help="Print {tunings, lessons} as one JSON object.")):
    """Every tuning (T<id>: best tunables per template, shape bucket, GPU) and lesson (L<id>, with its counters)."""
    m = _open(memory)
    tunings, lessons = m.tunings(), m.lessons()
    m.close()
    if as_json:
        print(json.dumps({"tunings": tunings, "lessons": lessons}, default=str))
        return
    table = Table(title=f"tunings in {memory}")
    for column in ("id", "template", "bucket", "GPU", "tunables", "x eager", "run"):
        table.add_column(column)
    for t in tunings:
        table.add_row(t["item"], t["template"], t["bucket"], t["gpu"],
                      ", ".join(f"{k}={v}" for k, v in t["tunables"].items()),
                      "-" if t["speedup"] is None else f"{t['speedup']:.2f}", t["run_id"])
    console.print(table)
    table = Table(title=f"lessons in {memory}")
    for column in ("id", "status", "support", "contradict", "target", "lesson"):
        table.add_column(column)
    for lesson in lessons:
        table.add_row(lesson["item"], lesson["status"], str(lesson["support"]), str(lesson["contradict"]),
                      lesson["target_name"] or "", lesson["text"])
    console.print(table)


@app.command("show")
def show_command(item: str = typer.Argument(..., help="L<id> (a lesson) or T<id> (a tuning)."),
                 memory: Path = MEMORY_OPTION,
                 as_json: bool = typer.Option(False, "--json", help="Print the item as JSON.")):
    """One item in full: a lesson with its evidence and judgements, or a tuning with where it came from."""
    from tools.records.memory import MemoryFileError

    m = _open(memory)
    try:
        found = m.get(item)
    except MemoryFileError as e:
        fail(str(e))
    finally:
        m.close()
    if as_json:
        print(json.dumps(found, default=str))
        return
    for key, value in found.items():
        if key in ("evidence", "judgements"):
            console.print(f"{key}:", highlight=False)
            for entry in value:
                console.print(f"  {json.dumps(entry, default=str)}", highlight=False, soft_wrap=True)
        else:
            console.print(f"{key}: {value if not isinstance(value, dict) else json.dumps(value)}", highlight=False,
                          soft_wrap=True)


@app.command("forget")
def forget_command(items: Optional[List[str]] = typer.Argument(None, help="L<id> / T<id> items to delete."),
                   retired: bool = typer.Option(False, "--retired", help="Also delete every retired lesson."),
                   memory: Path = MEMORY_OPTION):
    """Delete items (and with --retired, every lesson later runs contradicted more than supported)."""
    from tools.records.memory import MemoryFileError

    if not items and not retired:
        fail("name the items to forget (L<id>, T<id>) or give --retired")
    m = _open(memory)
    try:
        for item in items or []:
            m.forget(item)
            console.print(f"forgot {item.upper()}", highlight=False)
        if retired:
            console.print(f"forgot {m.forget_retired()} retired lesson(s)", highlight=False)
    except MemoryFileError as e:
        fail(str(e))
    finally:
        m.close()
