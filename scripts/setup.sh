#!/usr/bin/env bash
# Create .venv and install the pinned requirements. A no-op once done, so every entry
# point can call it first. Usage: scripts/setup.sh [requirements file]
set -euo pipefail
cd "$(dirname "$0")/.."
req="${1:-requirements.txt}"
python="${PYTHON_BOOTSTRAP:-python3}"

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($python --version)"
    "$python" -m venv .venv
fi
hash="$(cat requirements*.txt | sha1sum | cut -c1-12)"
stamp=".venv/.installed-$hash-$(basename "$req")"
# requirements-test.txt includes requirements.txt, so its stamp covers the runtime too:
# launch.sh after scripts/test.sh installs nothing and prints nothing.
covered=".venv/.installed-$hash-requirements-test.txt"
if [ ! -f "$stamp" ] && [ ! -f "$covered" ]; then
    echo "setup: installing $req into .venv (torch is a large CUDA build; first time only)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r "$req"
    touch "$stamp"
fi
