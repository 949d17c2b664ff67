# Slurm on the namespaces of net.sh: munged and slurmctld on head, one slurmd per
# node, all from Debian's packages, configured and logged under $STATE. Sourced.

# =============================================================================
# Packages (first use only)
# =============================================================================
install_slurm() {
    local cmd missing=0
    for cmd in slurmctld slurmd munged sbatch; do command -v "$cmd" >/dev/null || missing=1; done
    [ "$missing" = 1 ] || return 0
    say "installing ${SLURM_PACKAGES[*]} with apt-get (first use only)"
    # A package's post-install may start a system munged on /run/munge: harmless, ours has its own socket.
    local apt=(apt-get install -y --no-install-recommends -o DPkg::Lock::Timeout=300 "${SLURM_PACKAGES[@]}")
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" >"$STATE/log/apt.log" 2>&1 \
        || { apt-get update >>"$STATE/log/apt.log" 2>&1 && DEBIAN_FRONTEND=noninteractive "${apt[@]}" >>"$STATE/log/apt.log" 2>&1; } \
        || die "apt-get could not install ${SLURM_PACKAGES[*]}; see $STATE/log/apt.log"
}

# =============================================================================
# Daemons: started in a host's namespaces, recorded in run/NAME.pid, ended by it
# =============================================================================
start_daemon() {  # NAME HOST CMD...: CMD stays in the foreground; its pid is the record
    local pid
    pid=$(holder "$2") || die "$2 is not running"
    setsid nsenter --target "$pid" --net --uts --mount --wd="$STATE" -- "${@:3}" \
        </dev/null >>"$STATE/log/$1.out" 2>&1 9>&- &
    record_pid "$1" $!
    disown  # it lives on after this script; bash need not report its end
}

on_head() {  # CMD...: a Slurm client command on head, output to the caller
    SLURM_CONF=$STATE/etc/slurm.conf nsenter --target "$(holder head)" --net --uts --mount --wd="$PWD" -- "$@"
}

wait_for() {  # SECONDS WHAT CMD...: poll CMD until it succeeds
    local deadline=$((SECONDS + $1))
    until "${@:3}" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$2 did not happen in $1 s; logs: $STATE/log/"
        sleep 0.2
    done
}

# =============================================================================
# munge: one munged serves every host. Its socket is a path, and paths are shared.
# =============================================================================
start_munge() {
    mkdir -p "$STATE/munge"
    chmod 755 "$STATE/munge"  # munged refuses a socket folder others may write
    if [ ! -f "$STATE/munge/munge.key" ]; then
        say "making a munge key (shared by every host of this cluster only)"
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
        chmod 400 "$STATE/munge/munge.key"
    fi
    say "starting munged on head"
    # --force: the state folder may sit below a private one (/root, pytest's tmp), and munged
    # wants every parent open to all; every client here is root.
    start_daemon munged head munged --foreground --force --socket="$STATE/munge/munge.socket" \
        --key-file="$STATE/munge/munge.key" --pid-file="$STATE/munge/munged.pid" \
        --seed-file="$STATE/munge/munged.seed" --log-file="$STATE/log/munged.log"
    wait_for 10 "munged's socket" test -S "$STATE/munge/munge.socket"
}

# =============================================================================
# Configuration: short timeouts so that faults show within seconds (see
# docs/MULTINODE.md, "The local cluster", for what a real cluster uses instead)
# =============================================================================
write_slurm_conf() {
    local cpus name
    cpus=$(nproc)
    mkdir -p "$STATE/etc" "$STATE/spool"
    rm -rf "$STATE/spool/"*  # no job of an earlier cluster comes back
    # A name of its own for each cluster brought up: job ids start at 1 again after down/up, and
    # train.sbatch tells runs apart by cluster name, job id and first start (docs/CHECKPOINTS.md).
    local cluster_name
    cluster_name=local-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
    cat > "$STATE/etc/slurm.conf" <<EOF
# Written by scripts/cluster.sh up; every path is under $STATE.
ClusterName=$cluster_name
SlurmctldHost=head($HEAD_ADDR)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a requeued job waits before it may start again (default 120 s; 5 is the least)
AuthInfo=socket=$STATE/munge/munge.socket,cred_expire=5
StateSaveLocation=$STATE/spool/slurmctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pidfile
SlurmdPidFile=$STATE/run/slurmd-%n.pidfile
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=2,bf_interval=2
SlurmdParameters=config_overrides
ReturnToService=2
# A node silent for SlurmdTimeout s is DOWN and its jobs end (NODE_FAIL; sbatch --wait may
# report that as exit 0). Real clusters: 300. Longer than the tests' --dist-timeout, so that,
# as on a real cluster, the training names the lost peer and fails the job first.
SlurmdTimeout=60
# SIGTERM to SIGKILL when a job is cancelled or ends at its limit
KillWait=5
# A finished job stays visible for MinJobAge s; at most 5 keeps sbatch --wait polling every 2 s
MinJobAge=5
EOF
    for name in $(nodes); do
        echo "NodeName=$name NodeAddr=$(node_addr "$name") CPUs=$cpus State=UNKNOWN" >> "$STATE/etc/slurm.conf"
    done
    echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$STATE/etc/slurm.conf"
    echo "CgroupPlugin=cgroup/v1" > "$STATE/etc/cgroup.conf"
}

# =============================================================================
# Start-up
# =============================================================================
start_slurmd() {  # NODE
    mkdir -p "$STATE/spool/$1"
    start_daemon "slurmd-$1" "$1" slurmd -D -N "$1" -f "$STATE/etc/slurm.conf"
}

all_idle() {
    [ "$(on_head sinfo -h -N -t idle -o %N | sort -u | wc -l)" = "$(node_count)" ]
}

slurm_up() {
    install_slurm
    start_munge
    write_slurm_conf
    say "starting slurmctld on head ($HEAD_ADDR:6817)"
    start_daemon slurmctld head slurmctld -D -f "$STATE/etc/slurm.conf"
    wait_for 20 "slurmctld answering" on_head scontrol ping
    local name
    for name in $(nodes); do
        say "starting slurmd on $name"
        start_slurmd "$name"
    done
    wait_for 30 "every node idle" all_idle
}

slurm_down() {
    local name daemons=()
    for name in $(nodes); do daemons+=("slurmd-$name"); done
    stop_recorded "${daemons[@]}" slurmctld munged
}

slurm_status() {
    on_head sinfo -N -o "%10N %10T %C" || warn "slurmctld does not answer"
    on_head squeue -o "%.6i %.10j %.8T %.10M %.6D %R" || true
}
