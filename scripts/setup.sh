#!/usr/bin/env bash
# Create .venv and install the pinned requirements plus the torch and DALI builds that match
# this machine's NVIDIA driver. A no-op once done, so every entry point can call it first.
#
#   scripts/setup.sh [requirements file]
#
# The build follows the driver and the GPUs' lowest and highest compute capability
# (handler/runtime/cuda_build.py; docs/GPU_CHECK.md "Builds"): PyPI's torch (CUDA 13) +
# nvidia-dali-cuda130 where it fits, else torch from PyTorch's cu126 index (V100, P100; every
# CUDA 12 driver) or cu128 one (Blackwell on a CUDA 12.8/12.9 driver) + nvidia-dali-cuda120. No
# GPU: PyPI's torch + nvidia-dali-cuda120. Where no build fits, one line and exit 2; so too where
# nvidia-smi cannot reach an installed driver (CUDA_VISIBLE_DEVICES= sets up the no-GPU choice anyway),
# and where the disk lacks room for the install.
# TORCH_INDEX_URL overrides the torch index. SETUP_DRY_RUN=1 prints what it would do.
set -euo pipefail
cd "$(dirname "$0")/.."
req="${1:-requirements.txt}"
python="${PYTHON_BOOTSTRAP:-python3}"
dry="${SETUP_DRY_RUN:-0}"
run() { if [ "$dry" = 1 ]; then echo "setup: would run: $*"; else "$@"; fi; }

# Standard library only, so it runs before .venv exists;
# sets TORCH_INDEX_URL, TORCH_PINS, DALI_PACKAGE and REASON.
chosen=0
build="$("$python" handler/runtime/cuda_build.py)" || chosen=$?
[ "$chosen" = 2 ] && exit 2  # no build fits, or a broken driver: cuda_build.py said why in one line
[ "$chosen" = 0 ] \
    || { echo "setup: $python could not run handler/runtime/cuda_build.py; set PYTHON_BOOTSTRAP to a Python 3.9+" >&2; exit 1; }
eval "$build"
# What .venv holds (written after each install); a .venv made before setup.sh chose builds
# holds PyPI's torch and the CUDA 12 DALI.
installed_index="" installed_dali="nvidia-dali-cuda120==${DALI_PACKAGE##*==}"
if [ -f .venv/.build ]; then
    installed_index="$(sed -n 1p .venv/.build)" installed_dali="$(sed -n 2p .venv/.build)"
fi
if [ "${SETUP_KEEP_BUILD:-0}" = 1 ] && [ -x .venv/bin/python ]; then
    # launch.sh: an existing .venv keeps its builds, never a surprise download; a driver they
    # do not fit stops in one line (handler/runtime/devices.py) naming this script as the fix.
    TORCH_INDEX_URL="$installed_index" DALI_PACKAGE="$installed_dali" REASON="the builds .venv holds"
fi
choice="torch from ${TORCH_INDEX_URL:-PyPI}, $DALI_PACKAGE"

# The stamp names the requirements it installed and records the build choice, so a changed
# driver (or TORCH_INDEX_URL) installs once more. requirements-test.txt includes
# requirements.txt, so its stamp covers the runtime too: launch.sh after scripts/test.sh
# installs nothing and prints nothing.
hash="$(cat requirements.txt requirements-test.txt | sha1sum | cut -c1-12)"  # not the old-torch file: its own venv
stamp=".venv/.installed-$hash-$(basename "$req")"
covered=".venv/.installed-$hash-requirements-test.txt"
[ "$dry" = 1 ] && echo "setup: stamp $stamp records: $choice"
for done_file in "$stamp" "$covered"; do
    [ -f "$done_file" ] && [ "$(cat "$done_file")" = "$choice" ] && exit 0
done
for done_file in "$stamp" "$covered"; do
    if [ -f "$done_file" ]; then
        echo "setup: .venv holds $(cat "$done_file"); this machine needs $choice"
        break
    fi
done

echo "setup: build choice: $choice ($REASON)"
# Room first (scripts/free_space.sh): a torch build took 7 GiB in .venv and 3 GiB of pip's
# downloads at its peak; requirements beside an installed torch, far less.
if [ "$dry" != 1 ]; then
    . scripts/free_space.sh
    venv_gib=7 tmp_gib=3
    if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' >/dev/null 2>&1 \
       && [ "$installed_index" = "$TORCH_INDEX_URL" ]; then
        venv_gib=1 tmp_gib=1
    fi
    room_for setup .venv "$venv_gib" "$tmp_gib" || exit 2
fi
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $("$python" --version)"
    run "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q)
echo "setup: installing $req into .venv (torch is a large CUDA build; first time only)"
run "${pip[@]}" --upgrade pip
# pip keeps an installed torch==X whatever its CUDA build, so a changed index reinstalls it.
if [ -n "$TORCH_INDEX_URL" ] || [ "$installed_index" != "$TORCH_INDEX_URL" ]; then
    force=()
    [ "$installed_index" != "$TORCH_INDEX_URL" ] && force=(--force-reinstall)
    # shellcheck disable=SC2086  # TORCH_PINS is two words on purpose
    run "${pip[@]}" "${force[@]}" $TORCH_PINS ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
fi
run "${pip[@]}" -r "$req"
# Both DALI builds install the same `nvidia.dali` package: keep only the chosen one.
for other in nvidia-dali-cuda120 nvidia-dali-cuda130; do
    if [ "$other" != "${DALI_PACKAGE%%==*}" ] && [ -d .venv ] \
        && .venv/bin/python -m pip show -q "$other" >/dev/null 2>&1; then
        run .venv/bin/python -m pip uninstall -q -y "$other"
    fi
done
run "${pip[@]}" "$DALI_PACKAGE"
if [ "$dry" != 1 ]; then
    printf '%s\n%s\n' "$TORCH_INDEX_URL" "$DALI_PACKAGE" > .venv/.build
    echo "$choice" > "$stamp"
fi
