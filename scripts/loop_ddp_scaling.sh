#!/usr/bin/env bash
# Run `python -m bench.ddp_scaling --quick` (the call tests/tools/test_bench.py makes) RUNS times
# and count the passes: the proof that the rank-exit crash (SIGABRT, "terminate called
# without an active exception") is gone.
#
#   RUNS=30 PYTHON=.venv/bin/python scripts/loop_ddp_scaling.sh [log folder]
#
# Each run's output is kept in the log folder; a crashed rank leaves a core file there too
# (ulimit -c), and Python's faulthandler prints every thread's stack on a fatal signal.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUNS="${RUNS:-30}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
LOGS="${1:-$(mktemp -d -t loop-ddp-scaling-XXXX)}"
mkdir -p "$LOGS"
ulimit -c unlimited 2>/dev/null || true

passed=0
for ((i = 1; i <= RUNS; i++)); do
    start=$SECONDS
    # As tests/tools/test_bench.py runs it: one thread per process, no GPU.
    (cd "$LOGS" && OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= PYTHONFAULTHANDLER=1 PYTHONPATH="$ROOT" \
        "$PYTHON" -m bench.ddp_scaling --quick --json "$LOGS/run$i.json" >"$LOGS/run$i.log" 2>&1)
    rc=$?
    if [[ $rc -eq 0 ]] && grep -q '"bench": "ddp_scaling"' "$LOGS/run$i.json" 2>/dev/null; then
        passed=$((passed + 1)) verdict=pass
    else
        verdict="FAIL (exit $rc)"
    fi
    echo "run $i/$RUNS: $verdict in $((SECONDS - start)) s, load $(cut -d' ' -f1 /proc/loadavg)"
done
echo "passed $passed of $RUNS; logs in $LOGS"
[[ $passed -eq $RUNS ]]
