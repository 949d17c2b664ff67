#!/usr/bin/env bash
# A map of what CI never runs. Runs CI's steps under coverage.py with every process they start
# measured (see .coveragerc), then prints the line coverage of each product package and every
# block of lines never executed. docs/GPU_CHECK.md lists the GPU-only ones.
#
#   bash scripts/coverage.sh [pytest args]                 the main suite only (step `main`)
#   bash scripts/coverage.sh --ci-steps [pytest args]      every CI step that runs here
#   bash scripts/coverage.sh --steps rehearsal,cluster     only these steps, kept beside the others
#
# Pytest args go to the steps that run pytest (main, slow, cluster), e.g. `--steps cluster -k net`.
# Steps (.ci/run): `main` (scripts/test.sh's pytest), `rehearsal`
# (the whole `scripts/gpu_check.sh --rehearse`), `slow` (scripts/test_slow.sh's pytest: the
# tests marked `slow`) and `cluster` (scripts/test_cluster.sh, under
# `flock /tmp/cluster.lock`; it needs root and the Slurm tools). CI's old-torch smoke is never
# measured: it runs in its own venv on torch 2.6, without coverage.py.
# Each step keeps its data in .coverage-data/STEP/ (with STEP/step.txt: when, how long, exit
# status), so one step can be run again alone; the map reads them all combined
# (.coverage-data/cov) and names the steps it holds. Writes reports/coverage.txt too.
#
# Not a CI step: the main suite alone takes about as long as the suite itself, plus a third.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=main
case "${1:-}" in
    --ci-steps) steps=main,rehearsal,slow,cluster; shift ;;
    --steps) steps="${2:?--steps needs a list, e.g. main,rehearsal}"; shift 2 ;;
esac
for step in ${steps//,/ }; do
    case "$step" in
        main|rehearsal|slow|cluster) ;;
        *) echo "coverage: unknown step '$step'; choose from main, rehearsal, slow, cluster" >&2; exit 2 ;;
    esac
done
bash scripts/setup.sh requirements-test.txt
mkdir -p .coverage-data reports
rc="$PWD/.coveragerc"
status=0

# Runs one step with every Python process it starts measured: the pytest of `main` through
# `coverage run` (its xdist workers and what they start follow by .coveragerc's patches), the
# steps a shell starts through COVERAGE_PROCESS_START (start=env), which every Python of this
# .venv reads at start-up (coverage's .pth file).
measure() {
    local step="$1" start="$2"; shift 2
    local dir="$PWD/.coverage-data/$step" started=$SECONDS code=0
    local -a env=(COVERAGE_RCFILE="$rc" COVERAGE_FILE="$dir/cov")
    [ "$start" = env ] && env+=(COVERAGE_PROCESS_START="$rc")
    rm -rf "$dir" && mkdir -p "$dir"
    echo "coverage: step $step: $*" >&2
    env "${env[@]}" "$@" || code=$?
    COVERAGE_RCFILE="$rc" COVERAGE_FILE="$dir/cov" .venv/bin/python -m coverage combine -q "$dir" || code=$?
    printf '%s %s %d s, exit %d\n' "$step" "$(date -u +%Y-%m-%dT%H:%MZ)" $((SECONDS - started)) "$code" > "$dir/step.txt"
    if [ "$code" != 0 ]; then
        echo "coverage: step $step failed (exit $code): the map still shows what it ran" >&2
        status=1
    fi
}

for step in ${steps//,/ }; do
    case "$step" in
        # Two xdist workers, as scripts/test.sh runs it (TEST_WORKERS=N to change). Coverage
        # slows every line, so a test near its time budget may fail here.
        # `slow` the same with `-m slow`, as scripts/test_slow.sh runs it.
        main|slow)
            marker=(); [ "$step" = main ] || marker=(-m slow)
            measure "$step" run .venv/bin/python -m coverage run -m pytest -p no:cacheprovider "${marker[@]}" \
                -n "${TEST_WORKERS:-2}" --dist loadgroup -q "$@" ;;
        rehearsal)
            out="$(mktemp -d)"
            measure rehearsal env env PYTHON=.venv/bin/python bash scripts/gpu_check.sh --rehearse --out "$out"
            rm -rf "$out" ;;
        # Held under the lock every user of the cluster takes (tests need it alone), and
        # left down (a no-op when its tests already took it down).
        cluster) measure cluster env flock /tmp/cluster.lock bash -c \
                     'status=0; bash scripts/test_cluster.sh "$@" || status=$?; bash scripts/cluster.sh down; exit $status' \
                     cluster "$@" ;;
    esac
done
# The map reads every step measured so far, this run's or an earlier one's.
rm -f .coverage-data/cov
COVERAGE_RCFILE="$rc" .venv/bin/python -m coverage combine -q --keep .coverage-data/*/cov
.venv/bin/python scripts/coverage_map.py | tee reports/coverage.txt
exit "$status"
