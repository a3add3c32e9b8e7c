"""The run database: one SQLite file (WAL) holding runs, attempts and model messages (schema: docs/design.md).

Every write happens in one transaction, so a crash never leaves half an attempt; JSON columns are decoded on read.

    >>> db = open_db("runs/kloop.db")
    >>> run_id = db.create_run(target_name="vector_add", policy="offline")
    >>> attempt_id = db.add_attempt(run_id, language="triton", source="...", verdict="correct")
    >>> db.attempts(run_id)[0].number
    1

Every read of attempts returns `Attempt`s: what a reader needs of a row, typed. This module is the only one that reads
an attempts row by its column names (tests/test_store.py).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import sqlite3
import threading
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from tools.records.messages import Message
from tools.result import EvalResult, Roofline, Timing

SCHEMA_VERSION = 1
DEFAULT_DB = Path("runs/kloop.db")
LOCK_TIMEOUT_S = 10.0  # how long to wait for another writer before calling the database locked
# An offline-policy kernel's first line: this, then JSON of the template it rendered (values, PTX edit). Exports take
# it out, so no model learns to write it.
OFFLINE_MARK = "# kloop-offline: "

RUN_COLUMNS = {
    "id": str, "created_at": str, "finished_at": str, "status": str, "target_name": str, "target_source": str,
    "target_sha256": str, "gpu_name": str, "driver": str, "cuda": str, "versions": str, "numeric_flags": str,
    "policy": str, "model": str, "settings": str, "baselines": str, "best_attempt_id": int, "parent_run_id": str,
    "parent_kind": str, "notes": str, "gpu": str, "isolation": str, "owner": str,
}
# Columns added to schema v1 after its first release: nullable, added on a writable open of an older v1 file (an
# additive change: readers that select * just see one more column). A read-only open reads them as absent (None).
# `owner`: the process running the run now or last ({host, pid, started}: pid start time in clock ticks since boot), so
# a run left `running` by a killed process can be told from a live one (agent.run.liveness).
ADDED_RUN_COLUMNS = {"gpu": str, "isolation": str, "owner": str}
ATTEMPT_COLUMNS = {
    "id": int, "run_id": str, "number": int, "branch": int, "parent_attempt_id": int, "turn": int, "created_at": str,
    "language": str, "source": str, "source_hash": str, "reasoning": str, "ptx": str, "sass": str,
    "compile_log": str, "resources": str, "verdict": str, "reasons": str, "time_us": str, "speedup_eager": float,
    "speedup_compile": float, "sol_fraction": float, "roofline": str, "correctness": str, "ncu": str, "nvml": str,
    "flags": str, "diagnosis": str, "reflection": str, "stdout": str, "stderr": str, "durations": str, "result": str,
    "parent_reason": str, "archive_cell": str, "island": int, "gpu": str, "withheld": str,
}
# The search strategy's record of each attempt (agent/strategies): why its parent was picked, the MAP-Elites cell the
# attempt landed in, its island; and the GPU that ran it (json {index, name, uuid}; null when it ran on none): a run
# may time on several, and timings compare only within one. Nullable, added like ADDED_RUN_COLUMNS.
# `withheld`: why a hidden variant failed, in full (EvalResult.withheld), for the operator alone: history() leaves it
# out, as no policy may read it, and no export writes it.
ADDED_ATTEMPT_COLUMNS = {"parent_reason": str, "archive_cell": str, "island": int, "gpu": str, "withheld": str}
MESSAGE_COLUMNS = {
    "id": int, "run_id": str, "attempt_id": int, "branch": int, "turn": int, "seq": int, "created_at": str,
    "role": str, "provider": str, "model": str, "content": str, "input_tokens": int, "output_tokens": int,
    "cache_read_tokens": int, "cache_write_tokens": int, "latency_s": float, "cost_usd": float,
}
JSON_COLUMNS = {
    "versions", "numeric_flags", "settings", "baselines", "ptx", "sass", "resources", "reasons", "time_us",
    "roofline", "correctness", "ncu", "nvml", "flags", "durations", "result", "content", "gpu", "withheld",
    "owner",
}
RUN_STATUSES = ("running", "finished", "stopped", "failed")
# Two ideas, two names (docs/design.md, "Best and fastest"):
# - a run's *best* is the attempt runs.best_attempt_id names. The loop alone moves it (takes_the_lead); every reader
#   asks for it through BEST_SQL (Store.best_attempt, progress, list_runs), so all of them agree with the loop.
# - the *fastest* of some verified attempts orders them by measured speedup over eager, untimed ones last, the
#   earlier of equals first: FASTEST_ORDER in SQL, fastest_key in Python (tests/test_store.py: the same order).
BEST_SQL = "SELECT {columns} FROM runs r JOIN attempts a ON a.id = r.best_attempt_id WHERE r.id = ?"
FASTEST_ORDER = "speedup_eager IS NULL, speedup_eager DESC, number"


# Kept in their own attempts columns and left out of the `result` column: SASS and PTX are most of an attempt's bytes
# (a GEMM template's SASS at three shapes is ~0.5 MB), and stored twice they doubled a suite's database. Rows read
# through a Store get them back in `result` (_select).
RESULT_IN_COLUMNS = ("ptx", "sass")


@dataclass(frozen=True)
class Attempt:
    """One logged attempt, as every Store read returns it: its columns typed (None where the row holds NULL), and the
    evaluator's whole result rebuilt as an EvalResult (PTX and SASS put back from their own columns). A read that left
    a column out (history(): sass, withheld) leaves its field empty. Readers use these fields, never column names."""
    id: int
    run_id: str
    number: int
    branch: int = 0
    turn: int | None = None
    created_at: str | None = None
    language: str | None = None
    source: str | None = None
    source_hash: str | None = None
    reasoning: str | None = None
    verdict: str | None = None
    reasons: list[str] | None = None
    time_us: Timing | None = None          # the kernel's timing statistics (median_us: their median)
    roofline: Roofline | None = None       # bytes and FLOPs the op needs, against the GPU's peaks
    speedup_eager: float | None = None
    speedup_compile: float | None = None
    sol_fraction: float | None = None
    diagnosis: str | None = None           # the reflect node's reading of the counters
    reflection: str | None = None
    durations: dict | None = None
    # the search strategy's record (agent/strategies): the parent it built on and why, its MAP-Elites cell, its island
    parent_attempt_id: int | None = None
    parent_reason: str | None = None
    archive_cell: str | None = None
    island: int | None = None
    gpu: dict | None = None                # {index, name, uuid} of the GPU that ran it; None when none did
    withheld: list[str] | None = None      # the operator's reasons a hidden variant failed: never for a policy
    result: EvalResult = field(default_factory=EvalResult)
    row: dict = field(default_factory=dict, repr=False, compare=False)   # the row as stored (JSON decoded)

    @classmethod
    def from_row(cls, row: dict) -> "Attempt":
        """An attempts row (JSON columns decoded, the result made whole) as an Attempt."""
        plain = {f: row.get(f) for f in _PLAIN_ATTEMPT_FIELDS if f in row}
        columns = EvalResult.from_dict({k: row.get(k) for k in ("time_us", "roofline")})  # read as a result's are
        result = row.get("result")
        return cls(**plain, branch=row.get("branch") or 0, time_us=columns.time_us, roofline=columns.roofline,
                   result=EvalResult.from_dict(result if isinstance(result, dict) else None), row=row)

    @property
    def median_us(self) -> float | None:
        """The median kernel time in microseconds; None when the attempt was not timed."""
        return self.time_us.median if self.time_us else None

    @property
    def timed(self) -> bool:
        """Whether the attempt has a kernel time (the CPU interpreter times nothing)."""
        return bool(self.median_us)

    def to_dict(self) -> dict:
        """The row as stored (JSON columns decoded), for output that shows it as it is: `kloop show --json`."""
        return dict(self.row)


# The fields a row holds as they are; from_row builds the others (branch: 0 for NULL)
_PLAIN_ATTEMPT_FIELDS = tuple(f.name for f in fields(Attempt)
                              if f.name not in ("branch", "time_us", "roofline", "result", "row"))


def attempt_columns(result: EvalResult) -> dict:
    """The attempts-table columns filled from one evaluator result (docs/design.md); the graph's commit and the
    re-verifier both store results through this one mapping."""
    d = result.to_dict()
    stored = {k: v for k, v in d.items() if k not in RESULT_IN_COLUMNS}
    return {
        "language": result.language, "ptx": result.ptx, "sass": result.sass, "compile_log": result.compile_log,
        "resources": d["resources"], "verdict": result.verdict, "reasons": result.reasons, "time_us": d["time_us"],
        "speedup_eager": result.speedup_over("eager"), "speedup_compile": result.speedup_over("compile"),
        "sol_fraction": result.sol_fraction, "roofline": d["roofline"], "correctness": d["correctness"],
        "ncu": d["ncu"], "nvml": result.nvml, "flags": result.flags, "stdout": result.stdout,
        "stderr": result.stderr, "durations": result.durations_s, "result": stored, "gpu": device_of(result),
        "withheld": result.withheld or None,
    }


def device_of(result: EvalResult) -> dict | None:
    """Which GPU ran an attempt: {index (NVML's, the machine's numbering), name, uuid}; None when none did."""
    gpu = result.gpu or {}
    if result.executed_on != "cuda" or not gpu:
        return None
    return {"index": gpu.get("index"), "name": gpu.get("name"), "uuid": gpu.get("uuid")}


class StoreError(Exception):
    """The run database cannot be used as asked: one line for the user."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def takes_the_lead(result: EvalResult, best: Attempt | None) -> bool:
    """Whether an attempt with this result becomes the run's best, given the standing best (None: no best
    yet). Only a correct one can; it wins by the paired re-measurement when there was one, else (the best's plans
    are gone, or it was never timed) by its own median. Untimed results never displace a best (CPU interpreter:
    the first verified attempt stays the best)."""
    if not result.correct:
        return False
    if best is None:
        return True
    if result.vs_best is not None:
        return result.vs_best.outcome == "faster"
    return result.median_us is not None and (best.median_us is None or result.median_us < best.median_us)


