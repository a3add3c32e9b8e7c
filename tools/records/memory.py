"""Memory across runs: one SQLite file (runs/memory.db beside the default run database), read and written by
agent/learn.py, inspected with `kloop memory list|show|forget`.

- tunings: the best tunables per (kernel template, shape bucket, GPU name or "cpu-interpreter"), from verified
  attempts only (values, never a kernel), with the row length they were tuned at (the innermost size of the largest
  input). The offline policy tries them first on the next similar target, row tiles scaled to its rows.
- lessons: short text a model policy distilled after a run, tied to the target's features (tags: op, dtypes,
  shape bucket, GPU), with the evidence (attempt ids, speedups) it cited, retrieved by SQLite FTS5 (sqlite-utils
  enable_fts/search). EvolRule-style counters: each later run that was shown a lesson judges it supported or
  contradicted; a lesson more often contradicted than supported is retired (kept for `kloop memory show`, never
  retrieved again). Code is stripped from lessons: memory never carries a kernel.

    >>> m = open_memory("runs/memory.db")
    >>> m.remember_tuning("vector_add/triton_block", "float32 2^26", "NVIDIA H200", {"BLOCK_SIZE": 4096}, 1.01, ...)
    >>> m.seeds(["vector_add/triton_block"], "float32 2^24", "NVIDIA H200")
"""
from __future__ import annotations

import datetime
import json
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any

from sqlite_utils import Database

SCHEMA_VERSION = 1
CPU = "cpu-interpreter"
MAX_LESSON_CHARS = 400
_CODE = re.compile(r"```.*?(```|$)", re.DOTALL)


class MemoryFileError(Exception):
    """The memory file cannot be used: one line for the user."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def open_memory(path: str | Path, create: bool = True) -> Memory:
    path = Path(path)
    if not path.exists():
        if not create:
            raise MemoryFileError(f"no memory file at {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        memory = Memory(Database(sqlite3.connect(str(path), timeout=10.0, check_same_thread=False)), path)
        memory._prepare()
    except sqlite3.DatabaseError as e:
        raise MemoryFileError(f"{path}: {e}") from None
    return memory


def size_bucket(dtypes: list[str], elements: int | None) -> tuple[str, int | None]:
    """'float32 2^20': the inputs' dtypes and their total element count to the nearest power of two."""
    import math

    log2 = round(math.log2(elements)) if elements else None
    return f"{'+'.join(sorted(set(dtypes))) or '?'} 2^{log2 if log2 is not None else '?'}", log2


def clean_lesson(text: str) -> str:
    """One short line of prose: code blocks removed (memory never carries a kernel), whitespace folded, capped."""
    text = " ".join(_CODE.sub(" ", text or "").split())
    return text if len(text) <= MAX_LESSON_CHARS else text[: MAX_LESSON_CHARS - 3] + "..."


