#!/usr/bin/env bash
# Every mode trains on a second torch, on the CPU: one tiny epoch each, the optional
# techniques together, then a resume of each checkpoint format. CI runs it after the suite,
# once for each torch below (docs/GPU_CHECK.md "Supported versions" has their time).
#   SMOKE_TORCH=2.6 (default)  the oldest supported torch: requirements-oldtorch.txt in .venv-oldtorch
#   SMOKE_TORCH=2.11           the torch GPU machines often come with, on their Python 3.12:
#                              requirements-torch211.txt in .venv-torch211; the Flight Recorder
#                              must dump a gloo group's record
# Builds the venv on first use. Usage: [SMOKE_TORCH=2.11] scripts/smoke_old_torch.sh
#   SMOKE_MODES ("dp ddp ddp_dali fsdp pp")   PYTHON_BOOTSTRAP (2.6: python3; 2.11: python3.12,
#   else pyenv's 3.12). A venv without DALI checks that ddp_dali refuses in one line instead.
set -uo pipefail
cd "$(dirname "$0")/.."
say() { echo "smoke: $*"; }
# The first Python 3.12 that runs: on PATH, else pyenv's (a pyenv shim fails where 3.12 is not selected).
python312() {
    local candidate
    for candidate in python3.12 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12; do
        "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' >/dev/null 2>&1 \
            && { command -v "$candidate"; return 0; }
    done
    return 1
}
case "${SMOKE_TORCH:-2.6}" in
    2.6) venv=.venv-oldtorch req=requirements-oldtorch.txt python_version="" bootstrap=python3 flag_modes="dp fsdp pp" ;;
    2.11) venv=.venv-torch211 req=requirements-torch211.txt python_version=3.12 flag_modes="fsdp pp"
          bootstrap="$(python312)" ;;
    *) say "SMOKE_TORCH=${SMOKE_TORCH}: use 2.6 or 2.11"; exit 2 ;;
esac
bootstrap="${PYTHON_BOOTSTRAP:-$bootstrap}"
default_modes="dp ddp ddp_dali fsdp pp"

# A venv of another Python (2.11's was 3.11 before it was 3.12's) is made again.
if [ -x "$venv/bin/python" ] && [ -n "$python_version" ] \
   && ! "$venv/bin/python" -c "import sys; sys.exit(f'{sys.version_info[0]}.{sys.version_info[1]}' != '$python_version')"; then
    say "$venv is not Python $python_version: making it again"
    rm -rf "$venv"
fi
stamp="$venv/.installed-$(sha1sum "$req" | cut -c1-12)"
if [ ! -f "$stamp" ]; then
    . scripts/free_space.sh  # a second torch: as much room as setup.sh's first
    room_for smoke "$venv" 7 3 || exit 1
fi
if [ ! -x "$venv/bin/python" ]; then
    [ -n "$bootstrap" ] && command -v "$bootstrap" >/dev/null 2>&1 \
        || { say "no Python ${python_version:-3} to make $venv with: install python$python_version or set PYTHON_BOOTSTRAP"; exit 1; }
    say "creating $venv with $("$bootstrap" --version)"
    "$bootstrap" -m venv "$venv" || exit 1
fi
if [ ! -f "$stamp" ]; then
    say "installing $req into $venv (a second torch; first time only)"
    "$venv/bin/python" -m pip install -q -r "$req" || { say "FAIL: could not install $req"; exit 1; }
    touch "$stamp"
fi
smoke_started=$SECONDS  # the runs' time, without the install
torch_version="$("$venv/bin/python" -c 'import torch; print(torch.__version__)')" || exit 1
dali=1
"$venv/bin/python" -c 'import nvidia.dali' >/dev/null 2>&1 || dali=0
modes="${SMOKE_MODES:-$default_modes}"
if (( ! dali )) && [[ " $modes " == *" ddp_dali "* ]]; then
    modes="$(echo ${modes/ddp_dali/})"  # unquoted: one space between the rest
    say "no DALI in $venv: ddp_dali is checked to refuse in one line instead of training"
