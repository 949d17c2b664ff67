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

# Whether pip's index (PIP_INDEX_URL, else PyPI's; GPU_CHECK_INDEX_URL overrides) answers in time.
index_answers() {
    local url="${GPU_CHECK_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple/}}" wait="${GPU_CHECK_INDEX_WAIT_S:-5}"
    command -v python3 >/dev/null 2>&1 || return 1
    timeout "$((wait + 1))" python3 -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).close()' "$url" "$wait" >/dev/null 2>&1
}

# The first Python that imports torch (an active virtual environment, .venv, python3, python)
# and its torch version, on two lines.
python_with_torch() {
    local candidate version
    for candidate in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} "$ROOT/.venv/bin/python" python3 python; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if version="$("$candidate" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
            command -v "$candidate"
            echo "$version"
            return 0
        fi
    done
    return 1
}

if [[ -z "${PYTHON:-}" ]]; then
    if (( ! offline )) && ! index_answers; then
        say "no package index answered within ${GPU_CHECK_INDEX_WAIT_S:-5} s: running --offline (installing nothing)"
        offline=1
        set -- "$@" --offline
    fi
    if (( offline )); then
        found="$(python_with_torch)" || {
            say "--offline: no Python with torch found (tried ${VIRTUAL_ENV:+\$VIRTUAL_ENV/bin/python, }.venv/bin/python, python3, python); set PYTHON=/path/to/python3"
            exit 2
        }
        PYTHON="$(sed -n 1p <<<"$found")"
        say "--offline: using $PYTHON (torch $(sed -n 2p <<<"$found")); installing nothing"
    else
        bash "$ROOT/scripts/setup.sh" requirements-test.txt >&2 || { say "set-up failed; see above (no internet? --offline)"; exit 1; }
        PYTHON="$ROOT/.venv/bin/python"
    fi
fi
exec "$PYTHON" "$ROOT/scripts/gpu_check.py" "$@"
