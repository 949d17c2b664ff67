#!/usr/bin/env bash
# Install Nsight Systems (nsys) for scripts/launch.sh and the profiling tests, never at the
# cost of the machine's NVIDIA driver.
#
#   scripts/install_nsys.sh          find or install nsys, and put it on PATH
#   scripts/install_nsys.sh --find   print the path of an nsys already on this machine (exit 1: none)
#
# 1. An nsys already here is used: on PATH, in a CUDA toolkit (/usr/local/cuda*/bin), in
#    NVIDIA's packages (/opt/nvidia/nsight-systems*), or Debian's (/usr/lib/nsight-systems,
#    or wherever `dpkg -L nsight-systems` says). One off PATH gets a link in /usr/local/bin.
# 2. Otherwise apt installs it: Debian's nsight-systems from contrib/non-free, or on Ubuntu
#    nsight-systems(-cli) from NVIDIA's CUDA apt repository when it is configured.
# 3. Debian's package depends on `libcuda1 | libcuda.so.1`, and with it come nvidia-smi,
#    libnvidia-ml1 and the nvidia alternatives. Where the driver came from NVIDIA's installer,
#    those put a second set of user-space libraries beside its kernel module ("driver/library
#    version mismatch") and CUDA stops working for everything on the machine. So where a driver
#    is present (/proc/driver/nvidia/version, or an nvidia-smi that works) the install is
#    simulated first (apt-get -s), and a plan that would install, replace or remove any NVIDIA
#    driver package stops here, in one line that says what to install by hand.
#
# 4. Where no driver is present (a CPU machine), Debian's package is never installed: its
#    libcuda1 (CUDA 12, driver 535) makes torch warn in every process that "the NVIDIA driver
#    on your system is too old", so a CPU box looks like a broken GPU box. Instead
#    `apt-get download` fetches nsight-systems and nsight-systems-target into a private apt
#    state (nothing added to /etc/apt), `dpkg -x` unpacks them into
#    /opt/nsight-systems-debian/<version>, and only their dependencies that are not driver
#    packages (libssh-4, libucx0, ...) are installed with apt, after a simulation that refuses
#    any NVIDIA driver package. No libcuda reaches the machine (docs/PROFILING.md).
#
# NSYS_INSTALL_SYSROOT (empty) prefixes every system path this script reads or writes; the
# tests point it at a fake machine and put fake apt-get, dpkg and nvidia-smi first on PATH.
set -euo pipefail

ROOTFS="${NSYS_INSTALL_SYSROOT:-}"
say() { echo "install_nsys: $*" >&2; }
PRIVATE="$ROOTFS/opt/nsight-systems-debian"  # unpacked, driver-free installs (point 4 above)
MANUAL="get Nsight Systems from https://developer.nvidia.com/nsight-systems (or a CUDA repo) and put nsys on PATH"
# Packages that are (part of) an NVIDIA driver's user space, Debian's and Ubuntu's names.
DRIVER_PACKAGES='^(libcuda1|libcuda\.so\.1|libcudadebugger1|libnvcuvid1|libnvoptix1|libnvidia-.*|nvidia-smi|nvidia-alternative|glx-alternative-nvidia|nvidia-installer-cleanup|nvidia-legacy-check|nvidia-support|nvidia-persistenced|nvidia-modprobe|nvidia-settings|nvidia-driver.*|nvidia-kernel-.*|nvidia-open-kernel-.*|nvidia-dkms-.*|nvidia-utils-.*|nvidia-compute-utils-.*|nvidia-vdpau-driver|nvidia-egl-.*|nvidia-opencl-icd|nvidia-vulkan-icd|nvidia-fabricmanager.*|libgl1-nvidia-.*|libglx-nvidia0|libegl-nvidia0|libgles-nvidia.*|xserver-xorg-video-nvidia.*|firmware-nvidia-.*|cuda-drivers.*)$'

