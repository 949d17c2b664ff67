#!/usr/bin/env bash
# Everything the test suite needs, then the suite. Used by CI and by the README.
# Two pytest-xdist workers (none on a 1-core machine; TEST_WORKERS=N chooses): the tests'
# own processes leave a core idle a third of the time, and tests/parallel.py keeps
# the tests that share a module's fixture on one worker. Arguments go to pytest.
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
workers="${TEST_WORKERS:-$(( $(nproc) >= 2 ? 2 : 0 ))}"
exec .venv/bin/python -m pytest -n "$workers" --dist loadgroup "$@"