def best_so_far(attempts: list[Attempt]) -> list[Attempt | None]:
    """The run's best as the loop held it after each of these attempts (in number order): takes_the_lead
    replayed on their logged results. For logged runs seen attempt by attempt (the report's best-so-far line,
    export's rebuilt conversations); a whole run's best is runs.best_attempt_id."""
    best, out = None, []
    for attempt in attempts:
        if takes_the_lead(attempt.result, best):
            best = attempt
        out.append(best)
    return out


def best_after(attempts: list[Attempt]) -> Attempt | None:
    """The run's best as the loop held it after these attempts (in number order)."""
    return best_so_far(attempts)[-1] if attempts else None


def fastest_key(attempt) -> tuple:
    """Sort key of FASTEST_ORDER (ascending: the fastest first; `min` gives the fastest) for attempts given in number
    order, since sorted and min keep the earlier of equals. `attempt`: anything with a speedup_eager attribute
    (Attempt, agent.policy.AttemptView)."""
    speedup = attempt.speedup_eager
    return (speedup is None, -(speedup or 0.0))


def gpu_columns(gpu: dict | None) -> dict:
    """The runs columns that hold a machine's GPU facts (the evaluator's `gpu` dict); {} without a GPU.

    >>> db.update_run(run_id, **gpu_columns(gpu_info()))
    """
    if gpu is None:
        return {}
    return {"gpu": gpu, "gpu_name": gpu.get("name"), "driver": gpu.get("driver"), "cuda": gpu.get("cuda")}


