# The network of scripts/cluster.sh: a "switch" namespace holding a bridge, and one
# namespace set (net, UTS, mount) per host, each joined to the bridge by a veth pair.
# Nothing is created in the root namespace. Sourced, never run.

# =============================================================================
# Holders: one `sleep infinity` per host anchors its namespaces. It sets the host up
# from the inside first (hostname, loopback, /etc/hosts, an empty cgroup tree), then
# says it is ready. Its record holds its pid, start time and namespace ids.
# =============================================================================
HOLDER_SETUP='set -e
if [ "$1" != switch ]; then
    echo "$1" > /proc/sys/kernel/hostname
    # slurmd 22.05 always loads a cgroup plugin; an empty tmpfs keeps it out of the host tree
    mount -t tmpfs -o mode=755 cluster-cgroup /sys/fs/cgroup
    mount --bind "$2" /etc/hosts
    # no nameserver (glibc then asks 127.0.0.1, inside the host): no lookup ever leaves
    [ ! -e /etc/resolv.conf ] || mount --bind "$2.resolv" /etc/resolv.conf
fi
ip link set lo up
[ "$1" != switch ] || { ip link add br0 type bridge; ip link set br0 up; }
echo ready > "$3"
exec sleep infinity'

start_holder() {  # NAME (switch, head, nodeK)
    local name=$1 ready=$STATE/run/holder-$1.ready pid i
    rm -f "$ready"
    # --propagation slave: later host mounts still appear inside; ours never leak out
    setsid unshare --net --uts --mount --propagation slave sh -c "$HOLDER_SETUP" sh \
        "$name" "$STATE/hosts" "$ready" </dev/null >"$STATE/log/holder-$name.log" 2>&1 9>&- &
    pid=$!
    disown  # it lives on after this script; bash need not report its end
    for ((i = 0; i < 100; i++)); do
        [ -f "$ready" ] && break
        [ -d "/proc/$pid" ] || die "$name did not start: $(tail -n 3 "$STATE/log/holder-$name.log" | tr '\n' ' ')"
        sleep 0.05
    done
    [ -f "$ready" ] || die "$name did not get ready in 5 s (log: $STATE/log/holder-$name.log)"
    echo "$pid $(start_time "$pid") $(readlink "/proc/$pid/ns/net") $(readlink "/proc/$pid/ns/mnt")" \
        > "$STATE/run/holder-$name.pid"
}

in_ns() {  # NAME CMD...: run CMD in NAME's network namespace only (ip, tc, bridge)
    local pid
    pid=$(holder "$1") || die "$1 is not running; see scripts/cluster.sh status"
    nsenter --target "$pid" --net -- "${@:2}"
}

enter() {  # NAME CMD...: exec CMD in all of NAME's namespaces, in the caller's folder
    local pid
    pid=$(holder "$1") || die "$1 is not running (see scripts/cluster.sh status)"
    exec nsenter --target "$pid" --net --uts --mount --wd="$PWD" -- "${@:2}"
}

# =============================================================================
# Hosts and links
# =============================================================================
write_hosts() {
    {
        echo "127.0.0.1 localhost"
        echo "::1 localhost ip6-localhost ip6-loopback"
        echo "$HEAD_ADDR head"
        for name in $(nodes); do echo "$(node_addr "$name") $name"; done
    } > "$STATE/hosts"
    echo "# scripts/cluster.sh: no DNS inside the cluster; /etc/hosts names every host" > "$STATE/hosts.resolv"
}

connect() {  # NAME: a veth pair, switch port NAME <-> $IFNAME inside NAME, and its address
    local pid  # a && chain: callers test its status, and set -e does not reach inside such calls
    pid=$(holder "$1") &&
        unplug "$1" &&  # a killed host's old port: its namespace may linger while orphaned sockets time out
        in_ns switch ip link add "$1" type veth peer name "$IFNAME" netns "$pid" &&
        in_ns switch ip link set "$1" master br0 up &&
        in_ns "$1" ip addr add "$(node_addr "$1")/24" dev "$IFNAME" &&
        in_ns "$1" ip link set "$IFNAME" up
}

unplug() {  # NAME: delete its switch port, and with it the other end of the pair
    if in_ns switch ip link show dev "$1" >/dev/null 2>&1; then in_ns switch ip link del dev "$1"; fi
}

boot() {  # NAME: namespaces, hostname, /etc/hosts, link; a half-booted host is powered off again
    start_holder "$1"
    connect "$1" || { power_off "$1"; die "$1 could not be connected to the switch"; }
    say "$1 is up: $(node_addr "$1") on $IFNAME (holder pid $(holder "$1"))"
}

