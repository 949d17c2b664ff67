#!/usr/bin/env bash
# The course kit's run flow for one mode, shared by scripts/run_{dp,ddp,ddp_dali}.sh: one run on
# 1 GPU, then one on 2, each through scripts/launch.sh with the kit's settings. docs/LAB.md.
#
#   bash scripts/lab_runs.sh MODE [train_cifar.py arguments]   DATASET_DIR (dataset): the kit's data folder
#
# A count above the visible GPUs is skipped, in one line (a 1-GPU box runs the 1-GPU run only);
# without a GPU both run as CPU processes. The runs use the first 1 and 2 of the GPUs the caller's
# CUDA_VISIBLE_DEVICES leaves visible (all, when unset); CUDA_VISIBLE_DEVICES= keeps the CPU.
# PYTHON (.venv via scripts/setup.sh; without a package index the first Python with torch,
# installing nothing: scripts/find_python.sh).
# Reports: nsight_logs/<mode>_<time>/gpu_<N>.nsys-rep; checkpoints: runs/<mode>_<time>/gpu_<N>.
# dp and ddp read DATASET_DIR/cifar10 (torchvision's folder), ddp_dali DATASET_DIR/cifar10_images.
set -euo pipefail

[[ $# -gt 0 ]] || {
    echo "lab_runs: no mode; usage: bash scripts/lab_runs.sh dp|ddp|ddp_dali [train_cifar.py arguments]" >&2
    exit 2
}
MODE="$1"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "$MODE" in
    dp|ddp) data=cifar10 ;;
    ddp_dali) data=cifar10_images ;;
    *) echo "lab_runs: MODE '$MODE' is not one of the kit's: dp, ddp, ddp_dali" >&2; exit 2 ;;
esac
TIMESTAMP="${TIMESTAMP:-$(date +%Y%m%d_%H%M%S)}"
export MODE DATA_DIR="${DATASET_DIR:-dataset}/$data"
export NSIGHT_LOG_DIR="nsight_logs/${MODE}_$TIMESTAMP"
# The folders, before any set-up: each one line (launch.sh checks its own settings again).
for top in nsight_logs runs "${DATASET_DIR:-dataset}" "$DATA_DIR"; do
    [[ ! -e $top || -d $top ]] || {
        echo "lab_runs: $top is a file, where this run needs a folder (in $PWD); move it, or run from another folder" >&2
        exit 2
    }
done
if [[ -z "${PYTHON:-}" ]]; then
    source "$ROOT/scripts/find_python.sh"
    choose_run_python lab_runs || exit 2
    export PYTHON  # chosen once, for both runs
fi
command -v "$PYTHON" >/dev/null 2>&1 || {
    echo "lab_runs: PYTHON=$PYTHON is not a program that runs; name a Python 3 that has torch, or unset PYTHON" >&2
    exit 2
}
# torch counts them, honouring the caller's CUDA_VISIBLE_DEVICES (handler/runtime/devices.py);
# first, one line per module the trainer (in this MODE) needs and this Python lacks.
visible="$(cd "$ROOT" && "$PYTHON" -m handler.runtime.devices "$MODE")" || exit 2
cannot_make() {
    echo "lab_runs: cannot make the folder $1 in $PWD (a file in its way, or no write permission); move that" \
         "file, or run from a folder you can write in" >&2
    exit 2
}
mkdir -p "$NSIGHT_LOG_DIR" 2>/dev/null || cannot_make "$NSIGHT_LOG_DIR"

for gpus in 1 2; do
    if (( visible > 0 && gpus > visible )); then
        echo "lab_runs: skipping the $gpus-GPU run of $MODE: $visible GPU(s) visible" >&2
        continue
    fi
    export NUM_GPUS=$gpus
    # The first N of the GPUs the caller left visible (launch.sh reads these as places in the
    # caller's CUDA_VISIBLE_DEVICES); on the CPU none, so CUDA_VISIBLE_DEVICES= keeps the CPU.
    if (( visible > 0 )); then
        export LOCAL_GPU_IDS="$(seq -s, 0 $((gpus - 1)))"
    else
        unset LOCAL_GPU_IDS
    fi
    export CKPT_DIR="runs/${MODE}_$TIMESTAMP/gpu_$gpus"
    export NSIGHT_FILE_NAME="gpu_$gpus"
    mkdir -p "$CKPT_DIR" 2>/dev/null || cannot_make "$CKPT_DIR"
    bash "$ROOT/scripts/launch.sh" "$@"
done