def source_hash(source: str) -> str:
    """sha256 of the source with trailing whitespace and blank lines normalized away (same kernel, same hash)."""
    lines = [line.rstrip() for line in source.strip().splitlines()]
    return hashlib.sha256("\n".join(line for line in lines if line).encode()).hexdigest()


def offline_marker(source: str | None) -> dict | None:
    """The JSON after OFFLINE_MARK on the source's first line; None for any other source."""
    first = (source or "").split("\n", 1)[0]
    if not first.startswith(OFFLINE_MARK):
        return None
    try:
        marker = json.loads(first[len(OFFLINE_MARK):])
    except ValueError:
        return None
    return marker if isinstance(marker, dict) else None


def open_db(path: str | os.PathLike = DEFAULT_DB, create: bool = True, timeout: float | None = None,
            readonly: bool = False) -> Store:
    """Open (or, with create, make) a run database; every problem is one StoreError line.

    readonly opens an existing database for reading only (export, report, show, runs): it works on read-only files
    and media, never takes the write lock, and any write through it is a StoreError.

    >>> db = open_db("/tmp/x.db")            # creates the file and the schema
    >>> open_db("/tmp/missing.db", create=False)
    StoreError: no run database at /tmp/missing.db
    >>> open_db("/data/runs.db", create=False, readonly=True).list_runs()
    """
    path = Path(path)
    if readonly and create:
        raise StoreError("a read-only open cannot create a database (pass create=False)")
    if not path.exists():
        if not create:
            raise StoreError(f"no run database at {path}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create {path.parent}: {e.strerror}") from None
    if not readonly and not os.access(path if path.exists() else path.parent, os.W_OK):
        raise StoreError(f"{path} is not writable")
    timeout = LOCK_TIMEOUT_S if timeout is None else timeout
    try:
        conn = _connect_readonly(path, timeout) if readonly else sqlite3.connect(
            str(path), timeout=timeout, check_same_thread=False)
        store = Store(Database(conn), path, readonly=readonly)
        store._prepare()
    except sqlite3.DatabaseError as e:
        raise StoreError(_explain(path, e)) from None
    return store