net_up() {  # N
    mkdir -p "$STATE/run" "$STATE/log"
    echo "$1" > "$STATE/nodes"
    write_hosts
    say "starting the switch (a bridge in its own namespace)"
    start_holder switch
    local name
    for name in head $(nodes); do boot "$name"; done
}

# =============================================================================
# Faults: a cut link drops every frame at the switch port (the host keeps its
# carrier and its processes, as behind a failed switch); power-off cuts the link,
# then SIGKILLs everything on the host, so no FIN or RST ever leaves it.
# =============================================================================
link_state() {  # NAME -> up | cut | off
    holder "$1" >/dev/null || { echo off; return; }
    if in_ns switch bridge link show dev "$1" | grep -q "state forwarding"; then echo up; else echo cut; fi
}

cut_link() { in_ns switch bridge link set dev "$1" state 0; }      # 0: disabled
restore_link() { in_ns switch bridge link set dev "$1" state 3; }  # 3: forwarding

require_host() {  # NAME: one of head, node1..N
    local name
    for name in head $(nodes); do [ "$1" = "$name" ] && return 0; done
    EXIT_CODE=2 die "no host named '$1'; the hosts are: head $(nodes | tr '\n' ' ')"
}

# =============================================================================
# Shaping: the same limits on both directions of a host's link. The rate is a tbf
# egress limit on $IFNAME inside the host (host -> switch) and on its switch port
# (switch -> host). The delay is netem's where the kernel has netem (same places);
# without netem it is the delay line: iptables in the switch hands every frame crossing
# a delayed port to NFQUEUE, and scripts/cluster/delay.py accepts it once the delays of
# its ports have passed (docs/MULTINODE.md, "Latency without netem").
# =============================================================================
DELAY_QUEUE=0       # NFQUEUE number in the switch's namespace (each cluster's switch has its own)
DELAY_CHAIN=CLUSTER_DELAY

rate_bits() {  # 50mbit | 1gbit | 500kbit | 50 (Mbit/s) -> bits per second
    local v=${1,,} n unit
    [[ $v =~ ^([0-9]+(\.[0-9]+)?)([kmg]?)(bit)?$ ]] || EXIT_CODE=2 die "--rate $1: use e.g. 50mbit, 1gbit, 500kbit"
    n=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[3]}
    [ -n "$unit" ] || [ -z "${BASH_REMATCH[4]}" ] || unit=b
    awk -v n="$n" -v u="${unit:-m}" 'BEGIN {m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : 1; printf "%d", n * m}'
}

delay_ms() {  # 0.5ms | 2 (ms) -> milliseconds
    [[ ${1,,} =~ ^([0-9]+(\.[0-9]+)?)(ms)?$ ]] || EXIT_CODE=2 die "--delay $1: use milliseconds, e.g. 0.5ms or 2"
    echo "${BASH_REMATCH[1]}"
}

has_netem() {  # does this kernel have netem? Asked once, on the switch's loopback, at `up`
    if in_ns switch tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
        in_ns switch tc qdisc del dev lo root
        return 0
    fi
    return 1
}

# ---- the delay line (kernels without netem) ---------------------------------
install_iptables() {
    command -v iptables >/dev/null && return 0
    say "installing iptables with apt-get (first use only: the delay line needs it, this kernel has no netem)"
    local apt=(apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=300 iptables)
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" >>"$STATE/log/apt.log" 2>&1 \
        || { apt-get update >>"$STATE/log/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" >>"$STATE/log/apt.log" 2>&1; } \
        || die "apt-get could not install iptables; see $STATE/log/apt.log"
}

delay_python() {  # the delay line needs only the standard library
    if [ -x "$REPO/.venv/bin/python" ]; then echo "$REPO/.venv/bin/python"; else command -v python3; fi
}

delay_line_up() {  # at `up` without netem: bridged frames through iptables, the program waiting
    install_iptables
    # built into this kind of kernel; per namespace: only this switch's frames see iptables
    in_ns switch sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 \
        || die "the switch cannot pass bridged frames through iptables (no br_netfilter): no delay without netem"
    in_ns switch iptables -w -N "$DELAY_CHAIN"
    in_ns switch iptables -w -A FORWARD -j "$DELAY_CHAIN"
    : > "$STATE/run/delay.conf"
    delay_start
    say "no netem in this kernel: delays go through the delay line (NFQUEUE $DELAY_QUEUE, pid $(recorded_pid delay))"
}

