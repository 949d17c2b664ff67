#!/usr/bin/env bash
# Everything the test suite needs, then the suite. Used by CI and by the README.
# One pytest process by default. TEST_WORKERS=N runs N pytest-xdist workers (tests/parallel.py
# keeps the tests that share a module's fixture on one worker), but on 2 cores it is not
# the default: two workers each starting 2-rank trainings ran the 2-epoch fixtures past their
# budgets (measured 2026-11-23, fresh clone and idle checkout). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-test.txt
if ! bash scripts/install_nsys.sh; then
    if [ "${CI:-}" = "true" ]; then
        echo "test: CI needs Nsight Systems for the profiling tests and it could not be installed" >&2
        exit 1
    fi
    echo "test: Nsight Systems unavailable: profiling tests will be skipped" >&2
fi
workers="${TEST_WORKERS:-0}"
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
