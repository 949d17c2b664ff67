#!/usr/bin/env bash
# Proof on a GPU machine in one command (docs/GPU_CHECK.md): every mode for one short epoch,
# precisions and options, resume, SIGTERM + resume, a profiled run, the gpu-marked tests and,
# with 2+ GPUs, a 2-GPU pass. Writes gpu_check/gpu_check.md and .json; exit 0 / 1 (a failure)
# / 2 (no CUDA, or a bad option) / 3 (a check left out by --budget) / 143 (stopped by SIGTERM).
#
#   bash scripts/gpu_check.sh [--out DIR] [--no-tests] [--only NAMES] [--part K/N] [--budget S] [--list]
#   bash scripts/gpu_check.sh --rehearse          # the same plan on this CPU, no GPU needed
#   bash scripts/gpu_check.sh --offline           # no package index: the first Python with torch, no install
#   PYTHON=python3 bash scripts/gpu_check.sh      # a Python that has torch: no .venv, no internet
#
# Without PYTHON it installs .venv through scripts/setup.sh, unless --offline is given or no
# package index answers within GPU_CHECK_INDEX_WAIT_S (5) seconds: then it is --offline.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "gpu_check: $*" >&2; }

offline=0
for arg in "$@"; do [[ $arg == --offline ]] && offline=1; done

source "$ROOT/scripts/find_python.sh"  # index_answers, python_with_torch

# The options first, before any set-up, venv or download: one line per bad one (gpu_check.py's
# check_options; it needs only the standard library).
if [[ -n "${PYTHON:-}" ]] && ! command -v "$PYTHON" >/dev/null 2>&1; then
    say "PYTHON=$PYTHON is not a program that runs; name a Python 3 that has torch, or unset PYTHON"
    exit 2
fi
options_python="${PYTHON:-python3}"
if command -v "$options_python" >/dev/null 2>&1; then
    (cd "$ROOT" && "$options_python" -c 'import sys
from scripts.gpu_check import check_options
sys.exit(check_options(sys.argv[1:]))' "$@") || exit $?
    for arg in "$@"; do [[ $arg == -h || $arg == --help ]] && exit 0; done
fi

if [[ -z "${PYTHON:-}" ]]; then
    if (( ! offline )) && ! index_answers; then
        say "no package index answered within $index_wait_s s: running --offline (installing nothing)"
        offline=1
        set -- "$@" --offline
    fi
    if (( offline )); then
        found="$(python_with_torch)" || {
            say "--offline: no Python with torch found (tried $torch_candidates); set PYTHON=/path/to/python3"
            exit 2
        }
        PYTHON="$(sed -n 1p <<<"$found")"
        say "--offline: using $PYTHON (torch $(sed -n 2p <<<"$found")); installing nothing"
    else
        code=0
        bash "$ROOT/scripts/setup.sh" requirements-test.txt >&2 || code=$?
        [ "$code" = 2 ] && exit 2  # setup.sh said why in one line (a broken driver, no build that fits, no room)
        [ "$code" = 0 ] || { say "set-up failed; see above (no internet? --offline)"; exit 1; }
        PYTHON="$ROOT/.venv/bin/python"
    fi
fi
exec "$PYTHON" "$ROOT/scripts/gpu_check.py" "$@"