delay_start() {  # the program, recorded as run/delay.pid; returns once it has read its config
    local i
    rm -f "$STATE/run/delay.ack" "$STATE/run/delay.pid"
    start_daemon delay switch "$(delay_python)" "$REPO/scripts/cluster/delay.py" --queue "$DELAY_QUEUE" \
        --config "$STATE/run/delay.conf" --ack "$STATE/run/delay.ack"
    for ((i = 0; i < 200; i++)); do [ -f "$STATE/run/delay.ack" ] && return 0; delay_alive || break; sleep 0.05; done
    die "the delay line did not start: $(tail -n 2 "$STATE/log/delay.out" | tr '\n' ' ')"
}

delay_line() { [ -f "$STATE/run/delay.conf" ]; }     # is this cluster using the delay line?
delay_alive() {  # a dead program may linger as a zombie until init reaps it: that is dead too
    local pid
    pid=$(recorded_pid delay) && [ "$(awk '{sub(/.*\) /, ""); print $1}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

delay_dead_warning() {  # loud, and said wherever the links are looked at
    warn "THE DELAY LINE IS NOT RUNNING (recorded in $STATE/run/delay.pid; log $STATE/log/delay.out):" \
        "delayed links pass frames UNDELAYED (fail-open); scripts/cluster.sh shape restarts it"
}

delay_set() {  # NAME MS: NAME's port delays MS each way (0: none); returns once the program applied it
    local conf=$STATE/run/delay.conf old port dir i
    { grep -v "^$1 " "$conf" || true; [ "$2" = 0 ] || echo "$1 $2"; } > "$conf.new"
    mv "$conf.new" "$conf"
    # the new rules go in before the old ones go out: no frame of a delayed port slips past
    old=$(in_ns switch iptables -w -S "$DELAY_CHAIN" | grep -c -- '^-A' || true)
    for port in $(cut -d' ' -f1 "$conf"); do
        for dir in in out; do
            in_ns switch iptables -w -A "$DELAY_CHAIN" -m physdev "--physdev-$dir" "$port" \
                -j NFQUEUE --queue-num "$DELAY_QUEUE" --queue-bypass
        done
    done
    for ((i = 0; i < old; i++)); do in_ns switch iptables -w -D "$DELAY_CHAIN" 1; done
    kill -HUP "$(recorded_pid delay)" 2>/dev/null || true
    for ((i = 0; i < 200; i++)); do
        if ! delay_alive; then  # died before or while it read: a new one reads the config at start
            delay_dead_warning
            say "restarting the delay line"
            delay_start
        fi
        cmp -s "$conf" "$STATE/run/delay.ack" && delay_alive && return 0
        sleep 0.05
    done
    die "the delay line did not take the new delays in 10 s (log: $STATE/log/delay.out)"
}

# ---- shaping a host ----------------------------------------------------------
shape_dev() {  # NS DEV BITS DELAY_MS: netem with rate where the kernel has it (and no delay line runs), else tbf
    local ns=$1 dev=$2 bits=$3 delay=$4 burst
    if ! delay_line && in_ns "$ns" tc qdisc replace dev "$dev" root netem delay "${delay}ms" rate "$bits" \
        limit 100000 2>/dev/null; then
        echo netem
        return
    fi
    burst=$(( bits / 8 / 100 > 16000 ? bits / 8 / 100 : 16000 ))  # 10 ms of traffic, at least 16 kB
    in_ns "$ns" tc qdisc replace dev "$dev" root tbf rate "$bits" burst "$burst" latency 200ms
    echo tbf
}

shape() {  # NAME BITS DELAY_MS
    local how applied=$3
    how=$(shape_dev "$1" "$IFNAME" "$2" "$3")
    shape_dev switch "$1" "$2" "$3" >/dev/null
    if delay_line; then
        delay_set "$1" "$3"
        how="tbf + delay line"
    elif [ "$how" = tbf ] && [ "$3" != 0 ]; then
        applied=0
        warn "$1: rate $2 bit/s applied, but NOT the delay of $3 ms: no netem in this kernel and no delay line" \
            "(scripts/cluster.sh up said why)"
    fi
    echo "rate_bit=$2 delay_ms=$3 applied_delay_ms=$applied via=${how// /}" > "$STATE/run/shape-$1"
    say "$1: both directions shaped to $2 bit/s, delay $applied ms each way ($how)"
}

shape_summary() {  # NAME -> its recorded shaping, or -
    if [ -f "$STATE/run/shape-$1" ]; then tr '\n' ' ' < "$STATE/run/shape-$1"; else echo -; fi
}

unshape() {  # NAME
    in_ns "$1" tc qdisc del dev "$IFNAME" root 2>/dev/null || true
    in_ns switch tc qdisc del dev "$1" root 2>/dev/null || true
    if delay_line; then delay_set "$1" 0; fi
    rm -f "$STATE/run/shape-$1"
    say "$1: shaping removed"
}
