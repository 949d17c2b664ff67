#!/usr/bin/env bash
# Everything the test suite needs, then the suite. Used by CI and by the README.
# Two pytest-xdist workers by default (TEST_WORKERS=N for N, 0 for one process);
# tests/parallel.py keeps the tests that share a module's fixture on one worker. Every process
# runs with OMP_WAIT_POLICY=PASSIVE (tests/conftest.py): with spinning OpenMP threads, two
# trainings side by side on 2 cores ran ten times slower. Arguments go to pytest.
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
workers="${TEST_WORKERS:-2}"
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