fi
say "torch $torch_version on Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'), CPU (GPUs hidden), modes: $modes"

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
# 2.11 leaves dp's out: dp takes no version shim, and the two smokes share CI's 5 minutes.
flags() { has "$1" && [[ " $flag_modes " == *" $1 "* ]]; }
flags dp && check "dp + toolbox flags" 1 "$work/flags-dp" --mode dp --epochs 1 \
    --amp bf16 --channels-last --accum-steps 2 --activation-checkpointing --dp-balanced
flags fsdp && check "fsdp + toolbox flags" 1 "$work/flags-fsdp" --mode fsdp --epochs 1 \
    --amp bf16 --channels-last --accum-steps 2 --activation-checkpointing
flags pp && check "pp + toolbox flags" 1 "$work/flags-pp" --mode pp --epochs 1 \
    --amp bf16 --channels-last --activation-checkpointing
# Checkpoints written by this torch load back in it: the plain one (ddp), the sharded one
# (fsdp), and pp's stages gathered into the plain one.
for mode in ddp fsdp pp; do
    has "$mode" || continue
    check "$mode --resume" 2 "$work/$mode" --mode "$mode" --epochs 2 --resume
done

# Without DALI, --mode ddp_dali stops in one line naming the install, before any process starts.
if (( ! dali )) && [[ " ${SMOKE_MODES:-$default_modes} " == *" ddp_dali "* ]]; then
    started=$SECONDS
    CUDA_VISIBLE_DEVICES= "$venv/bin/python" train_cifar.py "${TINY[@]}" --ckpt "$work/dali" --mode ddp_dali \
        --epochs 1 >"$work/log" 2>&1
    code=$?
    if [ "$code" = 2 ] && grep -q "needs NVIDIA DALI: pip install" "$work/log" \
       && [ "$(grep -v '^note:' "$work/log" | grep -c .)" = 1 ]; then
        say "PASS ddp_dali refuses without DALI ($((SECONDS - started)) s)"
    else
        say "FAIL ddp_dali without DALI on torch $torch_version: exit $code, not one line naming the install:"
        tail -n 20 "$work/log" | sed 's/^/    /'
        failed+=("ddp_dali refusal")
    fi
fi
# The Flight Recorder's shims (its settings' names, the gloo dump) on this torch: a gloo group
# of one records an all-reduce, and dump() writes the record that torchfrtrace reads.
if [ "${SMOKE_TORCH:-2.6}" = 2.11 ]; then
    started=$SECONDS
    if CUDA_VISIBLE_DEVICES= "$venv/bin/python" - "$work/fr" >"$work/log" 2>&1 <<'EOF'
import os, pickle, sys
import torch, torch.distributed as dist
from handler.DDP import flight_recorder
flight_recorder.enable(sys.argv[1], use_cuda=False)
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
dist.all_reduce(torch.ones(4))
clause = flight_recorder.dump(0)
path = os.path.join(flight_recorder.folder_for(sys.argv[1]), flight_recorder.PREFIX + "0")
assert os.path.isfile(path), f"no dump at {path}: {clause}"
with open(path, "rb") as f:
    record = pickle.load(f)
assert any("all_reduce" in str(e.get("profiling_name", "")) for e in record["entries"]), record["entries"][:3]
dist.destroy_process_group()
EOF
    then
        say "PASS Flight Recorder dumps a gloo group's record ($((SECONDS - started)) s)"
    else
        say "FAIL Flight Recorder on torch $torch_version; its last lines:"
        tail -n 20 "$work/log" | sed 's/^/    /'
        failed+=("flight recorder")
    fi
fi

say "the runs took $((SECONDS - smoke_started)) s on torch $torch_version"
if [ ${#failed[@]} -gt 0 ]; then
    say "FAILED on torch $torch_version: ${failed[*]}"
    exit 1
fi
say "all modes pass on torch $torch_version"
