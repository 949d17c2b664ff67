#!/usr/bin/env bash
# The course kit's run flow for --mode ddp_dali: one profiled run on 1 GPU, then one on 2, each through
# scripts/launch.sh with the kit's settings. Reports: nsight_logs/ddp_dali_<time>/gpu_<N>.nsys-rep;
# checkpoints: runs/ddp_dali_<time>/gpu_<N>. docs/LAB.md walks through it.
#
#   bash scripts/run_ddp_dali.sh          DATASET_DIR (dataset): the kit's data folder (scripts/init.sh's)
set -euo pipefail

TIMESTAMP="${TIMESTAMP:-$(date +%Y%m%d_%H%M%S)}"
export MODE=ddp_dali
export DATA_DIR="${DATASET_DIR:-dataset}/cifar10_images"
export NSIGHT_LOG_DIR="nsight_logs/ddp_dali_$TIMESTAMP"
mkdir -p "$NSIGHT_LOG_DIR"

for gpus in 1 2; do
    export NUM_GPUS=$gpus
    export LOCAL_GPU_IDS="$(seq -s, 0 $((gpus - 1)))"
    export CKPT_DIR="runs/ddp_dali_$TIMESTAMP/gpu_$gpus"
    export NSIGHT_FILE_NAME="gpu_$gpus"
    mkdir -p "$CKPT_DIR"
    bash scripts/launch.sh
done
