#!/usr/bin/env bash
# Watchdog for a profiled run, started in the background by scripts/launch.sh:
#
#   nsys_watch.sh PIDFILE METRICS CAUSEFILE TIMEOUT_S
#
# nsys 2022.4 once kept a finished training process waiting inside its injection library at
# exit, so launch.sh never returned. Once METRICS says training finished (total_time_s is
# set), nsys and everything it started must keep making progress until nsys exits.
#
# Progress, sampled each second, is any of (docs/PROFILING.md, "A profiled run never hangs"):
# - CPU wanted: the time the tree's threads ran plus the time they waited for a CPU in the
#   run queue (/proc/PID/task/TID/schedstat; without it, the CPU time used). The kernel adds
#   a wait when the thread gets the CPU, so a thread starved for seconds shows it late:
# - a thread runnable (state R: running, or waiting in the run queue) or in uninterruptible
#   I/O (state D) at a sample. A report writer starved on a loaded machine is runnable, so it
#   counts fully, however little CPU it gets;
# - growth of a regular file the tree has open (the .qdstrm, the .nsys-rep being written).
# The tree is stuck only when all of these add up to less than 2 % of one core over a whole
# TIMEOUT_S window: a stuck wait (a futex, a sleep) wants next to nothing. A backstop ends
# nsys 10 x TIMEOUT_S after training finished in any case (a tree busy-polling forever).
# A stuck tree is ended by PID: SIGTERM to nsys (which then stops its session and writes what
# it has), and after TIMEOUT_S more, SIGKILL to nsys and to every process it had started that
# is still there (the stuck training process among them, and nsys's agent, a daemon outside
# the tree: `agents`).
# The cause goes to CAUSEFILE, for launch.sh to print. The watchdog exits once nsys is gone
# (within a second when nsys ends by itself), so launch.sh waits for it rather than killing it.
set -uo pipefail

pidfile="$1" metrics="$2" causefile="$3" timeout_s="$4"

for _ in $(seq 600); do [[ -s $pidfile ]] && break; sleep 0.1; done
root="$(cat "$pidfile" 2>/dev/null)"
[[ $root =~ ^[0-9]+$ ]] || exit 0

# "pid start-time" of root and each of its descendants (the start time tells a reused PID).
tree() {
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v root="$root" '
        { pid = $1; sub(/^.*\) /, ""); split($0, f, " "); parent[pid] = f[2]; start[pid] = f[20] }
        END { keep[root] = 1
              for (changed = 1; changed;) { changed = 0
                  for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; changed = 1 } }
              for (p in parent) if (p in keep) print p, start[p] }'
}

# start_of and nsys_agents_of: the agents this nsys started (nsys 2022.4's agent is a daemon
# outside nsys's process tree).
source "$(dirname "${BASH_SOURCE[0]}")/nsys_options.sh"
agents() { nsys_agents_of "$root" "$(start_of "$root")"; }

# One line per thread of the processes in `tree` output (stdin): "t TID NS", the nanoseconds
# it has run or waited to run (without schedstat: "t PID NS" from the process's CPU ticks,
# its reaped children's included); one per regular file they hold open: "f FD-PATH BYTES";
# and "busy 1" when a thread is runnable (running or waiting for a CPU) or in uninterruptible I/O.
usage() {
    local pid start procs=() stats=() states=() fds=()
    while read -r pid start; do
        procs+=("/proc/$pid/stat")
        stats+=("/proc/$pid/task/"*/schedstat)
        states+=("/proc/$pid/task/"*/stat)
        fds+=("/proc/$pid/fd/"*)
    done
    [[ ${#procs[@]} -gt 0 ]] || return 0
    # Threads and processes come and go while they are read: cat and grep go on past one
    # that is gone (mawk would stop there).
    if [[ $schedstat == 1 ]]; then
        grep -H '' "${stats[@]}" 2>/dev/null | awk '{ split($0, at, "/"); sub(/^[^:]*:/, "")
            printf "t %s %.0f\n", at[5], $1 + $2 }'
    else  # utime stime cutime cstime, in clock ticks
        cat "${procs[@]}" 2>/dev/null | awk -v ns="$((1000000000 / hz))" '{ pid = $1; sub(/^.*\) /, "")
            printf "t %s %.0f\n", pid, ($12 + $13 + $14 + $15) * ns }'
    fi
    cat "${states[@]}" 2>/dev/null | awk '{ sub(/^.*\) /, "") } $1 == "R" || $1 == "D" { busy = 1 }
        END { if (busy) print "busy 1" }'
    stat -L -c '%F|%s|%n' "${fds[@]}" 2>/dev/null | awk -F'|' '$1 ~ /^regular/ { print "f", $3, $2 }'
}

# Sets `delta`: progress since the last sample, in ns: what each thread wanted (a thread first seen counts
# whole), 1 s when a thread is runnable or in I/O, 1 s when an open file grew. Per thread and per file, so a
# process or file leaving the tree takes nothing from the others' progress.
declare -A before=()
first=1
progress_since_last() {
    local kind key value old wanted=0 busy=0 grew=0
    local -A now=()
    while read -r kind key value; do
        case $kind in
            t) now[t$key]=$value
               old=${before[t$key]:-0}
               (( value > old )) && wanted=$((wanted + value - old)) ;;
            f) now[f$key]=$value
               old=${before[f$key]:-$value}
               (( value > old )) && grew=1 ;;
            busy) busy=1 ;;
        esac
    done < <(tree | usage)
    before=()
    for key in "${!now[@]}"; do before[$key]=${now[$key]}; done
    delta=$((wanted + (busy + grew) * 1000000000))
    if (( first )); then first=0 delta=0; fi
}

# A zombie (exited, not yet reaped by its parent) is gone: it does no more work.
alive() {
    local state
    state="$(awk '{ sub(/^.*\) /, ""); print $1 }' "/proc/$root/stat" 2>/dev/null)"
    [[ -n $state && $state != Z ]]
}
finished() { grep -qE '"total_time_s": [0-9]' "$metrics" 2>/dev/null; }

hz="$(getconf CLK_TCK 2>/dev/null || echo 100)"
schedstat=0
[[ -r /proc/self/schedstat ]] && schedstat=1
least=$((timeout_s * 20000000))  # ns: 2 % of one core over TIMEOUT_S seconds
progress=0 samples=() cause=""
while alive; do
    sleep 1
    finished || continue
    progress_since_last
    progress=$((progress + delta))
    samples+=("$progress")
    n=${#samples[@]}
    if (( n > timeout_s && progress - samples[n - 1 - timeout_s] < least )); then
        cause="nsys made no progress for ${timeout_s} s after training finished"
    elif (( n >= 10 * timeout_s )); then
        cause="nsys was still running $((10 * timeout_s)) s after training finished"
    fi
    [[ -n $cause ]] && break
done
alive || exit 0

started="$(tree; agents)"
kill -TERM "$root" 2>/dev/null || exit 0
echo "$cause; ending it by PID" >"$causefile"
for ((waited = 0; waited < timeout_s * 10; waited++)); do alive || break; sleep 0.1; done
how="SIGTERM"
if alive; then how="SIGTERM, then SIGKILL"; fi
while read -r pid start; do
    [[ -n $pid && $(start_of "$pid") == "$start" ]] \
        && kill -KILL "$pid" 2>/dev/null
done <<<"$started"
echo "$cause; ended it by PID ($how)" >"$causefile"