# Every nsys this machine already has, most likely first: PATH, then the newest of each family.
candidates() {
    command -v nsys 2>/dev/null || true
    local pattern
    for pattern in "$ROOTFS/opt/nvidia/nsight-systems*/*/bin/nsys" "$ROOTFS/opt/nvidia/nsight-systems*/bin/nsys" \
                   "$ROOTFS/usr/local/cuda*/bin/nsys" "$ROOTFS/usr/lib/nsight-systems/bin/nsys" \
                   "$PRIVATE/*/usr/lib/nsight-systems/bin/nsys"; do
        compgen -G "$pattern" | sort -rV || true
    done
    if dpkg -L nsight-systems >/dev/null 2>&1; then
        dpkg -L nsight-systems | grep -E '/nsys$' | sed "s|^|$ROOTFS|" || true
    fi
}

find_nsys() {
    local path
    while read -r path; do
        [[ -n $path && -f $path && -x $path ]] && "$path" --version >/dev/null 2>&1 && { echo "$path"; return 0; }
    done < <(candidates)
    return 1
}

# Puts a found nsys on PATH (a link in /usr/local/bin) and reports its version.
use_nsys() {
    local found="$1" link="$ROOTFS/usr/local/bin/nsys"
    if [[ $found == "$(command -v nsys 2>/dev/null)" ]]; then
        "$found" --version
        return 0
    fi
    if [[ ${#SUDO[@]} -gt 0 ]] && ! command -v sudo >/dev/null 2>&1; then
        say "nsys found at $found but not on PATH, and without root or sudo it cannot be linked; add its folder: export PATH=\"$(dirname "$found"):\$PATH\""
        exit 1
    fi
    say "nsys found at $found (not on PATH); linking it as $link"
    "${SUDO[@]}" mkdir -p "$(dirname "$link")"
    "${SUDO[@]}" ln -sf "$found" "$link"
    "$link" --version
}

driver_version() {
    local file="$ROOTFS/proc/driver/nvidia/version"
    if [[ -r $file ]]; then
        grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' "$file" | head -n 1 || echo "unknown version"
        return 0
    fi
    local smi
    smi="$(timeout 20 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)" \
        && [[ -n $smi ]] && { echo "$smi"; return 0; }
    return 1
}

# Stops (exit 3) when apt's plan for these packages touches an NVIDIA driver package.
refuse_driver_changes() {
    local driver="$1"; shift
    local plan touched
    plan="$(apt-get -s install -y "$@" 2>&1)" || { say "apt-get -s install $* failed: $(tail -n 1 <<<"$plan"); $MANUAL"; exit 1; }
    touched="$(awk '$1 == "Inst" || $1 == "Remv" {sub(/:.*/, "", $2); print $2}' <<<"$plan" \
               | grep -E "$DRIVER_PACKAGES" | sort -u | paste -sd, - | sed 's/,/, /g' || true)"
    [[ -z $touched ]] && return 0
    say "not installing $*: apt would also install or replace NVIDIA driver packages ($touched) beside" \
        "the NVIDIA driver $driver this machine runs, which can break CUDA for everything on it;" \
        "install NVIDIA's own Nsight Systems package for driver $driver by hand" \
        "(https://developer.nvidia.com/nsight-systems: its .deb or .run brings no driver) and put nsys on PATH"
    exit 3
}

apt_install() {
    local driver
    if driver="$(driver_version)"; then
        say "NVIDIA driver $driver present: simulating the install first"
        refuse_driver_changes "$driver" "$@"
    fi
    "${SUDO[@]}" apt-get install -y "$@"
}

# Debian's packages that nsight-systems(-target) need and this machine lacks, except the
# driver: a dependency with any NVIDIA driver package among its alternatives is left out.
missing_dependencies() {
    local deb group
    for deb in "$@"; do dpkg-deb -f "$deb" Depends; done | tr ',' '\n' | while read -r group; do
        group="$(sed -E 's/\([^)]*\)//g; s/:any//g; s/[[:space:]]//g' <<<"$group")"
        [[ -z $group || $group == nsight-systems* ]] && continue
        tr '|' '\n' <<<"$group" | grep -qE "$DRIVER_PACKAGES" && continue
        group="${group%%|*}"
        [[ "$(dpkg-query -W -f='${db:Status-Status}' "$group" 2>/dev/null)" == installed ]] || echo "$group"
    done | sort -u
}

# No driver on this Debian machine: download and unpack nsys, never install a driver library.
private_install() {
    local work version dest deb deps plan touched
    work="$(mktemp -d -t nsys-install-XXXXXX)"
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/parts"
    local keyring=/usr/share/keyrings/debian-archive-keyring.gpg signed=""
    [[ -r $keyring ]] && signed="[signed-by=$keyring] "
    printf 'deb %shttp://deb.debian.org/debian %s contrib non-free\n' "$signed" "$VERSION_CODENAME" >"$work/sources.list"
    # A private apt state: the machine's sources and lists stay as they are. As root, apt
    # would hand the download to its _apt user, who cannot write into this folder.
    local apt=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/parts"
               -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
    say "no NVIDIA driver here: unpacking Debian's nsight-systems into $PRIVATE, without its libcuda1"
    apt-get "${apt[@]}" update >&2 || { say "apt-get update of contrib/non-free failed; $MANUAL"; exit 1; }
    (cd "$work" && apt-get "${apt[@]}" download nsight-systems nsight-systems-target >&2) \
        || { say "apt-get download nsight-systems failed; $MANUAL"; exit 1; }
    mapfile -t deps < <(missing_dependencies "$work"/*.deb)
    if [[ ${#deps[@]} -gt 0 ]]; then
        "${SUDO[@]}" apt-get update >&2
        plan="$(apt-get -s install -y --no-install-recommends "${deps[@]}" 2>&1)" \
            || { say "apt-get -s install ${deps[*]} failed: $(tail -n 1 <<<"$plan"); $MANUAL"; exit 1; }
        touched="$(awk '$1 == "Inst" {sub(/:.*/, "", $2); print $2}' <<<"$plan" | grep -E "$DRIVER_PACKAGES" \
                   | sort -u | paste -sd, - || true)"
        [[ -z $touched ]] || { say "not installing nsys's dependencies ${deps[*]}: apt would also install NVIDIA driver packages ($touched); $MANUAL"; exit 3; }
        "${SUDO[@]}" apt-get install -y --no-install-recommends "${deps[@]}" >&2
    fi
    version="$(dpkg-deb -f "$(ls "$work"/nsight-systems_*.deb)" Version | sed 's/~.*//')"
    dest="$PRIVATE/$version"
    "${SUDO[@]}" rm -rf "$dest.partial"
    "${SUDO[@]}" mkdir -p "$dest.partial"
    for deb in "$work"/*.deb; do "${SUDO[@]}" dpkg -x "$deb" "$dest.partial"; done
    # nsys looks for its importer under the multiarch path, as for the installed package.
    local multiarch="$dest.partial/usr/lib/x86_64-linux-gnu/nsight-systems"
    if [[ -d $multiarch && -d $dest.partial/usr/lib/nsight-systems/host-linux-x64 ]]; then
        "${SUDO[@]}" ln -sfn ../../nsight-systems/host-linux-x64 "$multiarch/host-linux-x64"
    fi
    # Links into the system's folders (host-linux-x64/libssh.so -> ../../x86_64-linux-gnu/
    # libssh.so.4) would point inside the private folder: point them at the system's file.
    local link target
    while read -r link; do
        target="$(readlink "$link")"
        [[ $target == /* ]] && continue
        target="$(realpath -m -s "/${link#"$dest.partial/"}/../$target")"
        [[ -e $ROOTFS$target ]] && "${SUDO[@]}" ln -sfn "$ROOTFS$target" "$link"
    done < <(find "$dest.partial" -type l ! -exec test -e {} \; -print)
    if find "$dest.partial" -name 'libcuda.so*' | grep -q .; then
        "${SUDO[@]}" rm -rf "$dest.partial"
        say "the unpacked nsight-systems holds a libcuda; not using it; $MANUAL"
        exit 1
    fi
    "${SUDO[@]}" rm -rf "$dest"
    "${SUDO[@]}" mv "$dest.partial" "$dest"
    rm -rf "$work"
    trap - EXIT
}

if [[ ${1:-} == --find ]]; then
    find_nsys
    exit
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    SUDO=(sudo)
fi

if ! driver_version >/dev/null \
        && [[ "$(dpkg-query -W -f='${db:Status-Status}' libcuda1 2>/dev/null)" == installed ]]; then
    say "WARNING: libcuda1 is installed but no NVIDIA driver runs here, so torch warns in every process" \
        "that the driver is too old (an earlier install_nsys.sh brought it with Debian's nsight-systems);" \
        "remove it with: apt-get purge libcuda1 nsight-systems nsight-systems-target, then run this script again"
fi
if found="$(find_nsys)"; then
    use_nsys "$found"
    exit 0
fi
if [[ ${#SUDO[@]} -gt 0 ]] && ! command -v sudo >/dev/null 2>&1; then
    say "not root and no sudo; $MANUAL"
    exit 1
fi

# shellcheck disable=SC1091
[[ -r $ROOTFS/etc/os-release ]] && . "$ROOTFS/etc/os-release"
case "${ID:-}" in
    debian)
        if ! driver_version >/dev/null; then
            [[ -n ${VERSION_CODENAME:-} ]] || { say "no VERSION_CODENAME in /etc/os-release; $MANUAL"; exit 1; }
            private_install
            found="$(find_nsys)" || { say "unpacked, but no working nsys under $PRIVATE; $MANUAL"; exit 1; }
            use_nsys "$found"
            exit 0
        fi
        sources=$ROOTFS/etc/apt/sources.list.d/debian-nonfree.sources
        added=""
        # Skip when non-free is already configured: apt warns about duplicate sources.
        if ! grep -rqsE '^[^#]*[[:space:]]non-free([[:space:]]|$)' "$ROOTFS/etc/apt/sources.list" "$ROOTFS/etc/apt/sources.list.d/"; then
            [[ -n ${VERSION_CODENAME:-} ]] || { say "no VERSION_CODENAME in /etc/os-release; $MANUAL"; exit 1; }
            say "adding contrib/non-free for $VERSION_CODENAME in $sources"
            printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: ${VERSION_CODENAME}" \
                "Components: contrib non-free" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
                | "${SUDO[@]}" tee "$sources" >/dev/null
            added=$sources
        fi
        "${SUDO[@]}" apt-get update
        # A refused install leaves the apt sources as they were.
        trap 'if [[ -n $added ]]; then "${SUDO[@]}" rm -f "$added"; fi' EXIT
        apt_install nsight-systems
        trap - EXIT
        # Debian's package looks for its importer under the multiarch path; without this
        # link nsys profile cannot turn the capture into an .nsys-rep.
        host=$ROOTFS/usr/lib/nsight-systems/host-linux-x64
        link=$ROOTFS/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64
        if [[ -d $host && -d $(dirname "$link") && ! -e $link ]]; then
            "${SUDO[@]}" ln -s "$host" "$link"
        fi
        ;;
    ubuntu)
        "${SUDO[@]}" apt-get update
        package="$(apt-cache search --names-only '^nsight-systems(-cli)?(-[0-9.]+)?$' \
                   | awk '{print $1}' | sort -V | tail -n 1)"
        [[ -n $package ]] || { say "no nsight-systems package in the configured apt sources; $MANUAL"; exit 1; }
        apt_install "$package"
        ;;
    *)
        say "no automatic install for ${PRETTY_NAME:-this system}; $MANUAL"
        exit 1
        ;;
esac

found="$(find_nsys)" || { say "installed, but no nsys was found afterwards; $MANUAL"; exit 1; }
use_nsys "$found"
