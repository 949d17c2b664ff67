#!/usr/bin/env bash
# Proof on a GPU machine in one command (docs/GPU_CHECK.md): every mode for one short epoch,
# precisions and options, resume, SIGTERM + resume, a profiled run, the gpu-marked tests and,
# with 2+ GPUs, a 2-GPU pass. Writes gpu_check/gpu_check.md and .json; exit 0 / 1 (a failure)
# / 2 (no CUDA, or a bad option) / 3 (a check left out by --budget). About 10 minutes on one
# H100 by its estimate (never measured): --part 1/2 then --part 2/2 fit 10-minute commands.
#
#   bash scripts/gpu_check.sh [--out DIR] [--no-tests] [--only NAMES] [--part K/N] [--budget S] [--list]
#   bash scripts/gpu_check.sh --rehearse          # the same plan on this CPU, no GPU needed
#   PYTHON=python3 bash scripts/gpu_check.sh      # a Python that has torch: no .venv, no internet
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    bash "$ROOT/scripts/setup.sh" requirements-test.txt >&2 || { echo "gpu_check: set-up failed; see above" >&2; exit 1; }
    PYTHON="$ROOT/.venv/bin/python"
fi
exec "$PYTHON" "$ROOT/scripts/gpu_check.py" "$@"
