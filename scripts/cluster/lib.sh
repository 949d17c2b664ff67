# Shared pieces of scripts/cluster.sh: settings, messages, records, and finding the
# processes of a node. Sourced, never run.

# =============================================================================
# Settings
# =============================================================================
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STATE=${CLUSTER_STATE:-$REPO/.cluster}   # every file the cluster writes lives here
SUBNET=198.18.0                           # RFC 2544 benchmarking range: never routed anywhere
HEAD_ADDR=$SUBNET.10                      # nodeK is $SUBNET.(10+K)
IFNAME=eth0                               # the interface inside head and every node
MAX_NODES=64
SLURM_PACKAGES=(slurmctld slurmd munge slurm-client)

node_addr() {  # head | nodeK -> its address
    if [ "$1" = head ]; then echo "$HEAD_ADDR"; else echo "$SUBNET.$((10 + ${1#node}))"; fi
}

node_count() { cat "$STATE/nodes" 2>/dev/null || echo 0; }
nodes() { local k; for ((k = 1; k <= $(node_count); k++)); do echo "node$k"; done; }
slurm_mode() { [ -f "$STATE/etc/slurm.conf" ]; }

# =============================================================================
# Messages: every step says what it does; a failure is one line and a non-zero exit
# =============================================================================
say() { echo "cluster: $*"; }
warn() { echo "cluster: warning: $*" >&2; }
die() { echo "cluster: $*" >&2; exit "${EXIT_CODE:-1}"; }
banner() {
    echo "=== $* $(printf '=%.0s' $(seq 1 $((60 - ${#1}))))"
}

# =============================================================================
# Privileges: root with CAP_NET_ADMIN and CAP_SYS_ADMIN, and namespaces that work
# =============================================================================
missing_privileges() {  # prints what is missing, nothing when all is there
    local caps missing=()
    [ "$(id -u)" = 0 ] || missing+=("root")
    caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)
    (( (16#$caps >> 12) & 1 )) || missing+=("CAP_NET_ADMIN")
    (( (16#$caps >> 21) & 1 )) || missing+=("CAP_SYS_ADMIN")
    if [ ${#missing[@]} = 0 ] && ! unshare --net --uts --mount true 2>/dev/null; then
        missing+=("network/UTS/mount namespaces (unshare --net --uts --mount fails)")
    fi
    [ ${#missing[@]} = 0 ] || echo "${missing[*]}"
}

require_privileges() {
    local missing
    missing=$(missing_privileges)
    [ -z "$missing" ] || EXIT_CODE=2 die "needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN; missing: $missing" \
        "(run as root on a host or a --privileged container)"
}

# =============================================================================
# Records: a pid file holds "PID STARTTIME", so a recycled pid is never signalled
# =============================================================================
start_time() { awk '{sub(/.*\) /, ""); print $20}' "/proc/$1/stat" 2>/dev/null; }

record_pid() {  # NAME PID
    echo "$2 $(start_time "$2")" > "$STATE/run/$1.pid"
}

recorded_pid() {  # NAME -> PID when that process is still the one recorded
    local file=$STATE/run/$1.pid pid start
    [ -f "$file" ] || return 1
    read -r pid start _ < "$file"
    [ -n "$pid" ] && [ "$(start_time "$pid")" = "$start" ] && echo "$pid"
}

stop_recorded() {  # NAME...: SIGTERM the recorded processes together, SIGKILL after 5 s; forget them
    local name pid pids=() i
    for name in "$@"; do
        if pid=$(recorded_pid "$name"); then kill -TERM "$pid" 2>/dev/null && pids+=("$pid"); fi
    done
    for ((i = 0; i < 50 && ${#pids[@]} > 0; i++)); do
        for pid in "${!pids[@]}"; do [ -d "/proc/${pids[$pid]}" ] || unset "pids[$pid]"; done
        sleep 0.1
    done
    for name in "$@"; do
        if pid=$(recorded_pid "$name"); then kill -KILL "$pid" 2>/dev/null || true; fi
        rm -f "$STATE/run/$name.pid"
    done
}

# =============================================================================
# A node's processes: those in both its network and its mount namespace, found in
# /proc. Holder records hold "PID STARTTIME NETNS MNTNS" (see net.sh).
# =============================================================================
holder() { recorded_pid "holder-$1"; }  # NODE -> the pid anchoring its namespaces

node_members() {  # NODE -> every pid inside it, its holder included
    local file=$STATE/run/holder-$1.pid net mnt pid
    [ -f "$file" ] || return 0
    read -r _ _ net mnt < "$file"
    [ -n "$mnt" ] || return 0
    net=${net//\[/\\[}  # find -lname takes a glob: net:[4026...] needs its brackets escaped
    net=${net//\]/\\]}
    for pid in $(find /proc/[0-9]*/ns/net -maxdepth 0 -lname "$net" 2>/dev/null | cut -d/ -f3); do
        [ "$(readlink "/proc/$pid/ns/mnt" 2>/dev/null)" = "$mnt" ] && echo "$pid"
    done
    return 0
}

power_off() {  # NODE: SIGKILL everything in it until nothing is left; its namespaces go with it
    local pids i
    for ((i = 0; i < 100; i++)); do
        pids=$(node_members "$1")
        [ -n "$pids" ] || { rm -f "$STATE/run/holder-$1.pid"; return 0; }
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        sleep 0.05
    done
    die "processes of $1 survive SIGKILL: $(node_members "$1" | tr '\n' ' ')"
}

# Serialise verbs that change the cluster (a test's fault injection next to a status).
lock() {
    mkdir -p "$STATE"
    exec 9>"$STATE/lock"
    flock 9
}
