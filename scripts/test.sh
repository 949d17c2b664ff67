#!/usr/bin/env bash
# Everything the test suite needs, then the suite. Used by CI and by the README.
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
exec .venv/bin/python -m pytest "$@"