def _connect_readonly(path: Path, timeout: float) -> sqlite3.Connection:
    """A read-only connection. A WAL database needs its -shm file to be there or creatable; where neither holds
    (a read-only directory after a clean close) it is opened immutable, which is safe because nobody can be
    writing to a file in a directory no one can write to."""
    uri = f"{path.resolve().as_uri()}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)
    try:
        conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as e:
        conn.close()
        if "unable to open" not in str(e) or os.access(path.parent, os.W_OK):
            raise
        conn = sqlite3.connect(f"{uri}&immutable=1", uri=True, timeout=timeout, check_same_thread=False)
    return conn


# results/ keeps its databases compressed; the tool that unpacks each kind
UNPACKERS = {".xz": "xz", ".gz": "gzip"}


def _explain(path: Path, error: sqlite3.DatabaseError) -> str:
    text = str(error)
    if "locked" in text or "busy" in text:
        return f"{path} is locked by another process (is a kloop run still writing to it?)"
    if ("not a database" in text or "malformed" in text) and path.suffix in UNPACKERS:
        return f"{path} is compressed: unpack it first ({UNPACKERS[path.suffix]} -dc {path} > runs/{path.stem})"
    if "not a database" in text or "malformed" in text:
        return f"{path} is not a SQLite database"
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return f"{path} is not writable ({text})"
    return f"{path}: {text}"


