#!/usr/bin/env bash
# The lab's entry point: one training run of train_cifar.py, profiled by Nsight Systems.
# Contract and how to read the result: docs/PROFILING.md.
#
#   MODE=ddp NUM_GPUS=2 scripts/launch.sh [train_cifar.py arguments...]
#
# MODE (ddp_dali) handler/modes.py's       NUM_GPUS (visible GPUs, else 2 CPU processes)
# LOCAL_GPU_IDS (-> CUDA_VISIBLE_DEVICES; under a set one, places in it)  CKPT_DIR (ckpt/<run name>/<start time>)
# DATA_DIR (./data): torchvision's CIFAR-10 folder or the course kit's PNG tree (docs/LAB.md); without a
#   GPU the run trains on it when set, else on a synthetic set in ./data
# NSIGHT_LOG_DIR (nsight_logs)              NSIGHT_FILE_NAME (<mode>_gpu<N> or <mode>_cpu<N>)
# PROFILE auto|1|0 (auto)                   PYTHON (.venv/bin/python, made by scripts/setup.sh; without
#   a package index, the first Python with torch: scripts/find_python.sh)
# GPU_METRICS 0|1 (0): nsys GPU metrics sampling  NSYS_INSTALLER (scripts/install_nsys.sh)
# NSYS_EXIT_TIMEOUT (120): seconds without progress after training finished before nsys is ended
# PROFILE_EPOCHS (epochs 1:2 of runs longer than 3 epochs, else all): the epochs nsys captures,
#   A:B (0-based, inclusive) or all; train_cifar.py --profile-epochs, docs/PROFILING.md
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "launch: $*" >&2; }
die() { say "$*"; exit 2; }

[[ ! -v MODE || -n $MODE ]] || die "MODE is set but empty; name a mode (e.g. MODE=ddp), or unset it for ddp_dali"
MODE="${MODE:-ddp_dali}"
# The modes are handler/modes.py's, so a sixth mode there is one here too (README, "Adding a
# sixth mode"). That module imports nothing heavy: any Python 3 reads it, before set-up.
modes_python="${PYTHON:-$ROOT/.venv/bin/python}"
[[ -x "$modes_python" ]] || modes_python=python3
modes="$(cd "$ROOT" && "$modes_python" -c 'from handler.modes import MODES; print(*MODES)' 2>/dev/null)" \
    || die "could not read the modes from handler/modes.py with $modes_python; install Python 3 or set PYTHON"
if [[ " $modes " != *" $MODE "* ]]; then
    names="${modes// /, }"
    die "MODE='$MODE' is not a mode; use one of: $names (MODE=ddp_dali by default)"
fi

# Checked before set-up and the GPU count, so a typo costs no torch start-up.
[[ -z "${NUM_GPUS:-}" || "$NUM_GPUS" =~ ^[1-9][0-9]*$ ]] \
    || die "NUM_GPUS='$NUM_GPUS' is not a positive integer; set e.g. NUM_GPUS=2"

