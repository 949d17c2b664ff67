#!/usr/bin/env bash
# A Slurm cluster on one Linux machine: a head and N nodes, each a host of its own
# (network, UTS and mount namespaces), on one switch. For trying multi-node training,
# for the tests, and for learning what host faults do. Needs root, CAP_NET_ADMIN and
# CAP_SYS_ADMIN. Slurm is Debian's 22.05 (slurmctld, slurmd, munge, slurm-client),
# installed with apt-get on first use.
#
#   scripts/cluster.sh up [--nodes N] [--net-only]   start (N = 2; --net-only: hosts, no Slurm)
#   scripts/cluster.sh down                           end everything it started; again: no-op
#   scripts/cluster.sh run CMD...                     CMD on head with the cluster's Slurm config
#   scripts/cluster.sh exec HOST CMD...               CMD on HOST, in this folder, with this env
#   scripts/cluster.sh status                         hosts, links, process counts, Slurm state
#   scripts/cluster.sh partition HOST | heal HOST     cut / restore HOST's link
#   scripts/cluster.sh kill NODE                      power NODE off (heal powers it on again)
#   scripts/cluster.sh shape [HOST] --rate R [--delay D] | --clear    tc on both directions
#   scripts/cluster.sh check                          can this machine run it? (one line)
#
# Hosts and addresses (198.18.0.0/24 only, assigned inside the cluster's namespaces;
# the root namespace gets no device, address or route):
#   head   198.18.0.10   slurmctld, munged; where `run` executes
#   nodeK  198.18.0.(10+K), K = 1..N: slurmd; where jobs run
# Inside every host the interface is eth0 (GLOO_SOCKET_IFNAME=eth0, NCCL_SOCKET_IFNAME=eth0)
# and /etc/hosts names all hosts. The hosts are joined by a bridge in a "switch"
# namespace. The filesystem is the machine's own, shared by all hosts.
#
# State: $CLUSTER_STATE (default .cluster/ in the repository, git-ignored): records of
# every process started (run/*.pid), Slurm's config, spool and logs (log/). `down`
# keeps only log/. Two clusters can run at once with different CLUSTER_STATE folders.
#
# Faults: `partition` drops every frame at the host's switch port (processes live on,
# unreachable); `kill` cuts the link and SIGKILLs every process of the node (power
# loss: no FIN/RST leaves it); `heal` restores the link, or boots a killed node and
# its slurmd. `shape HOST` limits both directions of HOST's link (tbf rate; delay by
# netem, or where the kernel has none by the delay line: iptables NFQUEUE in the switch
# and scripts/cluster/delay.py, recorded in run/delay.pid, fail-open); without HOST it
# shapes every node.
# docs/MULTINODE.md ("The local cluster") maps all of this onto a real cluster.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster/lib.sh
source "$HERE/cluster/lib.sh"
# shellcheck source=cluster/net.sh
source "$HERE/cluster/net.sh"
# shellcheck source=cluster/slurm.sh
source "$HERE/cluster/slurm.sh"

usage() { sed -n '8,16p' "$0" | sed 's/^#//' >&2; EXIT_CODE=2 die "$1"; }

# =============================================================================
# up / down
# =============================================================================
cmd_up() {
    local n=2 net_only=0
    while [ $# -gt 0 ]; do
        case $1 in
            --nodes) [ $# -ge 2 ] || usage "--nodes needs a count"; n=$2; shift 2 ;;
            --net-only) net_only=1; shift ;;
            *) usage "up: unknown option '$1'" ;;
        esac
    done
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_NODES)) || EXIT_CODE=2 die "--nodes $n: use 1..$MAX_NODES"
    require_privileges
    lock
    if holder switch >/dev/null; then
        EXIT_CODE=2 die "already up with $(node_count) node(s) (state in $STATE); run scripts/cluster.sh down first"
    fi
    teardown quiet  # whatever a crashed run left
    mkdir -p "$STATE/run" "$STATE/log"
    # EXIT, not ERR: a failed step ends in `die`, which exits without raising ERR.
    trap 'warn "up failed; ending what it started"; teardown quiet' EXIT
    local started=$EPOCHREALTIME
    banner "Network: switch, head and $n node(s) on $SUBNET.0/24"
    net_up "$n"
    # without netem, the delay line; a machine that cannot have it still gets a cluster, and shape says so
    if ! has_netem && ! (delay_line_up); then
        rm -f "$STATE/run/delay.conf"
        warn "NO DELAY LINE: shape --delay will apply rates only on this cluster (the line above says why)"
    fi
    if [ "$net_only" = 0 ]; then
        banner "Slurm"
        install_slurm  # before the clock: a first apt-get install is not set-up
        started=$EPOCHREALTIME
        slurm_up
    fi
    trap - EXIT
    banner "Ready"
    say "up in $(awk -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}') s:" \
        "head + $n node(s)$([ "$net_only" = 1 ] && echo ", network only" || echo ", all idle in Slurm")"
    say "next: scripts/cluster.sh status | run sinfo | exec node1 hostname | down"
}

teardown() {  # [quiet]: end every recorded daemon, then every process of every host
    local name
    [ -d "$STATE/run" ] || { [ "${1:-}" = quiet ] || say "nothing to end: no cluster in $STATE"; return 0; }
    slurm_down
    stop_recorded delay
    for name in $(nodes) head switch; do
        if [ -f "$STATE/run/holder-$name.pid" ]; then
            [ "${1:-}" = quiet ] || say "ending $name ($(node_members "$name" | wc -l) process(es))"
            power_off "$name"
        fi
    done
    rm -rf "$STATE/run" "$STATE/etc" "$STATE/spool" "$STATE/munge" "$STATE/hosts" "$STATE/hosts.resolv" "$STATE/nodes"
    [ "${1:-}" = quiet ] || say "down: no namespace, process or mount of the cluster is left (logs: $STATE/log)"
}

