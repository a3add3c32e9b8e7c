#!/usr/bin/env bash
# KernelBench on one GPU with the offline policy (no API key): `kloop suite`, resumable across calls.
#
#   tests/experiments/suite_kernelbench.sh KERNELBENCH [DB]
#
#   KERNELBENCH  the folder holding KernelBench's level1/ (e.g. kernelbench/KernelBench, carried to the machine)
#   DB           the run database (default runs/suite-level1.db). When DB is missing and DB.gz is there, DB.gz is
#                unpacked first: carry back the suite.db.gz a previous call left in $OUT (as runs/suite-level1.db.gz)
#                and this call continues where that one stopped (finished problems are skipped; the one in flight
#                is resumed). A database over 15 MB gzipped comes back in parts, suite.db.gz.00, .01, ...: carry
#                them back as DB.gz.00, DB.gz.01, ... A DB.xz (as results/ keeps databases) is unpacked likewise.
#   Environment: LEVELS (1), PROBLEMS (globs of --problems; default all), RERUN (globs of --rerun), STARTER_TIMEOUT
#   (--starter-timeout seconds), MAX_ATTEMPTS (3), JOBS (8 starters generated in parallel),
#   GPUS (--gpus: all on a pair runs two problems at a time, one per GPU; default this process's GPU), BUDGET_S (400: seconds
#   `kloop suite` runs before it is stopped with SIGINT, as Ctrl-C: the problem in flight is marked stopped, the
#   report is written), OUT (out/).
#
# Writes to $OUT, 7 files: report/{report.md, problems.csv, report.json, speedups.png, sol.png} (outcome.png
# instead of the last two without a GPU), suite.db.gz (the database: gunzip it, or carry it back as DB.gz),
# suite.log (everything printed). The last lines printed are the report's numbers. A lent GPU machine returns at
# most 8 files a call: two suites in one call lose the second's log and report (its database redraws the report:
# `kloop suite ... --report-only`).
set -uo pipefail
cd "$(dirname "$0")/../.."
KB=${1:?usage: tests/experiments/suite_kernelbench.sh KERNELBENCH [DB]}
DB=${2:-runs/suite-level1.db}
OUT=${OUT:-out}
LEVELS=${LEVELS:-1}
MAX_ATTEMPTS=${MAX_ATTEMPTS:-3}
JOBS=${JOBS:-8}
BUDGET_S=${BUDGET_S:-400}
began=$(date +%s)
mkdir -p "$OUT/report" "$(dirname "$DB")"

source tests/experiments/gpu_env.sh
if [ ! -f "$DB" ] && [ -f "$DB.gz" ]; then
    gunzip -c "$DB.gz" > "$DB" && echo "continuing the suite in $DB (from $DB.gz)"
elif [ ! -f "$DB" ] && [ -f "$DB.gz.00" ]; then   # a database that came back in parts
    cat "$DB".gz.[0-9][0-9] | gunzip -c > "$DB" && echo "continuing the suite in $DB (from $DB.gz.00...)"
elif [ ! -f "$DB" ] && [ -f "$DB.xz" ]; then       # as results/ keeps them (Python's lzma: no xz binary needed)
    python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
        "$DB.xz" "$DB" && echo "continuing the suite in $DB (from $DB.xz)"
fi

args=("$KB" --levels "$LEVELS" --policy offline --max-attempts "$MAX_ATTEMPTS" --db "$DB" --out "$OUT/report")
[ -n "${PROBLEMS:-}" ] && args+=(--problems "$PROBLEMS")
[ -n "${RERUN:-}" ] && args+=(--rerun "$RERUN")
[ -n "${STARTER_TIMEOUT:-}" ] && args+=(--starter-timeout "$STARTER_TIMEOUT")
[ -n "${GPUS:-}" ] && args+=(--gpus "$GPUS")
# --foreground: SIGINT reaches kloop alone, which stops its evaluator and generators itself; -k: a hard stop after
timeout --foreground -s INT -k 45 "$BUDGET_S" python3 -m agent.cli suite "${args[@]}" --jobs "$JOBS" 2>&1 \
    | tee "$OUT/suite.log"
code=${PIPESTATUS[0]}
if [ ! -f "$OUT/report/report.json" ] || [ "$code" = 137 ]; then   # killed before it wrote its report
    python3 -m agent.cli suite "${args[@]}" --report-only >> "$OUT/suite.log" 2>&1
fi
python3 - "$DB" <<'PY'
import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as db:   # fold the WAL into the file before it is copied
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
PY
gzip -c "$DB" > "$OUT/suite.db.gz"
echo "kloop suite exit $code after $(( $(date +%s) - began )) s; database $DB ($(du -h "$OUT/suite.db.gz" | cut -f1) gzipped in $OUT/suite.db.gz)"
if (( $(stat -c %s "$OUT/suite.db.gz") > 15 * 1024 * 1024 )); then   # a lent machine returns files of 16 MB at most
    split -b 15M -d "$OUT/suite.db.gz" "$OUT/suite.db.gz." && rm "$OUT/suite.db.gz"
    echo "in parts: $(cd "$OUT" && echo suite.db.gz.*) (carry them back as DB.gz.00, DB.gz.01, ...)"
fi
python3 - "$OUT/report/report.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s, gpu = d["summary"], (d["context"].get("gpu") or {}).get("name") or "no GPU"
st = s["statuses"]
print(f"{gpu}: {s['finished']}/{s['problems']} problems finished (done {st['done']}, skipped {st['skipped']}, "
      f"failed {st['failed']}, stopped {st['stopped']}, not reached {st['not reached']})")
print(f"{'':<34}{'vs eager':>12}{'vs compile':>12}")
print(f"{'correct (fast_0)':<34}{s['verified']:>12}")
for p in ("1", "1.2", "2"):
    c = s["fast_p_counts"]
    print(f"{'fast_' + p:<34}" + "".join(f"{'-' if c[b][p] is None else c[b][p]:>12}" for b in ("eager", "compile")))
for key, label in (("verified_only", "geomean, verified only"), ("all_problems_fallback_1x", "geomean, all (1.0x if none)")):
    g = [s["geomean"][b][key] for b in ("eager", "compile")]
    print(f"{label:<34}" + "".join(f"{v:>11.2f}x" if v else f"{'-':>12}" for v in g))
q = s["sol_fraction"]["quartiles"]
if q:
    print(f"SOL fraction quartiles {q['p25']:.0%} / {q['median']:.0%} / {q['p75']:.0%} over {s['sol_fraction']['count']}")
print(f"attempts {s['attempts']['total']}, wall {s['seconds']['total']:.0f} s, median {s['seconds']['median'] or 0:.0f} s per problem")
PY
