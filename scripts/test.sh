#!/usr/bin/env bash
# Everything the test suite needs, the type check, then the suite. Used by CI and by the README.
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
# The static type check first (pyrightconfig.json: pyright's basic mode over the product code,
# docs/GPU_CHECK.md#the-static-type-check): a type error fails the run as a failed test does.
started=$SECONDS
if ! types="$(.venv/bin/basedpyright 2>&1)"; then
    printf '%s\n' "$types" >&2
    echo "test: type check failed ($(tail -n 1 <<<"$types")); fix them, or see them again with .venv/bin/basedpyright" >&2
    exit 1
fi
echo "test: type check: $(tail -n 1 <<<"$types") ($((SECONDS - started)) s)"
workers="${TEST_WORKERS:-2}"
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
