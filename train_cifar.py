#!/usr/bin/env python3
"""Train a CNN on CIFAR-10 with DataParallel (dp), DDP (ddp), DDP + DALI (ddp_dali),
FSDP (fsdp) or a pipeline of model slices (pp).

This file only parses, validates and dispatches; each mode lives in handler/ (see handler/modes.py).
"""
import sys

from handler.runtime.devices import mode_in, require_imports
from handler.runtime.errors import one_line_errors

if __name__ == "__main__":  # before the imports below load torch: one line per module this Python lacks
    with one_line_errors():
        require_imports(mode_in(sys.argv[1:]))

from handler.DDP.utils import elastic_restart_count, launched_by_torchrun  # noqa: E402
from handler.modes import parse_config, preflight, run_mode  # noqa: E402
from handler.runtime.devices import cuda_status, require_usable_gpus  # noqa: E402
from handler.runtime.umask import apply_user_umask, say_started  # noqa: E402


def main(argv=None) -> int:
    with one_line_errors():
        say_started()  # launch.sh: nsys started the program
        apply_user_umask()  # before anything is written: nsys starts us with umask 000
        require_usable_gpus()  # GPUs this torch cannot use: stop, never train on the CPU instead
        cfg = parse_config(argv)
        note = cuda_status()[1]
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)
        cfg = preflight(cfg, spawning=not launched_by_torchrun(), restarted=elastic_restart_count() > 0)
        run_mode(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
