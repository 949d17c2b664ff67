#!/usr/bin/env bash
# One node's task of a profiled job (scripts/slurm/train.sbatch, PROFILE=1):
#
#   nsys_node.sh nsys profile OPTIONS... PROGRAM ARGS...
#
# nsys 2022.4 at times fails its own session before it starts the program ('Local Endpoint is
# not available', or only 'End of file'; docs/FAILURES.md). The program touches HARNESS_STARTED
# first thing (handler/runtime/torchrun.py): without it nothing ran on this node, so nsys runs
# once more, said in one line, rather than srun's --kill-on-bad-exit ending every node's job
# for it. Not after a stop signal: Slurm's SIGTERM (scancel) and Ctrl-C reach nsys itself, and
# this shell waits for nsys's report and exits with nsys's status.
set -u
stopped=""
trap 'stopped=1' TERM INT
marker_dir="$(mktemp -d -t nsys-node-XXXXXX 2>/dev/null)" || {
    echo "train.sbatch: cannot make a folder in TMPDIR=${TMPDIR:-/tmp} on $(hostname); point TMPDIR at a writable folder" >&2
    exit 2
}
trap 'rm -rf "$marker_dir"' EXIT
export HARNESS_STARTED="$marker_dir/started"
"$@"
status=$?
if [[ -z $stopped && $status -lt 128 && ! -e $HARNESS_STARTED ]]; then
    echo "train.sbatch: $1 on $(hostname) exited $status before the training started (its message is above);" \
         "trying once more" >&2
    "$@"
    status=$?
    [[ $status == 0 && ! -e $HARNESS_STARTED ]] && status=1  # no program ran: never a success
fi
exit "$status"
