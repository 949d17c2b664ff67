#!/usr/bin/env bash
# CI's slow step: the tests marked `slow` (pytest.ini), end-to-end runs that cost the most wall
# time per check and that the main suite (scripts/test.sh) leaves out to stay under 10 minutes
# on 2 cores. Two pytest-xdist workers as in the main suite (TEST_WORKERS=N to change);
# arguments go to pytest. The step's own time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-test.txt
# Some are profiled runs: without nsys they skip (under CI=true they fail, tests/nsys_helpers.py).
bash scripts/install_nsys.sh || echo "test_slow: Nsight Systems unavailable: its profiled tests will not run" >&2
started=$SECONDS
status=0
.venv/bin/python -m pytest -m slow -n "${TEST_WORKERS:-2}" --dist loadgroup "$@" || status=$?
echo "test_slow: $((SECONDS - started)) s for the slow tests (exit $status)"
exit $status
