#!/usr/bin/env bash
# The course kit's run flow for one mode, shared by scripts/run_{dp,ddp,ddp_dali}.sh: one run on
# 1 GPU, then one on 2, each through scripts/launch.sh with the kit's settings. docs/LAB.md.
#
#   bash scripts/lab_runs.sh MODE       DATASET_DIR (dataset): the kit's data folder (its scripts/init.sh's)
#
# Reports: nsight_logs/<mode>_<time>/gpu_<N>.nsys-rep; checkpoints: runs/<mode>_<time>/gpu_<N>.
# dp and ddp read DATASET_DIR/cifar10 (torchvision's folder), ddp_dali DATASET_DIR/cifar10_images.
set -euo pipefail

MODE="${1:?usage: bash scripts/lab_runs.sh dp|ddp|ddp_dali}"
case "$MODE" in
    dp|ddp) data=cifar10 ;;
    ddp_dali) data=cifar10_images ;;
    *) echo "lab_runs: MODE '$MODE' is not one of the kit's: dp, ddp, ddp_dali" >&2; exit 2 ;;
esac
TIMESTAMP="${TIMESTAMP:-$(date +%Y%m%d_%H%M%S)}"
export MODE DATA_DIR="${DATASET_DIR:-dataset}/$data"
export NSIGHT_LOG_DIR="nsight_logs/${MODE}_$TIMESTAMP"
mkdir -p "$NSIGHT_LOG_DIR"

for gpus in 1 2; do
    export NUM_GPUS=$gpus
    export LOCAL_GPU_IDS="$(seq -s, 0 $((gpus - 1)))"
    export CKPT_DIR="runs/${MODE}_$TIMESTAMP/gpu_$gpus"
    export NSIGHT_FILE_NAME="gpu_$gpus"
    mkdir -p "$CKPT_DIR"
    bash "$(dirname "${BASH_SOURCE[0]}")/launch.sh"
done
