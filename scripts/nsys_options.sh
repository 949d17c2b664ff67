# Options for `nsys profile`, sourced by scripts/launch.sh and by the profiling tests, so
# the tests profile exactly what the lab runs (docs/PROFILING.md).
#
# CPU sampling and context-switch tracing are off:
# - The analysis reads only NVTX ranges and CUDA activity.
# - Sampling is most of a report's bulk and of the intermediate .qdstrm in $TMPDIR.
#   A tiny script once wrote 2 GB with the defaults.
# - Both features open perf events. After the application exited, nsys 2022.4's agent
#   sometimes busy-polled those events forever, so the report was never written.
#
# Measured on a 2-rank CPU run of tests/tools/test_launch.py's configuration:
#   defaults  2.7 MB report, 150 MB intermediate
#   these     1.0 MB report,  30 MB intermediate
# docs/PROFILING.md has the details.
#
# --wait=primary: nsys stops when the program exits, instead of also waiting for processes
# the program left behind (the default, all). One leftover would otherwise hold the profile,
# and launch.sh, open: a program leaving a 60 s sleep behind took 63 s under the default and
# 3 s with primary (nsys 2022.4). The ranks are joined before the program exits, so the
# report loses nothing; a leftover runs on, as it would without nsys. It does not help a
# process that is itself stuck at exit: launch.sh's watchdog (scripts/nsys_watch.sh) does.
NSYS_PROFILE_OPTS=(
    --trace=cuda,cublas,cudnn,nvtx,osrt
    --sample=none
    --cpuctxsw=none
    --wait=primary
    --force-overwrite=true
)

# The capture window (docs/PROFILING.md, "Capture window"): nsys records only while the NVTX
# range handler/runtime/names.py's CAPTURE is open; the trainer opens it before the first
# captured epoch and closes it after the last (--profile-epochs). For train_cifar.py runs only:
# a program that never opens the range leaves no report. Same flags from nsys 2022.4 (checked
# here) to 2025.x. NSYS_NVTX_PROFILER_REGISTER_ONLY=0: nsys otherwise matches only registered
# NVTX strings, and torch.cuda.nvtx's are not.
NSYS_CAPTURE_OPTS=(
    --capture-range=nvtx
    --nvtx-capture=harness_capture
    --capture-range-end=stop
)

# Profile train_cifar.py with the capture window: adds NSYS_CAPTURE_OPTS to NSYS_PROFILE_OPTS
# and tells the trainer (HARNESS_CAPTURE_WINDOW=1) that nsys records only inside the range, so
# that it keeps its --profile-epochs window; under an nsys without these flags it records, and
# says, the whole run.
use_capture_window() {
    NSYS_PROFILE_OPTS+=("${NSYS_CAPTURE_OPTS[@]}")
    export NSYS_NVTX_PROFILER_REGISTER_ONLY=0 HARNESS_CAPTURE_WINDOW=1
}

# The window train_cifar.py will capture, in words, for a launch line: capture_window EPOCHS
# [PROFILE_EPOCHS]. The rule is handler/train/capture.py's: without PROFILE_EPOCHS, epochs 1-2
# of runs longer than 3 epochs, else all.
capture_window() {
    local epochs="$1" spec="${2:-}"
    if [[ -z $spec ]]; then
        if (( epochs > 3 )); then spec=1:2; else spec=all; fi
    fi
    if [[ $spec == all ]]; then
        echo "all $epochs epochs"
    elif [[ $spec =~ ^([0-9]+)(:([0-9]+))?$ ]]; then
        local first="${BASH_REMATCH[1]}" last="${BASH_REMATCH[3]:-${BASH_REMATCH[1]}}"
        if (( first == last )); then echo "epoch $first of $epochs"; else echo "epochs $first-$last of $epochs"; fi
    else
        return 1
    fi
}

# A process's start time (clock ticks after boot), which tells a reused PID; empty once it is gone.
start_of() { awk '{ sub(/^.*\) /, ""); print $20 }' "/proc/$1/stat" 2>/dev/null; }

