#!/usr/bin/env bash
# A map of what the main suite (CI) never runs. Runs the suite under coverage.py with every
# process it starts measured (see .coveragerc), then prints the line coverage of each product
# package and every block of lines never executed. docs/GPU_CHECK.md lists the GPU-only ones.
#
#   bash scripts/coverage.sh [pytest args]    e.g. tests/training to map part of the suite
#
# Not a CI step: one run takes about as long as the suite itself, plus a third. Writes
# .coverage-data/ (data) and reports/coverage.txt (the printed report).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-test.txt
rm -rf .coverage-data && mkdir -p .coverage-data reports
# Two xdist workers, as scripts/test.sh runs it (TEST_WORKERS=N to change); the workers and
# everything they start are measured. Coverage slows every line, so a test near its time
# budget may fail here: the map still shows what ran, and the exit status says so.
status=0
COVERAGE_RCFILE="$PWD/.coveragerc" .venv/bin/python -m coverage run -m pytest -p no:cacheprovider \
    -n "${TEST_WORKERS:-2}" --dist loadgroup -q "$@" || status=$?
.venv/bin/python -m coverage combine -q
.venv/bin/python scripts/coverage_map.py | tee reports/coverage.txt
[ "$status" = 0 ] || echo "coverage: the suite itself failed (pytest exit $status): the map shows what ran" >&2
exit "$status"
