"""SASS evidence from a run database: for every run, its best verified Triton and best verified PTX attempt, with the
count of each Hopper instruction in their SASS (HGMMA = wgmma, UTMALDG/UTMASTG = TMA loads/stores, USETMAXREG = warp
specialization's register split, HMMA = pre-Hopper mma.sync, LDGSTS = cp.async).

    python3 tests/experiments/sass_evidence.py RUNS.db [--json OUT.json]

Issue 15 asks for this next to the bench table: that wgmma and TMA are what runs in the best matmul kernels.
"""
from __future__ import annotations

import argparse
import json
import re
import sqlite3
import sys

OPS = ("HGMMA", "HMMA", "UTMALDG", "UTMASTG", "USETMAXREG", "LDGSTS", "LDG", "STG", "LDL", "STL")


# An instruction line of cuobjdump's listing: `/*0a30*/ @!P0 HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4] ;`
INSTRUCTION = re.compile(r"^\s*(?:/\*[0-9a-f]+\*/)?\s*(?:@!?U?P[T0-9]\s+)?([A-Z][A-Z0-9_]*)[.\s;]", re.MULTILINE)


def count_ops(sass: str, ops: tuple[str, ...] = OPS) -> dict[str, int]:
    """Instructions, not mentions (a kernel's name, a comment): the opcode that begins an instruction line."""
    opcodes = INSTRUCTION.findall(sass)
    return {op: opcodes.count(op) for op in ops}


def best_attempts(db: sqlite3.Connection) -> list[dict]:
    rows = db.execute("""
        SELECT r.target_name, a.run_id, a.number, a.language, json_extract(a.time_us, '$.median') AS median_us, a.sass
        FROM attempts a JOIN runs r ON r.id = a.run_id
        WHERE a.verdict = 'correct' AND json_extract(a.time_us, '$.median') IS NOT NULL
        ORDER BY a.run_id, a.language, median_us""").fetchall()
    best: dict[tuple, dict] = {}
    for target, run_id, number, language, median_us, sass in rows:
        if (run_id, language) in best:
            continue
        kernels = json.loads(sass or "{}")
        best[(run_id, language)] = {"target": target, "run_id": run_id, "attempt": number, "language": language,
                                    "median_us": round(median_us, 1),
                                    "sass_ops": {name: count_ops(text) for name, text in kernels.items()}}
    return list(best.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    try:
        db = sqlite3.connect(f"file:{args.db}?mode=ro", uri=True)
        rows = best_attempts(db)
    except sqlite3.Error as e:
        print(f"error: {args.db}: {e}", file=sys.stderr)
        return 2
    for row in rows:
        for kernel, ops in row["sass_ops"].items() or [("-", {})]:
            counts = " ".join(f"{op}={n}" for op, n in ops.items() if n)
            print(f"{row['target']} run {row['run_id']} best {row['language']} #{row['attempt']} "
                  f"{row['median_us']} us  {kernel}: {counts or 'no SASS recorded'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
