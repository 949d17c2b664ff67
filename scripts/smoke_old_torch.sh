#!/usr/bin/env bash
# Every mode trains on the oldest supported torch (requirements-oldtorch.txt), on the CPU:
# one tiny epoch each, the optional techniques together, then a resume of each checkpoint
# format. CI runs it after the suite.
# Builds .venv-oldtorch on first use. Usage: scripts/smoke_old_torch.sh
#   SMOKE_MODES ("dp ddp ddp_dali fsdp pp")   PYTHON_BOOTSTRAP (python3)
set -uo pipefail
cd "$(dirname "$0")/.."
say() { echo "smoke: $*"; }

venv=.venv-oldtorch
req=requirements-oldtorch.txt
if [ ! -x "$venv/bin/python" ]; then
    say "creating $venv with $("${PYTHON_BOOTSTRAP:-python3}" --version)"
    "${PYTHON_BOOTSTRAP:-python3}" -m venv "$venv" || exit 1
fi
stamp="$venv/.installed-$(sha1sum "$req" | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    say "installing $req into $venv (a second torch; first time only)"
    "$venv/bin/python" -m pip install -q -r "$req" || { say "FAIL: could not install $req"; exit 1; }
    touch "$stamp"
fi
torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')" || exit 1
modes="${SMOKE_MODES:-dp ddp ddp_dali fsdp pp}"
say "torch $torch_version, CPU (GPUs hidden), modes: $modes"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# 128 training images, global batch 32: 4 steps per epoch on 2 processes (1 for dp).
TINY=(--data "$work/data" --dataset synthetic --synthetic-train 128 --synthetic-test 32 --valid-size 0
      --batch-size 32 --model resnet20 --workers 0 --no-progress)

failed=()
# check NAME ARGS...: one run; PASS when it exits 0 and its metrics hold the epochs asked for
# and every test image; otherwise FAIL with the last lines it printed.
check() {
    local name="$1" epochs="$2" ckpt="$3"
    shift 3
    local started=$SECONDS
    if CUDA_VISIBLE_DEVICES= "$venv/bin/python" train_cifar.py "${TINY[@]}" --ckpt "$ckpt" "$@" \
           >"$work/log" 2>&1 \
       && "$venv/bin/python" - "$ckpt/metrics.json" "$epochs" >>"$work/log" 2>&1 <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
assert len(m["epochs"]) == int(sys.argv[2]), f"{len(m['epochs'])} epochs in the metrics"
assert m["test"]["samples"] == 32, f"test counted {m['test']['samples']} images, not 32"
EOF
    then
        say "PASS $name ($((SECONDS - started)) s)"
    else
        say "FAIL $name on torch $torch_version ($((SECONDS - started)) s); its last lines:"
        tail -n 20 "$work/log" | sed 's/^/    /'
        failed+=("$name")
    fi
}

has() { [[ " $modes " == *" $1 "* ]]; }
for mode in $modes; do
    check "$mode" 1 "$work/$mode" --mode "$mode" --epochs 1
done
# The optional techniques together, bf16 included (4 steps: cheap even where bf16 is emulated).
# fsdp and pp with --channels-last failed on this torch: non-contiguous parameters, and stage
# 0's input strides checked against an NCHW example.
has dp && check "dp + toolbox flags" 1 "$work/flags-dp" --mode dp --epochs 1 \
    --amp bf16 --channels-last --accum-steps 2 --activation-checkpointing --dp-balanced
has fsdp && check "fsdp + toolbox flags" 1 "$work/flags-fsdp" --mode fsdp --epochs 1 \
    --amp bf16 --channels-last --accum-steps 2 --activation-checkpointing
has pp && check "pp + toolbox flags" 1 "$work/flags-pp" --mode pp --epochs 1 \
    --amp bf16 --channels-last --activation-checkpointing
# Checkpoints written by this torch load back in it: the plain one (ddp), the sharded one
# (fsdp), and pp's stages gathered into the plain one.
for mode in ddp fsdp pp; do
    has "$mode" || continue
    check "$mode --resume" 2 "$work/$mode" --mode "$mode" --epochs 2 --resume
done

if [ ${#failed[@]} -gt 0 ]; then
    say "FAILED on torch $torch_version: ${failed[*]}"
    exit 1
fi
say "all modes pass on torch $torch_version"
