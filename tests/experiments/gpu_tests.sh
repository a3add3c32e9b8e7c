#!/usr/bin/env bash
# The GPU tests (-m "gpu or device") in parts that each fit one call of a lent GPU machine (600 s at most; all of
# them take longer on an H100): the collected tests, in order, cut into PARTS contiguous slices, and the PART-th run.
#
#   tests/experiments/gpu_tests.sh PART PARTS [PYTEST-ARGS...]     e.g. 1 3, then 2 3, then 3 3
#
# Writes $OUT/gpu-tests-PART-of-PARTS.log (OUT: out/) and prints its last lines: failures with short tracebacks,
# the slowest tests, the summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
usage="usage: tests/experiments/gpu_tests.sh PART PARTS [PYTEST-ARGS...] (1 <= PART <= PARTS)"
part=${1:-}
parts=${2:-}
if ! [[ "$part" =~ ^[1-9][0-9]*$ && "$parts" =~ ^[1-9][0-9]*$ ]] || (( part > parts )); then
    echo "error: $usage" >&2
    exit 2
fi
shift 2
OUT=${OUT:-out}
mkdir -p "$OUT"
source tests/experiments/gpu_env.sh
mapfile -t ids < <(python3 -m pytest -p no:cacheprovider -q -m "gpu or device" --collect-only 2>/dev/null | grep "::")
if (( ${#ids[@]} == 0 )); then
    echo "error: no GPU tests collected (python3 -m pytest --collect-only fails here?)" >&2
    exit 2
fi
size=$(( (${#ids[@]} + parts - 1) / parts ))
slice=("${ids[@]:$(( (part - 1) * size )):$size}")
if (( ${#slice[@]} == 0 )); then   # more parts than tests: without ids pytest would run them all
    echo "part $part of $parts: no tests left for it (${#ids[@]} in all)"
    exit 0
fi
log="$OUT/gpu-tests-$part-of-$parts.log"
echo "part $part of $parts: ${#slice[@]} of ${#ids[@]} tests, log in $log"
python3 -m pytest -p no:cacheprovider -q -rfE --tb=short --durations=15 "${slice[@]}" "$@" > "$log" 2>&1
code=$?
tail -60 "$log"
exit $code
