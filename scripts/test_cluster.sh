#!/usr/bin/env bash
# CI's multi-host step: the tests marked `cluster` (tests/tools/test_cluster.py, test_cluster_identity.py, the delay line's
# tests/tools/test_cluster_net.py, bench.comm's two-host smoke in tests/tools/test_bench_comm.py,
# the per-node profiles of tests/profiling/test_profile_cluster.py) on a local Slurm cluster in network namespaces
# (scripts/cluster.sh; root needed). They print the cluster's set-up time ("cluster set-up:
# ..."); the step's own time is printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh requirements-test.txt
started=$SECONDS
status=0
.venv/bin/python -m pytest -m cluster tests/tools/test_cluster.py tests/tools/test_cluster_identity.py \
    tests/tools/test_cluster_net.py tests/tools/test_bench_comm.py tests/profiling/test_profile_cluster.py "$@" || status=$?
echo "test_cluster: $((SECONDS - started)) s for set-up and the cluster tests (exit $status)"
exit $status