# "pid start-time" of each agent that the nsys client PID started: nsys_agents_of PID START,
# START no later than the client's start_of. nsys 2022.4 starts its agent as a daemon (parent init, a
# session of its own), so it is outside the client's process tree; the agent's --session-name
# ends in the client's PID (profile-<program>-<PID>). An agent started before the client is
# another's. Left alive, an agent stays until the machine reboots.
nsys_agents_of() {
    local client="$1" client_start="$2" file pid start
    [[ -n $client_start ]] || return 0
    for file in $(grep -lszx -e "--session-name=.*-$client" /proc/[0-9]*/cmdline); do
        grep -qszx -e "--start-agent" "$file" || continue
        pid=${file#/proc/}; pid=${pid%/cmdline}
        start="$(start_of "$pid")"
        [[ -n $start ]] && (( start >= client_start )) && echo "$pid $start"
    done
}

# One tiny run, `nsys profile FLAGS... true`, into DIR/probe.*: nsys_probe DIR FLAGS...; what
# nsys printed goes to DIR/out, and its exit status is returned. Stopped after
# NSYS_PROBE_TIMEOUT_S (120). After so short a run nsys 2022.4 sometimes leaves its agent
# running (seen here: one agent per probe, for hours), so the agent of this nsys is ended by PID.
nsys_probe() {
    local dir="$1" pid since status=0 ticks=0 agent start
    shift
    since="$(start_of self)"  # now (awk's own start): a fast nsys may be gone before it is read
    nsys profile "$@" --trace=none --sample=none --cpuctxsw=none --force-overwrite=true \
        --output "$dir/probe" true >"$dir/out" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && (( ticks < ${NSYS_PROBE_TIMEOUT_S:-120} * 10 )); do
        sleep 0.1; ticks=$((ticks + 1))
    done
    kill "$pid" 2>/dev/null  # still running past the limit
    wait "$pid" || status=$?
    while read -r agent start; do
        [[ -n $agent && $(start_of "$agent") == "$start" ]] && kill -KILL "$agent" 2>/dev/null
    done < <(nsys_agents_of "$pid" "$since")
    return $status
}

# GPU metrics sampling (GPU_METRICS=1): SM active/issue/occupancy, DRAM and PCIe per GPU.
# nsys renamed the flag: --gpu-metrics-device (2021.2-2023.x), --gpu-metrics-devices (2024.x on).
# A short probe run finds out whether the driver grants counter access (ERR_NVGPUCTRPERM)
# and the GPU is supported; if not, one line says how to fix it and the run goes on without.
# Prints the options to add, one per line (nothing when unavailable); the reason goes to stderr.
# The probe failed when nsys exits non-zero, makes no report, or prints one of these:
NSYS_METRICS_FAILURE='not supported|unsupported|illegal|ERR_NV|failed to|no (supported|available) (gpu|device)'
gpu_metrics_options() {
    local help flag probe out made
    help="$(nsys profile --help 2>&1 || true)"
    if grep -q -- '--gpu-metrics-devices' <<<"$help"; then
        flag=--gpu-metrics-devices
    elif grep -q -- '--gpu-metrics-device' <<<"$help"; then
        flag=--gpu-metrics-device
    else
        echo "GPU metrics: this nsys ($(nsys --version 2>&1 | sed 's/.*version //')) has no --gpu-metrics-device[s] option; install nsys 2021.2 or newer (scripts/install_nsys.sh); continuing without GPU metrics" >&2
        return 0
    fi
    local status=0 failure
    probe="$(mktemp -d)"
    nsys_probe "$probe" "$flag=all" || status=$?
    out="$(cat "$probe/out")"
    made="$(compgen -G "$probe/probe.*rep" || true)"
    rm -rf "$probe"
    # nsys's own failure messages only: a line about "non-fatal errors" (its importer's
    # status on a good run) is not one.
    failure="$(grep -viE 'non-fatal' <<<"$out" | grep -iE "$NSYS_METRICS_FAILURE" | head -n 1 || true)"
    if grep -q 'ERR_NVGPUCTRPERM' <<<"$out"; then
        echo "GPU metrics: the driver refuses GPU performance counters to this user (ERR_NVGPUCTRPERM); run as root or load the driver with NVreg_RestrictProfilingToAdminUsers=0 (https://developer.nvidia.com/ERR_NVGPUCTRPERM); continuing without GPU metrics" >&2
    elif [[ -n $failure || $status != 0 || -z $made ]]; then
        [[ -z $failure ]] && failure="exit $status${made:+, a report}${made:-, no report}: $(tail -n 1 <<<"$out")"
        echo "GPU metrics: nsys cannot sample this GPU ($failure); use a Turing or newer GPU with a current nsys; continuing without GPU metrics" >&2
    else
        echo "$flag=all"
    fi
}

# Whether the nsys on PATH makes reports: it profiles `true` into a throwaway folder (a few
# seconds). An nsys that cannot, such as the one inside Nsight Compute's folder, would pass a
# `command -v nsys` and then fail the profiled run. Returns 0 when it made a report; else
# prints why, in words for a skip line, and returns 1.
nsys_makes_reports() {
    local probe out status=0 made
    if ! command -v nsys >/dev/null 2>&1; then
        echo "nsys is not on PATH (scripts/install_nsys.sh)"
        return 1
    fi
    probe="$(mktemp -d)"
    nsys_probe "$probe" || status=$?
    out="$(cat "$probe/out")"
    made="$(compgen -G "$probe/probe.*rep" || true)"
    rm -rf "$probe"
    if [[ -z $made ]]; then
        echo "$(command -v nsys) made no report of a tiny run (exit $status: $(grep -v '^\s*$' <<<"$out" | tail -n 1 | cut -c1-160)); install a full Nsight Systems (scripts/install_nsys.sh)"
        return 1
    fi
}
