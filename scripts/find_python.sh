# Which Python runs the harness when PYTHON is not given, in one place for scripts/gpu_check.sh
# and the run flow (scripts/launch.sh, scripts/lab_runs.sh, scripts/run_<mode>.sh).
# Sourced, with ROOT set to the checkout. docs/LAB.md "On a machine without internet",
# docs/GPU_CHECK.md.
#
# Online, .venv through scripts/setup.sh. Without a package index (a cluster's compute node, a
# GPU box with torch preinstalled) pip would retry for minutes, so the first Python that
# imports torch is taken instead, installing nothing.

index_wait_s="${GPU_CHECK_INDEX_WAIT_S:-5}"
torch_candidates="${VIRTUAL_ENV:+\$VIRTUAL_ENV/bin/python, }.venv/bin/python, python3, python"

# Whether pip's index (PIP_INDEX_URL, else PyPI's; GPU_CHECK_INDEX_URL overrides) answers in time.
index_answers() {
    local url="${GPU_CHECK_INDEX_URL:-${PIP_INDEX_URL:-https://pypi.org/simple/}}"
    command -v python3 >/dev/null 2>&1 || return 1
    timeout "$((index_wait_s + 1))" python3 -c 'import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])).close()' "$url" "$index_wait_s" >/dev/null 2>&1
}

# The first Python that imports torch (an active virtual environment, .venv, python3, python)
# and its torch version, on two lines.
python_with_torch() {
    local candidate version
    for candidate in ${VIRTUAL_ENV:+"$VIRTUAL_ENV/bin/python"} "$ROOT/.venv/bin/python" python3 python; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if version="$("$candidate" -c 'import torch; print(torch.__version__)' 2>/dev/null)"; then
            command -v "$candidate"
            echo "$version"
            return 0
        fi
    done
    return 1
}

# The run flow's Python, into PYTHON; its lines start with "$1: ". A complete .venv is used as
# it is, asking no index (setup.sh would install nothing). Otherwise, with an index, setup.sh
# makes .venv; without one, the first Python with torch. Returns 2 when none is found offline.
choose_run_python() {
    local who="$1" plan found
    if plan="$(SETUP_DRY_RUN=1 SETUP_KEEP_BUILD=1 bash "$ROOT/scripts/setup.sh" 2>/dev/null)"; then
        if [[ $plan != *"setup: would run"* ]]; then
            PYTHON="$ROOT/.venv/bin/python"
            return 0
        fi
        if ! index_answers; then
            found="$(python_with_torch)" || {
                echo "$who: no package index answered within $index_wait_s s and no Python with torch was found" \
                     "(tried $torch_candidates); set PYTHON=/path/to/python (one with torch), or connect to a package index" >&2
                return 2
            }
            PYTHON="$(sed -n 1p <<<"$found")"
            echo "$who: no package index answered within $index_wait_s s: using $PYTHON" \
                 "(torch $(sed -n 2p <<<"$found")); installing nothing (PYTHON= names another)" >&2
            return 0
        fi
    fi
    # First use creates .venv. An existing .venv keeps its builds: a driver they do not fit
    # stops later in one line naming the fix (handler/runtime/devices.py).
    # setup.sh's exit 2 is its own one line (a broken driver, no build that fits, no room on disk): nothing to add.
    local code=0
    SETUP_KEEP_BUILD=1 bash "$ROOT/scripts/setup.sh" >&2 || code=$?
    if [ "$code" != 0 ]; then
        [ "$code" = 2 ] || echo "$who: set-up failed; see the pip output above" >&2
        return 2
    fi
    PYTHON="$ROOT/.venv/bin/python"
}
