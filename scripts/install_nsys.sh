#!/usr/bin/env bash
# Install Nsight Systems (nsys) for scripts/launch.sh and the profiling tests.
# Idempotent: returns at once when nsys already runs.
#   Debian: the nsight-systems package from contrib/non-free.
#   Ubuntu: nsight-systems(-cli) from NVIDIA's CUDA apt repository, when it is configured.
#   Elsewhere: says where to download it and fails.
set -euo pipefail

say() { echo "install_nsys: $*" >&2; }
MANUAL="get Nsight Systems from https://developer.nvidia.com/nsight-systems (or a CUDA repo) and put nsys on PATH"

if nsys --version >/dev/null 2>&1; then
    nsys --version
    exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { say "not root and no sudo; $MANUAL"; exit 1; }
    SUDO=(sudo)
fi

# shellcheck disable=SC1091
[[ -r /etc/os-release ]] && . /etc/os-release
case "${ID:-}" in
    debian)
        sources=/etc/apt/sources.list.d/debian-nonfree.sources
        # Skip when non-free is already configured: apt warns about duplicate sources.
        if ! grep -rqsE '^[^#]*[[:space:]]non-free([[:space:]]|$)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
            [[ -n ${VERSION_CODENAME:-} ]] || { say "no VERSION_CODENAME in /etc/os-release; $MANUAL"; exit 1; }
            say "adding contrib/non-free for $VERSION_CODENAME in $sources"
            printf '%s\n' "Types: deb" "URIs: http://deb.debian.org/debian" "Suites: ${VERSION_CODENAME}" \
                "Components: contrib non-free" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" \
                | "${SUDO[@]}" tee "$sources" >/dev/null
        fi
        "${SUDO[@]}" apt-get update
        "${SUDO[@]}" apt-get install -y nsight-systems
        # Debian's package looks for its importer under the multiarch path; without this
        # link nsys profile cannot turn the capture into an .nsys-rep.
        host=/usr/lib/nsight-systems/host-linux-x64
        link=/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64
        if [[ -d $host && -d $(dirname "$link") && ! -e $link ]]; then
            "${SUDO[@]}" ln -s "$host" "$link"
        fi
        ;;
    ubuntu)
        "${SUDO[@]}" apt-get update
        package="$(apt-cache search --names-only '^nsight-systems(-cli)?(-[0-9.]+)?$' \
                   | awk '{print $1}' | sort -V | tail -n 1)"
        [[ -n $package ]] || { say "no nsight-systems package in the configured apt sources; $MANUAL"; exit 1; }
        "${SUDO[@]}" apt-get install -y "$package"
        ;;
    *)
        say "no automatic install for ${PRETTY_NAME:-this system}; $MANUAL"
        exit 1
        ;;
esac

if ! command -v nsys >/dev/null 2>&1; then
    # NVIDIA's packages install under /opt/nvidia/nsight-systems*/bin without touching PATH.
    found="$(ls -d /opt/nvidia/nsight-systems*/*/bin /opt/nvidia/nsight-systems*/bin 2>/dev/null \
             | sort -V | tail -n 1 || true)"
    [[ -n $found && -x $found/nsys ]] || { say "installed, but nsys is not on PATH; $MANUAL"; exit 1; }
    "${SUDO[@]}" ln -sf "$found/nsys" /usr/local/bin/nsys
fi
nsys --version