cmd_down() {
    require_privileges
    lock
    teardown
}

# =============================================================================
# Using the hosts
# =============================================================================
cmd_exec() {
    [ $# -ge 2 ] || usage "exec needs a host and a command"
    require_privileges
    require_host "$1"
    if slurm_mode; then export SLURM_CONF=$STATE/etc/slurm.conf; fi
    enter "$@"
}

cmd_run() {
    [ $# -ge 1 ] || usage "run needs a command, e.g. run sinfo"
    require_privileges
    slurm_mode || EXIT_CODE=2 die "no Slurm is running (state in $STATE); start it with scripts/cluster.sh up"
    export SLURM_CONF=$STATE/etc/slurm.conf
    enter head "$@"
}

cmd_status() {
    require_privileges
    holder switch >/dev/null || { say "down (state in $STATE)"; return 0; }
    banner "Hosts (state in $STATE)"
    printf "%-8s %-13s %-5s %-8s %-10s %s\n" host address link holder processes shape
    local name procs
    for name in head $(nodes); do
        procs=$(node_members "$name" | wc -l)
        printf "%-8s %-13s %-5s %-8s %-10s %s\n" "$name" "$(node_addr "$name")" "$(link_state "$name")" \
            "$(holder "$name" || echo -)" "$((procs > 0 ? procs - 1 : 0))" \
            "$(shape_summary "$name")"
    done
    if delay_line; then
        if delay_alive; then
            say "delay line: pid $(recorded_pid delay), NFQUEUE $DELAY_QUEUE; delays (ms each way): $(tr '\n' ' ' < "$STATE/run/delay.conf")"
        else
            delay_dead_warning
        fi
    fi
    if slurm_mode && holder head >/dev/null; then
        banner "Slurm"
        slurm_status
    fi
}

# =============================================================================
# Faults
# =============================================================================
cmd_fault() {  # partition|heal|kill HOST
    [ $# = 2 ] || usage "$1 needs one host"
    require_privileges
    lock
    require_host "$2"
    local state
    state=$(link_state "$2")
    case $1 in
        partition)
            [ "$state" != off ] || EXIT_CODE=2 die "$2 is powered off; heal $2 powers it on"
            cut_link "$2"
            say "$2 partitioned: its link drops every frame; its processes keep running" ;;
        heal)
            if [ "$state" = off ]; then
                say "powering $2 on"
                # What SlurmdTimeout would do 60 s after the power loss, at once: DOWN releases
                # the node's jobs (a job whose node died stays COMPLETING until then). The node
                # returns to service when its slurmd registers (ReturnToService=2).
                if slurm_mode && [[ $2 == node* ]]; then
                    on_head scontrol update NodeName="$2" State=DOWN Reason="powered off by cluster.sh kill" \
                        || warn "slurmctld did not take $2 DOWN; its jobs end after SlurmdTimeout"
                fi
                boot "$2"
                if slurm_mode; then start_slurmd "$2"; say "slurmd started on $2"; fi
            else
                restore_link "$2"
                say "$2 healed: its link forwards again"
            fi ;;
        kill)
            [[ $2 == node* ]] || EXIT_CODE=2 die "kill powers off a node; head runs slurmctld: use partition head"
            [ "$state" != off ] || { say "$2 is already off"; return 0; }
            cut_link "$2"  # first: no FIN or RST of the dying processes reaches anyone
            local count
            count=$(node_members "$2" | wc -l)
            power_off "$2"
            unplug "$2"
            rm -f "$STATE/run/slurmd-$2.pid" "$STATE/run/shape-$2"
            if delay_line; then delay_set "$2" 0; fi  # its shaping went with its link
            say "$2 powered off: $((count - 1)) process(es) SIGKILLed, link gone; heal $2 boots it" ;;
    esac
}

cmd_shape() {
    local target="" rate="" delay=0 clear=0
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) [ $# -ge 2 ] || usage "--rate needs a value"; rate=$2; shift 2 ;;
            --delay) [ $# -ge 2 ] || usage "--delay needs a value"; delay=$2; shift 2 ;;
            --clear) clear=1; shift ;;
            -*) usage "shape: unknown option '$1'" ;;
            *) target=$1; shift ;;
        esac
    done
    [ "$clear" = 1 ] || [ -n "$rate" ] || usage "shape needs --rate R (e.g. 50mbit) [--delay D], or --clear"
    require_privileges
    lock
    local name bits ms targets
    if [ -n "$target" ]; then require_host "$target"; targets=$target; else targets=$(nodes); fi
    if [ "$clear" = 0 ]; then bits=$(rate_bits "$rate"); ms=$(delay_ms "$delay"); fi
    for name in $targets; do
        [ "$(link_state "$name")" != off ] || EXIT_CODE=2 die "$name is powered off"
        if [ "$clear" = 1 ]; then unshape "$name"; else shape "$name" "$bits" "$ms"; fi
    done
}

# =============================================================================
# Dispatch
# =============================================================================
verb=${1:-}
[ $# -gt 0 ] && shift
case $verb in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    run) cmd_run "$@" ;;
    exec) cmd_exec "$@" ;;
    status) cmd_status ;;
    partition | heal | kill) cmd_fault "$verb" "$@" ;;
    shape) cmd_shape "$@" ;;
    check) missing=$(missing_privileges); [ -z "$missing" ] || EXIT_CODE=2 die "missing: $missing"; say "ok" ;;
    *) usage "unknown verb '${verb}'" ;;
esac