class Memory:
    def __init__(self, db: Database, path: Path):
        self.db, self.path = db, path
        self._lock = threading.RLock()

    def _prepare(self) -> None:
        db = self.db
        tables = set(db.table_names())
        if tables and "memory_meta" not in tables:
            raise MemoryFileError(f"{self.path} is not a kloop memory file")
        if tables:
            if "row_length" not in self.db["tunings"].columns_dict:   # a file from before rows were kept
                self.db["tunings"].add_column("row_length", int)
            return
        db.enable_wal()
        with db.conn:
            db["memory_meta"].insert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")
            db["tunings"].create({
                "id": int, "template": str, "bucket": str, "size_log2": int, "dtypes": str, "gpu": str,
                "tunables": str, "speedup": float, "target_name": str, "run_id": str, "attempt_id": int,
                "run_db": str, "updated_at": str, "row_length": int}, pk="id",
                not_null={"template", "bucket", "gpu", "tunables"})
            db["tunings"].create_index(["template", "bucket", "gpu"], unique=True)
            db["lessons"].create({
                "id": int, "text": str, "tags": str, "target_name": str, "gpu": str, "run_id": str, "run_db": str,
                "evidence": str, "support": int, "contradict": int, "status": str, "created_at": str,
                "updated_at": str}, pk="id", not_null={"text", "status"})
            db["judgements"].create({"id": int, "lesson_id": int, "run_id": str, "run_db": str, "verdict": str,
                                     "why": str, "created_at": str}, pk="id")
            db["distilled"].create({"run_key": str, "attempts": int, "at": str}, pk="run_key")
        db["lessons"].enable_fts(["text", "tags"], create_triggers=True)

    def close(self) -> None:
        self.db.conn.close()

    # -- tuning memory ---------------------------------------------------------------------------------------------
    def remember_tuning(self, template: str, bucket: str, size_log2: int | None, dtypes: str, gpu: str,
                        tunables: dict, speedup: float | None, *, target_name: str, run_id: str, attempt_id: int,
                        run_db: str, row_length: int | None = None) -> bool:
        """Keep `tunables` for (template, bucket, gpu) if they beat what is kept (a timed speedup beats an untimed
        one or a lower one; untimed ones, as on the CPU interpreter, replace untimed ones). True if kept."""
        row = {"template": template, "bucket": bucket, "size_log2": size_log2, "dtypes": dtypes, "gpu": gpu,
               "tunables": json.dumps(tunables, sort_keys=True), "speedup": speedup, "target_name": target_name,
               "run_id": run_id, "attempt_id": attempt_id, "run_db": run_db, "updated_at": now(),
               "row_length": row_length}
        with self._lock, self.db.conn:
            old = next(self.db["tunings"].rows_where("template = ? AND bucket = ? AND gpu = ?",
                                                     [template, bucket, gpu]), None)
            if old is not None:
                if old["speedup"] is not None and (speedup is None or speedup <= old["speedup"]):
                    return False
                self.db["tunings"].update(old["id"], row)
            else:
                self.db["tunings"].insert(row)
        return True

    def seeds(self, templates: list[str], size_log2: int | None, dtypes: str, gpu: str) -> list[dict]:
        """Per template, the remembered tunables of the most similar target on this GPU: same dtypes first, then
        the nearest size bucket, then the fastest. [{template, values, why, id, row_length}]"""
        found = []
        with self._lock:
            for template in templates:
                rows = list(self.db["tunings"].rows_where("template = ? AND gpu = ?", [template, gpu]))
                if not rows:
                    continue
                best = min(rows, key=lambda r: (r["dtypes"] != dtypes,
                                                abs((r["size_log2"] or 0) - (size_log2 or 0)),
                                                -(r["speedup"] or 0), -r["id"]))
                found.append({"template": template, "values": json.loads(best["tunables"]), "id": best["id"],
                              "why": f"T{best['id']}, {best['bucket']} on {best['gpu']} from run {best['run_id']}",
                              "row_length": best.get("row_length")})
        return found

    # -- lessons ---------------------------------------------------------------------------------------------------
    def add_lesson(self, text: str, tags: str, *, target_name: str, gpu: str, run_id: str, run_db: str,
                   evidence: list[dict]) -> int | None:
        """Store a lesson with its evidence; the same text as an active lesson counts as support for it instead.
        Returns the lesson id (None for an empty lesson)."""
        text = clean_lesson(text)
        if not text:
            return None
        with self._lock, self.db.conn:
            same = next(self.db["lessons"].rows_where("lower(text) = ? AND status = 'active'", [text.lower()]), None)
            if same is not None:
                merged = json.loads(same["evidence"] or "[]") + evidence
                self.db["lessons"].update(same["id"], {"support": same["support"] + 1, "evidence": json.dumps(merged),
                                                       "updated_at": now()})
                return same["id"]
            return self.db["lessons"].insert({
                "text": text, "tags": tags, "target_name": target_name, "gpu": gpu, "run_id": run_id,
                "run_db": run_db, "evidence": json.dumps(evidence), "support": 0, "contradict": 0,
                "status": "active", "created_at": now(), "updated_at": now()}).last_pk

    def retrieve(self, words: list[str], k: int = 5) -> list[dict]:
        """The top-k active lessons for these words (FTS5 bm25 over text and tags, any word matching)."""
        terms = sorted({w.lower() for w in words if re.fullmatch(r"[\w.\-+]+", w or "")})
        if not terms:
            return []
        query = " OR ".join('"' + t.replace('"', "") + '"' for t in terms)
        with self._lock:
            rows = list(self.db["lessons"].search(query, where="status = 'active'", limit=k, quote=False))
        return [self._lesson(r) for r in rows]

    def judge(self, lesson_id: int, verdict: str, *, run_id: str, run_db: str, why: str = "") -> dict | None:
        """A later run's verdict on a lesson it was shown: supported or contradicted (anything else is ignored). A
        lesson contradicted more often than supported is retired."""
        if verdict not in ("supported", "contradicted"):
            return None
        with self._lock, self.db.conn:
            row = next(self.db["lessons"].rows_where("id = ?", [lesson_id]), None)
            if row is None:
                return None
            support = row["support"] + (verdict == "supported")
            contradict = row["contradict"] + (verdict == "contradicted")
            status = "retired" if contradict > support else "active"
            self.db["lessons"].update(lesson_id, {"support": support, "contradict": contradict, "status": status,
                                                  "updated_at": now()})
            self.db["judgements"].insert({"lesson_id": lesson_id, "run_id": run_id, "run_db": run_db,
                                          "verdict": verdict, "why": clean_lesson(why), "created_at": now()})
        return {"id": lesson_id, "support": support, "contradict": contradict, "status": status}

    def distilled(self, run_key: str) -> int:
        """How many attempts of this run were already distilled (0 if none)."""
        row = next(self.db["distilled"].rows_where("run_key = ?", [run_key]), None)
        return row["attempts"] if row else 0

    def mark_distilled(self, run_key: str, attempts: int) -> None:
        with self._lock, self.db.conn:
            self.db["distilled"].upsert({"run_key": run_key, "attempts": attempts, "at": now()}, pk="run_key")

    # -- inspection ------------------------------------------------------------------------------------------------
    def tunings(self) -> list[dict]:
        with self._lock:
            return [self._tuning(r) for r in self.db["tunings"].rows_where(order_by="template, gpu, size_log2")]

    def lessons(self, include_retired: bool = True) -> list[dict]:
        where = None if include_retired else "status = 'active'"
        with self._lock:
            return [self._lesson(r) for r in self.db["lessons"].rows_where(where, order_by="id")]

    def get(self, item: str) -> dict:
        """'L3' (a lesson, with its judgements) or 'T2' (a tuning)."""
        kind, number = _item(item)
        with self._lock:
            table = "lessons" if kind == "L" else "tunings"
            row = next(self.db[table].rows_where("id = ?", [number]), None)
            if row is None:
                raise MemoryFileError(f"no {'lesson' if kind == 'L' else 'tuning'} {item} in {self.path}")
            if kind == "T":
                return self._tuning(row)
            lesson = self._lesson(row)
            lesson["judgements"] = list(self.db["judgements"].rows_where("lesson_id = ?", [number], order_by="id"))
            return lesson

    def forget(self, item: str) -> None:
        kind, number = _item(item)
        self.get(item)
        with self._lock, self.db.conn:
            if kind == "L":
                self.db["judgements"].delete_where("lesson_id = ?", [number])
                self.db["lessons"].delete(number)
            else:
                self.db["tunings"].delete(number)

    def forget_retired(self) -> int:
        retired = [r["id"] for r in self.lessons() if r["status"] == "retired"]
        for number in retired:
            self.forget(f"L{number}")
        return len(retired)

    @staticmethod
    def _lesson(row: dict) -> dict:
        return {**{k: v for k, v in row.items() if k != "rank"}, "item": f"L{row['id']}",
                "evidence": json.loads(row.get("evidence") or "[]")}

    @staticmethod
    def _tuning(row: dict) -> dict:
        return {**row, "item": f"T{row['id']}", "tunables": json.loads(row["tunables"])}


def _item(item: str) -> tuple[str, int]:
    item = item.strip().upper()
    if len(item) < 2 or item[0] not in "LT" or not item[1:].isdigit():
        raise MemoryFileError(f"{item!r} is not a memory item (L<number> for a lesson, T<number> for a tuning)")
    return item[0], int(item[1:])


def as_json(value: Any) -> str:
    return json.dumps(value, default=str)
