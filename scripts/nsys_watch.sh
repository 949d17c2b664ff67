#!/usr/bin/env bash
# Watchdog for a profiled run, started in the background by scripts/launch.sh:
#
#   nsys_watch.sh PIDFILE METRICS CAUSEFILE TIMEOUT_S
#
# nsys 2022.4 once kept a finished training process waiting inside its injection library at
# exit, so launch.sh never returned. Once METRICS says training finished (total_time_s is
# set), nsys and everything it started must keep making progress until nsys exits: using
# at least 2 % of one core over any TIMEOUT_S seconds. A stuck wait uses next to nothing; the
# teardown of the run and the report nsys writes afterwards keep a core busy, however long
# they take. A backstop ends nsys 10 x TIMEOUT_S after training finished in any case.
# A stuck tree is ended by PID: SIGTERM to nsys (which then stops its session and writes what
# it has), and after TIMEOUT_S more, SIGKILL to nsys and to every process it had started that
# is still there (the stuck training process among them).
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

# CPU ticks used so far by the processes in `tree` output on stdin.
ticks() {
    local pid start total=0 fields
    while read -r pid start; do
        fields="$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null)" || continue
        read -r -a f <<<"$fields"
        total=$((total + f[11] + f[12] + f[13] + f[14]))  # utime stime cutime cstime
    done
    echo "$total"
}

alive() { kill -0 "$root" 2>/dev/null; }
finished() { grep -qE '"total_time_s": [0-9]' "$metrics" 2>/dev/null; }

hz="$(getconf CLK_TCK 2>/dev/null || echo 100)"
least=$(( (timeout_s * hz + 49) / 50 ))  # ticks: 2 % of one core over TIMEOUT_S seconds
progress=0 last="" samples=() cause=""
while alive; do
    sleep 1
    finished || continue
    now="$(tree | ticks)"
    # Only increases count: a process leaving the tree takes its ticks with it.
    [[ -n $last && $now -gt $last ]] && progress=$((progress + now - last))
    last=$now
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

started="$(tree)"
kill -TERM "$root" 2>/dev/null || exit 0
echo "$cause; ending it by PID" >"$causefile"
for ((waited = 0; waited < timeout_s * 10; waited++)); do alive || break; sleep 0.1; done
how="SIGTERM"
if alive; then how="SIGTERM, then SIGKILL"; fi
while read -r pid start; do
    [[ -n $pid && $(awk '{sub(/^.*\) /, ""); print $20}' "/proc/$pid/stat" 2>/dev/null) == "$start" ]] \
        && kill -KILL "$pid" 2>/dev/null
done <<<"$started"
echo "$cause; ended it by PID ($how)" >"$causefile"
