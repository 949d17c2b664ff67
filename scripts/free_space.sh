# Whether a disk has room for an install, in one place for scripts/setup.sh,
# scripts/smoke_old_torch.sh and scripts/laptop_report.sh. Sourced.
#
# A torch venv holds about 7 GiB (the CUDA build and its nvidia-* libraries), and pip keeps
# its downloads in TMPDIR until the install ends. A disk that fills half way leaves a broken
# venv and a pip traceback (a cluster's home quota, a box full of old clones), so the room is
# checked first, and a lack of it is one line.

# free_mib PATH: MiB free on the file system of PATH (one that exists: room_for found it).
free_mib() {
    df -Pk "$1" | awk 'NR == 2 { print int($4 / 1024) }'
}

# room_for WHO DIR DIR_GIB TMP_GIB: returns 2 after one line on stderr when DIR's disk lacks
# DIR_GIB, or TMPDIR's lacks TMP_GIB (both together where they are one disk).
room_for() {
    local who="$1" dir="$2" need="$3" need_tmp="$4" tmp="${TMPDIR:-/tmp}" here there
    here="$(nearest "$dir")" there="$(nearest "$tmp")"
    if [ "$(disk_of "$here")" = "$(disk_of "$there")" ]; then
        short "$who" "$dir with pip's downloads (TMPDIR=$tmp)" "$here" $((need + need_tmp)) || return 2
    else
        short "$who" "$dir" "$here" "$need" || return 2
        short "$who" "pip's download folder (TMPDIR=$tmp)" "$there" "$need_tmp" || return 2
    fi
}

# disk_of PATH: the device number of PATH's file system (GNU stat, else BSD's: a Mac runs the laptop report).
disk_of() {
    stat -c %d "$1" 2>/dev/null || stat -f %d "$1"
}

# nearest PATH: PATH, or its nearest existing parent, made absolute.
nearest() {
    local path="$1"
    until [ -e "$path" ]; do path="$(dirname "$path")"; done
    (cd "$path" && pwd)
}

# short WHO WHAT PATH GIB: one line and status 1 when PATH's disk has less than GIB free.
short() {
    local free
    free="$(free_mib "$3")"
    (( free >= $4 * 1024 )) && return 0
    echo "$1: not enough disk space: $2 needs about $4 GiB, and the disk of $3 has" \
         "$(awk -v m="$free" 'BEGIN { printf "%.1f", m / 1024 }') GiB free;" \
         "free some space (old venvs, clones, /tmp), or point TMPDIR at a roomier disk" >&2
    return 1
}
