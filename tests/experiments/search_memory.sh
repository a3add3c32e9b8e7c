#!/usr/bin/env bash
# Issue 14's GPU goals with the offline policy (no API key), side by side in one call of at most BUDGET_S seconds:
#  1. Strategies: `kloop suite` over built-in targets' files under refine, best-of-n, metr and evolve at an equal
#     --max-attempts. Goal: on every target, evolve and metr each reach at least the best kernel refine reaches (as
#     fast, or the very same source); attempts to 98% of each run's best are reported.
#  2. Tuning memory: the built-in softmax's file (8192 x 8192) with a fresh --memory, then another shape of the op,
#     tests/experiments/problems/softmax.py (4096 x 16384), once with that memory and once with --no-memory, at the
#     same budget and --strategy-seed. Goal: with memory, 98% of the run's final best in at most a third of the
#     attempts the run without memory needs.
#
#   OUT=out tests/experiments/search_memory.sh
#
# Environment: TARGETS (vector_add,softmax,layernorm: files under tools/targets/), ATTEMPTS (6 per target and
# strategy), MEMORY_ATTEMPTS (8 per memory run), MEMORY_RUN_S (120: the most one memory run may take),
# STRATEGY_BUDGET_S (380: the most the suite may take), BUDGET_S (520: the whole script), OUT (out/).
# The memory runs go first: one cut short would void their comparison (it is flagged), while a suite stopped by
# the budget (SIGINT, as Ctrl-C: it writes its report) still compares the strategies on the targets it finished.
#
# Given as files, targets get the offline policy's Inductor starter (the Triton torch.compile generates), not the
# catalog starters of `kloop optimize NAME`: `kloop suite` takes files. Both softmax files get the template
# inductor/softmax (a file target's template is named after its file), which tuning memory is keyed by. Budgets are
# fixed (--patience and --target-sol never stop a memory run early; the suite sets patience to its budget), so a
# run's final best is the best of the same number of attempts.
#
# Writes to $OUT: strategies/{report.md, report.json, problems.csv, PNGs} (the suite's report), memory.db (the
# tuning memory), runs.db.gz (every run: gunzip, then `kloop show RUN --db`), search_memory.log (everything printed),
# summary.json (the numbers of the table). The table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
TARGETS=${TARGETS:-vector_add,softmax,layernorm}
ATTEMPTS=${ATTEMPTS:-6}
MEMORY_ATTEMPTS=${MEMORY_ATTEMPTS:-8}
MEMORY_RUN_S=${MEMORY_RUN_S:-120}
STRATEGY_BUDGET_S=${STRATEGY_BUDGET_S:-380}
BUDGET_S=${BUDGET_S:-520}
DB=runs/search_memory.db
deadline=$(( $(date +%s) + BUDGET_S ))
mkdir -p "$OUT" runs
rm -rf "$OUT/strategies" "$OUT/memory.db" "$OUT/summary.json" "$DB" "$DB"-wal "$DB"-shm  # a fresh measurement

memory_run() {   # TARGET MEMORY-OPTION...: one fixed-budget run, its id appended to run_ids
    local id
    # --foreground: SIGINT reaches kloop alone, which stops its evaluator; -k: a hard stop after
    timeout --foreground -s INT -k 20 "$MEMORY_RUN_S" python3 -m agent.cli optimize "$@" --policy offline \
        --max-attempts "$MEMORY_ATTEMPTS" --patience "$MEMORY_ATTEMPTS" --target-sol 10 --strategy-seed 1 \
        --db "$DB" | tee /tmp/search_memory_run.log | awk '!kernel; /^best verified kernel/ {kernel = 1}'
    id=$(grep -m1 -oE '^run [0-9a-f]+ in' /tmp/search_memory_run.log | cut -d' ' -f2)
    run_ids+=("${id:-none}")
}