class Store:
    """The run database. Methods are thread-safe (the graph's parallel branches share one Store)."""

    def __init__(self, db: Database, path: Path, readonly: bool = False):
        self.db = db
        self.path = path
        self.readonly = readonly
        self._lock = threading.RLock()
        self._history: dict[str, list[Attempt]] = {}   # run id -> history(): its committed attempts so far

    # -- setup ---------------------------------------------------------------------------------------------------
    def _prepare(self) -> None:
        db = self.db
        db.execute("PRAGMA foreign_keys = ON")
        tables = set(db.table_names())
        if not tables and self.readonly:  # a run creating it has not yet committed its schema, or an empty file
            raise StoreError(f"{self.path} has no kloop tables yet (empty, or a run is still creating it)")
        if not tables:
            db.enable_wal()
            with db.atomic():
                self._create_schema()
            return
        if "meta" not in tables:
            raise StoreError(f"{self.path} is not a kloop run database (no meta table)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None or not str(row[0]).isdigit():
            raise StoreError(f"{self.path} is not a kloop run database (no schema_version)")
        version = int(row[0])
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}, newer than this kloop's "
                             f"({SCHEMA_VERSION}): upgrade kloop to read it")
        if version < SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}, older than any kloop release "
                             f"(no migration to {SCHEMA_VERSION} exists)")
        if self.readonly:
            return
        # A write probe turns "locked by another writer" into an error now rather than at the first attempt.
        with db.atomic():
            db.execute("UPDATE meta SET value = value WHERE key = 'schema_version'")
            missing = {k: v for k, v in ADDED_RUN_COLUMNS.items() if k not in db["runs"].columns_dict}
            for column, kind in missing.items():
                db["runs"].add_column(column, kind)
            for column, kind in ADDED_ATTEMPT_COLUMNS.items():
                if column not in db["attempts"].columns_dict:
                    db["attempts"].add_column(column, kind)

    def _create_schema(self) -> None:
        db = self.db
        db["meta"].create({"key": str, "value": str}, pk="key")
        db["meta"].insert({"key": "schema_version", "value": str(SCHEMA_VERSION)})
        db["runs"].create(RUN_COLUMNS, pk="id", not_null={"status", "created_at"})
        db["attempts"].create(ATTEMPT_COLUMNS, pk="id", foreign_keys=[("run_id", "runs", "id")],
                              not_null={"run_id", "number"})
        db["attempts"].create_index(["run_id", "number"], unique=True)
        db["attempts"].create_index(["source_hash"])
        db["messages"].create(MESSAGE_COLUMNS, pk="id",
                              foreign_keys=[("run_id", "runs", "id"), ("attempt_id", "attempts", "id")],
                              not_null={"run_id", "role"})
        db["messages"].create_index(["run_id", "attempt_id"])

    def close(self) -> None:
        self.db.conn.close()

    # -- runs ----------------------------------------------------------------------------------------------------
    def create_run(self, **cols: Any) -> str:
        """Insert a run (status 'running') and return its short id.

        >>> db.create_run(target_name="softmax", policy="offline", settings={"max_attempts": 8})
        'a1b2c3d4'
        """
        row = {"id": uuid.uuid4().hex[:8], "created_at": now(), "status": "running", **cols}
        with self._write():
            self.db["runs"].insert(_check(row, RUN_COLUMNS))
        return row["id"]

    def update_run(self, run_id: str, **cols: Any) -> None:
        """>>> db.update_run(run_id, status="finished", finished_at=now())"""
        if cols.get("status", "running") not in RUN_STATUSES:
            raise StoreError(f"unknown run status {cols['status']!r} (one of {', '.join(RUN_STATUSES)})")
        self.get_run(run_id)
        with self._write():
            self.db["runs"].update(run_id, _check(cols, RUN_COLUMNS))

    def get_run(self, run_id: str) -> dict:
        """One run as a dict (JSON columns decoded); an unknown id is a StoreError."""
        rows = self._select("SELECT * FROM runs WHERE id = ?", [run_id])
        if not rows:
            raise StoreError(f"no run {run_id} in {self.path}")
        return rows[0]

    def list_runs(self) -> list[dict]:
        """All runs, newest first, each with its attempt count and best speedup over eager."""
        return self._select(
            "SELECT runs.*, (SELECT COUNT(*) FROM attempts WHERE run_id = runs.id) AS attempts_count, "
            "(SELECT speedup_eager FROM attempts WHERE id = runs.best_attempt_id) AS best_speedup_eager "
            "FROM runs ORDER BY created_at DESC, rowid DESC")

    # -- attempts ------------------------------------------------------------------------------------------------
    def next_attempt_number(self, run_id: str) -> int:
        with self._lock:
            row = self.db.execute("SELECT COALESCE(MAX(number), 0) + 1 FROM attempts WHERE run_id = ?", [run_id])
            return row.fetchone()[0]

    def add_attempt(self, run_id: str, messages: list[Message] = (), **cols: Any) -> int:
        """Commit one attempt (numbered next in its run, no gaps) with its messages, in one transaction.

        >>> db.add_attempt(run_id, language="triton", source=src, verdict="compile_error", reasons=["..."])
        7
        """
        with self._write():
            number = self.next_attempt_number(run_id)
            row = {"run_id": run_id, "number": number, "created_at": now(), "branch": 0, **cols}
            if "source" in row and "source_hash" not in row:
                row["source_hash"] = source_hash(row["source"] or "")
            attempt_id = self.db["attempts"].insert(_check(row, ATTEMPT_COLUMNS)).last_pk
            for message in messages:
                self.add_message(run_id, message, attempt_id=attempt_id, branch=row["branch"], turn=row.get("turn"))
        return attempt_id

    def get_attempt(self, attempt_id: int) -> Attempt:
        rows = self._attempts("SELECT * FROM attempts WHERE id = ?", [attempt_id])
        if not rows:
            raise StoreError(f"no attempt {attempt_id} in {self.path}")
        return rows[0]

    def attempts(self, run_id: str, branch: int | None = None) -> list[Attempt]:
        """A run's attempts in number order (optionally one branch's)."""
        if branch is None:
            return self._attempts("SELECT * FROM attempts WHERE run_id = ? ORDER BY number", [run_id])
        return self._attempts("SELECT * FROM attempts WHERE run_id = ? AND branch = ? ORDER BY number",
                              [run_id, branch])

    def history(self, run_id: str, branch: int | None = None) -> list[Attempt]:
        """attempts() for a loop that reads them before every proposal: without SASS listings (most of their bytes),
        and read from the file only once each (attempts are never changed once committed, and numbered in commit
        order), so a proposal costs the same at attempt 5000 as at attempt 5. The attempts are shared: read-only.

        >>> [a.number for a in db.history(run_id)]
        [1, 2, 3]
        """
        with self._lock:
            rows = self._history.setdefault(run_id, [])
            after = rows[-1].number if rows else 0
            columns = ", ".join(c for c in self.db["attempts"].columns_dict if c not in ("sass", "withheld"))
            rows += self._attempts(f"SELECT {columns} FROM attempts WHERE run_id = ? AND number > ? ORDER BY number",
                                   [run_id, after])
            return list(rows) if branch is None else [a for a in rows if a.branch == branch]

    def best_attempt(self, run_id: str) -> Attempt | None:
        """The run's best: the attempt runs.best_attempt_id names. The loop moves it only to a correct attempt that
        beat the standing best in a paired re-measurement (or the first correct one): docs/design.md."""
        rows = self._attempts(BEST_SQL.format(columns="a.*"), [run_id])
        return rows[0] if rows else None

    def progress(self, run_id: str) -> dict:
        """The numbers the loop's stop rules need, without loading sources: attempts, active seconds spent
        (sum of the wall time each attempt added, durations.wall; durations.attempt for rows logged before attempts
        overlapped), tokens and dollars, the best attempt's number and SOL fraction."""
        with self._lock:
            return self._progress(run_id)

    def _progress(self, run_id: str) -> dict:
        count, seconds, last = self.db.execute(
            "SELECT COUNT(*), COALESCE(SUM(COALESCE(json_extract(durations, '$.wall'), "
            "json_extract(durations, '$.attempt'))), 0), COALESCE(MAX(number), 0) "
            "FROM attempts WHERE run_id = ?", [run_id]).fetchone()
        best = self.db.execute(BEST_SQL.format(columns="a.id, a.number, a.sol_fraction, a.speedup_eager"),
                               [run_id]).fetchone()
        return {"attempts": count, "seconds": seconds, "last_number": last, **self.usage(run_id),
                "best_id": best[0] if best else None, "best_number": best[1] if best else None,
                "best_sol": best[2] if best else None, "best_speedup": best[3] if best else None}

    # -- messages ------------------------------------------------------------------------------------------------
    def add_message(self, run_id: str, message: Message, attempt_id: int | None = None, branch: int = 0,
                    turn: int | None = None) -> int:
        """Log one model/tool exchange; seq numbers messages in order within the run.

        >>> db.add_message(run_id, Message(role="request", content={...}, provider="anthropic"))
        """
        with self._write():
            seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE run_id = ?",
                                  [run_id]).fetchone()[0]
            row = {"run_id": run_id, "attempt_id": attempt_id, "branch": branch, "turn": turn, "seq": seq,
                   "created_at": now(), **vars(message)}
            return self.db["messages"].insert(_check(row, MESSAGE_COLUMNS)).last_pk

    def messages(self, run_id: str) -> list[dict]:
        return self._select("SELECT * FROM messages WHERE run_id = ? ORDER BY seq", [run_id])

    def usage(self, run_id: str) -> dict:
        """Tokens and dollars spent by a run so far (sum over its messages)."""
        with self._lock:
            row = self.db.execute(
                "SELECT COALESCE(SUM(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens), 0), "
                "COALESCE(SUM(cost_usd), 0) FROM messages WHERE run_id = ?", [run_id]).fetchone()
        return {"tokens": row[0], "cost_usd": row[1]}

    # -- helpers -------------------------------------------------------------------------------------------------
    def transaction(self) -> _Transaction:
        """Group several writes into one all-or-nothing transaction (nested writes join it).

        >>> with db.transaction():
        ...     attempt_id = db.add_attempt(run_id, ...)
        ...     db.update_run(run_id, best_attempt_id=attempt_id)
        """
        return _Transaction(self)

    _write = transaction

    def _select(self, sql: str, params: list | None = None) -> list[dict]:
        with self._lock:
            rows = list(self.db.query(sql, params or []))
        return [_whole_result({k: _decode(k, v) for k, v in row.items()}) for row in rows]

    def _attempts(self, sql: str, params: list) -> list[Attempt]:
        return [Attempt.from_row(row) for row in self._select(sql, params)]


