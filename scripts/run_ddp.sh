#!/usr/bin/env bash
# The course kit's run flow for --mode ddp: runs on 1 and 2 GPUs (scripts/lab_runs.sh; docs/LAB.md);
# arguments go on to train_cifar.py, e.g. --epochs 1.
exec bash "$(dirname "${BASH_SOURCE[0]}")/lab_runs.sh" ddp "$@"