# LOCAL_GPU_IDS picks among the GPUs the caller left visible, never beyond them: under a set
# CUDA_VISIBLE_DEVICES its entries are places in that list (docs/PROFILING.md, "Settings").
# Each GPU once (CUDA sees none where one is named twice), and no more of them than NUM_GPUS uses.
if [[ -n "${LOCAL_GPU_IDS:-}" ]]; then
    IFS=, read -ra ids <<<"${LOCAL_GPU_IDS// /}"
    seen=" "
    for id in "${ids[@]}"; do
        key="$id"
        [[ $id =~ ^[0-9]+$ ]] && key="$(( 10#$id ))"
        [[ $seen != *" $key "* ]] || die "LOCAL_GPU_IDS=$LOCAL_GPU_IDS names GPU $id twice, and CUDA then sees no GPU;" \
            "list each GPU once (e.g. LOCAL_GPU_IDS=0,1)"
        seen+="$key "
    done
    [[ -z "${NUM_GPUS:-}" ]] || (( ${#ids[@]} <= NUM_GPUS )) || die "LOCAL_GPU_IDS=$LOCAL_GPU_IDS names ${#ids[@]} GPUs" \
        "but NUM_GPUS=$NUM_GPUS; name $NUM_GPUS of them, or leave NUM_GPUS out to use all ${#ids[@]}"
fi
if [[ -n "${LOCAL_GPU_IDS:-}" && -v CUDA_VISIBLE_DEVICES ]]; then
    given=() picked=()
    [[ "${CUDA_VISIBLE_DEVICES// /}" == -1 ]] || IFS=, read -ra given <<<"${CUDA_VISIBLE_DEVICES// /}"
    (( ${#given[@]} )) || die "LOCAL_GPU_IDS=$LOCAL_GPU_IDS names a GPU but CUDA_VISIBLE_DEVICES='$CUDA_VISIBLE_DEVICES'" \
        "hides every GPU; unset LOCAL_GPU_IDS to run on the CPU, or unset CUDA_VISIBLE_DEVICES"
    IFS=, read -ra ids <<<"${LOCAL_GPU_IDS// /}"
    for id in "${ids[@]}"; do
        [[ $id =~ ^[0-9]+$ ]] && (( 10#$id < ${#given[@]} )) || die "LOCAL_GPU_IDS=$LOCAL_GPU_IDS: '$id' is not a place" \
            "in CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES; under it LOCAL_GPU_IDS counts 0..$(( ${#given[@]} - 1 )) in that list"
        picked+=("${given[10#$id]}")
    done
    say "LOCAL_GPU_IDS=$LOCAL_GPU_IDS within CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES: GPUs $(IFS=,; echo "${picked[*]}")"
    export CUDA_VISIBLE_DEVICES="$(IFS=,; echo "${picked[*]}")"
elif [[ -n "${LOCAL_GPU_IDS:-}" ]]; then
    export CUDA_VISIBLE_DEVICES="$LOCAL_GPU_IDS"
fi

PROFILE="${PROFILE:-auto}"
case "$PROFILE" in auto|1|0) ;; *) die "PROFILE='$PROFILE' is not auto, 1 or 0" ;; esac
NSYS_EXIT_TIMEOUT="${NSYS_EXIT_TIMEOUT:-120}"
[[ "$NSYS_EXIT_TIMEOUT" =~ ^[1-9][0-9]*$ ]] \
    || die "NSYS_EXIT_TIMEOUT='$NSYS_EXIT_TIMEOUT' is not a positive number of seconds; e.g. NSYS_EXIT_TIMEOUT=300"
[[ -z "${PROFILE_EPOCHS:-}" || "$PROFILE_EPOCHS" =~ ^(all|[0-9]+(:[0-9]+)?)$ ]] \
    || die "PROFILE_EPOCHS='$PROFILE_EPOCHS' is not A:B or all; e.g. PROFILE_EPOCHS=1:2 (0-based epochs, inclusive)"
# The longest file made from it, NAME.partial.sqlite (the report's export), must fit a file name's 255 bytes.
file_name="${NSIGHT_FILE_NAME:-}" name_bytes="$(LC_ALL=C; echo "${#file_name}")"
[[ -z "${NSIGHT_FILE_NAME:-}" ]] || (( name_bytes <= 240 )) || die "NSIGHT_FILE_NAME is $name_bytes bytes long;" \
    "its files (NAME.summary.json, NAME.partial.sqlite) would pass the file system's 255: name it in 240 or fewer"
case "${GPU_METRICS:-0}" in 0|1) ;; *) die "GPU_METRICS='$GPU_METRICS' is not 0 or 1; use GPU_METRICS=1 to sample GPU metrics (GPU runs)" ;; esac
# The folders, before any set-up: one line naming the setting, never mkdir's message.
folder_problem() {  # $1 the setting's name, $2 its folder
    local up="$2"
    while [[ ! -e $up && $up != / && $up != . ]]; do up="$(dirname -- "$up")"; done
    [[ $up == "$2" ]] && [[ ! -d $up ]] && { echo "$1=$2 is a file; name a folder (it is made if missing)"; return; }
    [[ -d $up ]] || { echo "$1=$2 is under $up, which is a file; name a folder"; return; }
    [[ -w $up && -x $up ]] || echo "$1=$2: cannot write in $up; name a folder you can write in"
}
[[ -z "${DATA_DIR:-}" || ! -e "$DATA_DIR" || -d "$DATA_DIR" ]] \
    || die "DATA_DIR=$DATA_DIR is a file; name the CIFAR-10 folder (torchvision's, or the course kit's PNG tree: docs/LAB.md)"
for setting in DATA_DIR CKPT_DIR NSIGHT_LOG_DIR; do
    [[ -n "${!setting:-}" ]] || continue
    problem="$(folder_problem "$setting" "${!setting}")"
    [[ -z $problem ]] || die "$problem"
done

if [[ -z "${PYTHON:-}" ]]; then
    source "$ROOT/scripts/find_python.sh"
    choose_run_python launch || exit 2
fi
command -v "$PYTHON" >/dev/null 2>&1 \
    || die "PYTHON=$PYTHON is not a program that runs; name a Python 3 that has torch, or unset PYTHON (scripts/setup.sh)"
# torch counts the GPUs (honouring CUDA_VISIBLE_DEVICES), and stops in one line when the
# machine has GPUs this torch build cannot use: never CPU training with GPU defaults. First,
# one line per module the trainer (in this MODE) needs and this Python lacks.
visible_gpus="$(cd "$ROOT" && "$PYTHON" -m handler.runtime.devices "$MODE")" || exit 2
if [[ "$visible_gpus" -gt 0 ]]; then
    device=gpu default_count="$visible_gpus"
else
    device=cpu default_count=2
fi
NUM_GPUS="${NUM_GPUS:-$default_count}"

if [[ $PROFILE == auto ]] && ! command -v nsys >/dev/null 2>&1 \
        && { [[ $(id -u) -eq 0 ]] || sudo -n true 2>/dev/null; }; then
    # A fresh machine profiles too: installing system packages needs root or password-less sudo.
    installer="${NSYS_INSTALLER:-$ROOT/scripts/install_nsys.sh}"
    say "nsys not found: installing it first with $installer"
    bash "$installer" >&2 || say "the nsys install failed (its output is above)"
    hash -r
fi
profiled=0
case "$PROFILE" in
    0) ;;
    1) command -v nsys >/dev/null 2>&1 \
           || die "PROFILE=1 but nsys is not on PATH; install it with scripts/install_nsys.sh or run with PROFILE=0"
       profiled=1 ;;
    auto) if command -v nsys >/dev/null 2>&1; then
              profiled=1
          else
              say "WARNING: nsys not found, running UNPROFILED" \
                  "(scripts/install_nsys.sh installs it, as root or with sudo; PROFILE=0 silences this)"
              export HARNESS_PROFILE_NOTE="PROFILE=auto but no nsys could be found or installed: the run is unprofiled"
          fi ;;
esac


data_named="${DATA_DIR:+1}"  # the user's DATA_DIR: a CPU run trains on it too, never on a synthetic set
DATA_DIR="${DATA_DIR:-./data}"
NSIGHT_LOG_DIR="${NSIGHT_LOG_DIR:-nsight_logs}"
NSIGHT_FILE_NAME="${NSIGHT_FILE_NAME:-${MODE}_${device}${NUM_GPUS}}"
if [[ -z "${CKPT_DIR:-}" ]]; then
    # Each run gets its own folder, ckpt/<run name>/<start time>, so running the lab twice
    # never replaces an earlier run's checkpoints; --resume continues the newest one.
    runs="./ckpt/$NSIGHT_FILE_NAME"
    if [[ " $* " == *" --resume "* || "${*: -1}" == "--resume" ]]; then
        CKPT_DIR="$(ls -d "$runs"/*/ 2>/dev/null | sort | tail -n 1)"
        [[ -n "$CKPT_DIR" ]] || die "--resume: no earlier $NSIGHT_FILE_NAME run under $runs; start without --resume or set CKPT_DIR"
        CKPT_DIR="${CKPT_DIR%/}"
    else
        CKPT_DIR="$runs/$(date +%Y%m%d-%H%M%S)"
        [[ -e "$CKPT_DIR" ]] && CKPT_DIR="$CKPT_DIR-$$"
    fi
    say "checkpoints: $CKPT_DIR"
fi

report="$NSIGHT_LOG_DIR/$NSIGHT_FILE_NAME.nsys-rep"
metrics="$NSIGHT_LOG_DIR/$NSIGHT_FILE_NAME.metrics.json"
mkdir -p -- "$NSIGHT_LOG_DIR" 2>/dev/null || die "NSIGHT_LOG_DIR=$NSIGHT_LOG_DIR cannot be made; name a folder you can write in"
# An earlier run's report, metrics and summary under this name move aside, never deleted; a
# failed run then never shows the previous run's results either (scripts/earlier_runs.sh).
source "$ROOT/scripts/earlier_runs.sh"
earlier="$(move_earlier_run "$NSIGHT_LOG_DIR" "$NSIGHT_FILE_NAME")" \
    || die "could not move the earlier $NSIGHT_FILE_NAME results aside in $NSIGHT_LOG_DIR; check that folder's permissions"
[[ -n "$earlier" ]] && say "the earlier $NSIGHT_FILE_NAME run's results: $earlier"

smoke=()
if [[ $device == cpu ]]; then
    smoke=(--model resnet20 --epochs 2)
    # The synthetic set holds out 1000; a DATA_DIR of the user's keeps the default hold-out,
    # which is a tenth of a small tree (docs/CLI.md --valid-size).
    [[ -n $data_named ]] || smoke+=(--dataset synthetic --valid-size 1000)
    say "no GPU visible: CPU smoke configuration (${smoke[*]}); arguments you pass override it"
fi
# The course kit's PNG tree (DATA_DIR/train/<class>/<n>.png) is read as it is by ddp_dali.
[[ $MODE == ddp_dali && -d "$DATA_DIR/train" ]] && smoke+=(--dali-source files)
window=()
[[ -n "${PROFILE_EPOCHS:-}" ]] && window=(--profile-epochs "$PROFILE_EPOCHS")
# The smoke defaults come first so that argparse lets the caller's arguments win. A path goes as
# --opt=PATH: a folder named -data is then a value, never read as a flag.
train=("$PYTHON" "$ROOT/train_cifar.py" --mode "$MODE" --num_gpu "$NUM_GPUS" --data="$DATA_DIR"
       --ckpt="$CKPT_DIR" --metrics="$metrics" "${smoke[@]}" "${window[@]}" "$@")

# The value of option $1 that train_cifar.py will see (the last one given), else $2.
option_of() {
    local name="$1" value="$2"
    shift 2
    while [[ $# -gt 0 ]]; do
        case "$1" in
            "$name") value="${2:-}"; shift ;;
            "$name"=*) value="${1#"$name"=}" ;;
        esac
        shift
    done
    echo "$value"
}

# nsys starts the program with umask 000; the program restores this one first thing, so its
# checkpoints, metrics and data are never world-writable (handler/runtime/umask.py).
export HARNESS_UMASK="$(umask)"

status=0 stuck="" unstarted=""
if [[ $profiled == 1 ]]; then
    source "$ROOT/scripts/nsys_options.sh"
    if [[ "${GPU_METRICS:-0}" == 1 ]]; then
        if [[ $device == gpu ]]; then
            mapfile -t metric_opts < <(gpu_metrics_options)
            NSYS_PROFILE_OPTS+=("${metric_opts[@]}")
            [[ ${#metric_opts[@]} -gt 0 ]] && say "GPU metrics: sampling with ${metric_opts[*]}" \
                || export HARNESS_PROFILE_NOTE="GPU_METRICS=1 but nsys could not sample GPU metrics"
        else
            say "GPU_METRICS=1 but no GPU is visible; continuing without GPU metrics"
            export HARNESS_PROFILE_NOTE="GPU_METRICS=1 but no GPU was visible: no GPU metrics"
        fi
    fi
    # The trainer records this as env.nsys in its metrics.
    export HARNESS_NSYS="$(nsys --version | sed 's/.*version //')"
    # Only the window's epochs are recorded (scripts/nsys_options.sh); train_cifar.py checks
    # the window against --epochs and names it on its first line.
    use_capture_window
    epochs="$(option_of --epochs 30 "${train[@]}")"
    spec="$(option_of --profile-epochs "" "${train[@]}")"
    if [[ $epochs =~ ^[0-9]+$ ]] && captured="$(capture_window "$epochs" "$spec")"; then
        [[ $captured == all* ]] && captured="the whole run ($captured)" || captured+="; the other epochs train unprofiled"
        say "nsys captures $captured${spec:+ (--profile-epochs $spec)}"
    fi
    # nsys stays in the foreground (Ctrl-C reaches it as before); a watchdog ends it by PID if
    # it is stuck after training finished (scripts/nsys_watch.sh).
    watch_dir="$(mktemp -d -t launch-nsys-XXXXXX 2>/dev/null)" \
        || die "cannot make a folder in TMPDIR=${TMPDIR:-/tmp} for the profiled run; point TMPDIR at a writable folder"
    trap 'rm -rf "$watch_dir"' EXIT
    export HARNESS_STARTED="$watch_dir/started"
    profile_once() {
        status=0
        bash "$ROOT/scripts/nsys_watch.sh" "$watch_dir/pid" "$metrics" "$watch_dir/cause" "$NSYS_EXIT_TIMEOUT" &
        watchdog=$!
        bash -c 'echo $$ >"$0"; exec "$@"' "$watch_dir/pid" \
            nsys profile "${NSYS_PROFILE_OPTS[@]}" --output="$NSIGHT_LOG_DIR/$NSIGHT_FILE_NAME" "${train[@]}" \
            || status=$?
        wait "$watchdog" || true
    }
    # nsys that never started the program (the program touches HARNESS_STARTED first thing,
    # handler/runtime/umask.py) failed its own session: nothing ran, so it is tried once more.
    # Not after a signal (Ctrl-C: nsys exits 130).
    never_started() { [[ ! -e "$watch_dir/started" && ! -s "$watch_dir/cause" && $status -lt 128 ]]; }
    profile_once
    if never_started; then
        say "nsys $HARNESS_NSYS exited $status before the training started (its message is above); trying once more"
        profile_once
    fi
    if never_started; then
        unstarted=1
        [[ $status == 0 ]] && status=1  # no program ran: never a success
    fi
    if [[ -s "$watch_dir/cause" ]]; then
        stuck="nsys $HARNESS_NSYS did not exit: $(cat "$watch_dir/cause") (NSYS_EXIT_TIMEOUT=$NSYS_EXIT_TIMEOUT;"
        stuck+=" a known exit hang of nsys 2022.4, a newer nsys avoids it); the metrics are complete"
        status=124
    fi
else
    "${train[@]}" || status=$?
fi

[[ -f "$metrics" ]] && say "metrics: $metrics"
if [[ $profiled == 1 && -f "$report" ]]; then
    say "report:  $report"
    analysis=(--brief)
    [[ -f "$metrics" ]] && analysis+=(--metrics="$metrics")
    # A failed analysis is reported but never changes the run's exit status.
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m handler.profiling.report "${analysis[@]}" -- "$report" \
        && say "summary: $NSIGHT_LOG_DIR/$NSIGHT_FILE_NAME.summary.md" || true
fi
# Last, so that it is the line a user sees: nsys never started the program, tried twice.
if [[ -n $unstarted ]]; then
    say "nsys $HARNESS_NSYS exited $status before the training started, twice (no report, no metrics; its message" \
        "is above: nsys 2022.4 at times fails its own session: 'Local Endpoint is not available', 'End of" \
        "file'): run again, or PROFILE=0 to train unprofiled"
fi
if [[ -n $stuck ]]; then
    [[ -f "$report" ]] && stuck+=", the report is kept" || stuck+=", no report was written"
    say "$stuck"
fi
exit "$status"