class _Transaction:
    """Lock + BEGIN IMMEDIATE + sqlite-utils atomic(): one writer thread at a time, all-or-nothing, errors as
    StoreError.

    IMMEDIATE: the outermost transaction takes the file's write lock before its first read. A deferred one that
    read, then wrote after another connection had written (a suite's lanes, two runs on one database), failed at once
    with SQLITE_BUSY_SNAPSHOT, which no busy timeout waits out."""

    def __init__(self, store: Store):
        self.store = store
        self.outer = False

    def __enter__(self):
        if self.store.readonly:
            raise StoreError(f"{self.store.path} was opened read-only: it cannot be written through this handle")
        self.store._lock.acquire()
        try:
            conn = self.store.db.conn
            self.outer = not conn.in_transaction
            if self.outer:
                conn.execute("BEGIN IMMEDIATE")
            self.atomic = self.store.db.atomic()  # a savepoint inside it: nested transactions roll back alone
            self.atomic.__enter__()
        except BaseException as e:
            if self.outer and self.store.db.conn.in_transaction:
                self.store.db.conn.execute("ROLLBACK")
            self.store._lock.release()
            if isinstance(e, sqlite3.OperationalError):
                raise StoreError(_explain(self.store.path, e)) from None
            raise

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:   # rolled back: what history() read inside the transaction may be gone
            self.store._history.clear()
        conn = self.store.db.conn
        try:
            try:
                self.atomic.__exit__(exc_type, exc, tb)  # releases its savepoint, or rolls back to it and re-raises
            finally:
                if self.outer and conn.in_transaction:
                    conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
        except sqlite3.OperationalError as e:
            if self.outer and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise StoreError(_explain(self.store.path, e)) from None
        finally:
            self.store._lock.release()
        if isinstance(exc, sqlite3.OperationalError):
            raise StoreError(_explain(self.store.path, exc)) from None


def _check(row: dict, columns: dict) -> dict:
    unknown = set(row) - set(columns)
    if unknown:
        raise StoreError(f"unknown column(s) {', '.join(sorted(unknown))}")
    return {k: json.dumps(v, default=str) if k in JSON_COLUMNS and v is not None else v for k, v in row.items()}


def _whole_result(row: dict) -> dict:
    """An attempt row's `result` with its PTX and SASS put back from their columns (attempt_columns)."""
    result = row.get("result")
    if isinstance(result, dict):
        for key in RESULT_IN_COLUMNS:
            if key not in result and row.get(key) is not None:
                result[key] = row[key]
    return row


def _decode(column: str, value: Any) -> Any:
    if column in JSON_COLUMNS and isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value