main() {
source tests/experiments/gpu_env.sh

echo "== tuning memory: softmax 8192 x 8192, then 4096 x 16384 with and without it, ${MEMORY_ATTEMPTS} attempts each"
run_ids=()
memory_run tools/targets/softmax.py --memory "$OUT/memory.db"
memory_run tests/experiments/problems/softmax.py --memory "$OUT/memory.db"
memory_run tests/experiments/problems/softmax.py --no-memory

left=$(( deadline - $(date +%s) - 30 ))   # 30 s for the report and the table
limit=$(( left < STRATEGY_BUDGET_S ? left : STRATEGY_BUDGET_S ))
echo "== strategies: ${TARGETS} x refine,best-of-n,metr,evolve, ${ATTEMPTS} attempts each, within ${limit} s"
problems=()
for t in ${TARGETS//,/ }; do problems+=("tools/targets/$t.py"); done
suite=("${problems[@]}" --policy offline --strategy refine,best-of-n,metr,evolve --max-attempts "$ATTEMPTS"
       --db "$DB" --out "$OUT/strategies")
timeout --foreground -s INT -k 20 "$(( limit > 10 ? limit : 10 ))" python3 -m agent.cli suite "${suite[@]}"
code=$?
if [ ! -f "$OUT/strategies/report.json" ] || [ "$code" = 137 ]; then   # killed before it wrote its report
    python3 -m agent.cli suite "${suite[@]}" --report-only
fi
echo "kloop suite exit $code"

python3 - "$DB" <<'PY'
import sqlite3, sys
with sqlite3.connect(sys.argv[1]) as db:   # fold the WAL into the file before it is copied
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
PY
gzip -c "$DB" > "$OUT/runs.db.gz"
echo "done $(( BUDGET_S - deadline + $(date +%s) )) s after the start; every run in $OUT/runs.db.gz"

python3 - "$OUT" "$DB" "$ATTEMPTS" "$MEMORY_ATTEMPTS" "${run_ids[@]}" <<'PY'
import json, sys
from pathlib import Path
from tools.records.store import open_db
from tools.records.suite_report import collect

out, db, attempts, memory_attempts, *run_ids = sys.argv[1:]
store = open_db(db)
path = Path(out) / "strategies/report.json"
report = json.loads(path.read_text()) if path.is_file() else {"summaries": {}, "context": {}, "strategies": [],
                                                                  "problems": []}
x = lambda v: f"{v:.2f}x" if v else "-"  # noqa: E731


def source_hash(run_id, number):
    row = store.db.execute("SELECT source_hash FROM attempts WHERE run_id = ? AND number = ?",
                           [run_id, number]).fetchone()
    return row[0] if row else None


# -- 1. strategies: the best kernel per target and strategy
strategies = [r["strategy"] for r in report["strategies"]]
best = {}
for p in report["problems"]:
    if p["status"] in ("done", "skipped", "failed"):
        best.setdefault(p["problem"], {})[p["strategy"]] = {
            "verified": p["verified"], "speedup_eager": p["speedup_eager"], "attempts_to_98": p["attempts_to_98"],
            "best_attempt": p["best_attempt"], "run_id": p["run_id"],
            "source_hash": source_hash(p["run_id"], p["best_attempt"]) if p["verified"] else None}
compared = [t for t, by in best.items() if set(by) == set(strategies)]   # finished under every strategy
misses, same_kernel = [], []   # slower than refine's best with another kernel / with refine's very kernel
for t in compared:
    refine = best[t]["refine"]
    for s in ("evolve", "metr"):
        mine = best[t][s]
        if not refine["verified"] or (mine["speedup_eager"] or 0) >= (refine["speedup_eager"] or 0) > 0:
            continue
        slower = f"{t}: {s} {x(mine['speedup_eager'])} < refine {x(refine['speedup_eager'])}"
        if mine["source_hash"] is not None and mine["source_hash"] == refine["source_hash"]:
            same_kernel.append(slower)
        else:
            misses.append(slower)

# -- 2. tuning memory: attempts to 98% of each run's final best (the suite report's definition)
names = ("first run (softmax 8192 x 8192, fresh memory)", "with memory (4096 x 16384)",
         "without memory (4096 x 16384)")
memory, gpus = [], [(report["context"].get("gpu") or {}).get("name")]
for name, run_id in zip(names, run_ids):
    r = collect(store, [{"run_id": run_id}])[0] if run_id != "none" else {"attempts": 0}
    run = store.get_run(run_id) if run_id != "none" else {}
    gpus.append(run.get("gpu_name"))
    settings = run.get("settings") or {}
    memory.append({"run": name, "run_id": run_id, "attempts": r["attempts"], "status": run.get("status"),
                   "seeded_from_memory": bool(settings.get("memory_seeds")), "best_attempt": r.get("best_attempt"),
                   "speedup_eager": r.get("speedup_eager"), "attempts_to_98": r.get("attempts_to_98")})
with_memory, without = memory[1]["attempts_to_98"], memory[2]["attempts_to_98"]
cut = [m["run"] for m in memory if m["attempts"] != int(memory_attempts)]
gpu = next((g for g in gpus if g), None)
timed = any(s and s["timing_is_real"] for s in report["summaries"].values()) or any(m["speedup_eager"] for m in memory)
strategy_goal = None if not timed or not compared else not misses
memory_goal = None if not timed or with_memory is None or without is None else with_memory * 3 <= without

summary = {"gpu": gpu, "timing_is_real": timed,
           "strategies": {"attempts_per_run": int(attempts), "targets": list(best), "per_strategy": report["strategies"],
                          "best": best, "goal": "evolve and metr each reach at least refine's best kernel per target",
                          "goal_met": strategy_goal, "misses": misses,
                          "same_kernel_timed_slower": same_kernel, "compared_targets": compared},
           "memory": {"attempts_per_run": int(memory_attempts), "runs": memory, "runs_short_of_budget": cut,
                      "goal": "with memory, attempts to 98% <= 1/3 of those without", "goal_met": memory_goal}}
(Path(out) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")

verdict = lambda met: "not measured (no timing)" if met is None else ("met" if met else "NOT met")  # noqa: E731
print()
print(f"== {gpu or 'no CUDA GPU'}, offline policy")
if not timed:
    print("!! NO GPU: kernels ran under the Triton interpreter on CPU tensors at small shapes; NO TIMING IS REAL.")
    print("!! Speedups and attempts-to-98% are absent or mean 'first verified attempt'; the goals are not measured.")
targets = list(best)
print(f"strategies, {attempts} attempts per target each:")
print(f"{'strategy':<11}{'verified':>9}{'geomean x eager':>16}{'med. att. to 98%':>17}" + "".join(f"{t:>13}" for t in targets))
for row in report["strategies"]:
    s = row["strategy"]
    cells = [x(best[t][s]["speedup_eager"]) if best[t].get(s, {}).get("verified") and timed else
             ("verified" if best[t].get(s, {}).get("verified") else "-") for t in targets]
    median = row["median_attempts_to_98"]
    print(f"{s:<11}{str(row['verified']) + '/' + str(row['finished']):>9}{x(row['geomean_eager']):>16}"
          f"{'-' if median is None else f'{median:g}':>17}" + "".join(f"{c:>13}" for c in cells))
print(f"goal, evolve and metr each reach refine's best kernel (targets compared: {len(compared)}): "
      f"{verdict(strategy_goal)}"
      + (f" ({'; '.join(misses)})" if misses else ""))
if same_kernel and timed:
    print(f"  timed slower but refine's very kernel (same source: timing spread): {'; '.join(same_kernel)}")
a, b = memory[1], memory[2]
print(f"tuning memory, {memory_attempts} attempts per run (best x eager; attempts to 98% of the run's final best):")
print(f"  with memory {a['attempts_to_98'] or '-'} ({x(a['speedup_eager'])}"
      f"{', seeded' if a['seeded_from_memory'] else ', NOT seeded from memory'}), "
      f"without {b['attempts_to_98'] or '-'} ({x(b['speedup_eager'])})"
      + (f"; short of the budget: {', '.join(cut)}" if cut else ""))
print(f"goal, with memory <= 1/3 of the attempts without: {verdict(memory_goal)}")
PY
}

main 2>&1 | tee "$OUT/search_memory.log"
