"""What accelerators this process can use, asked once; the one place that counts GPUs.

`python -m handler.runtime.devices` prints the usable GPU count for scripts/launch.sh (so
the shell never counts with nvidia-smi, which ignores CUDA_VISIBLE_DEVICES), or stops
in one line when the machine has GPUs that this torch build cannot use.
"""
import functools
import os
import sys
import warnings
from typing import Tuple

from .cuda_build import gpus_hidden
from .errors import UserError, one_line_errors


@functools.lru_cache(maxsize=None)
def cuda_status() -> Tuple[int, str]:
    """(usable GPU count, why CUDA is unusable or ""). torch's own warning about a
    broken driver becomes our one-line note instead of a wall of text."""
    import torch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count:
        return count, ""  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[ddp]
    reason = next((str(w.message).split(". ")[0] for w in caught), "")
    return 0, f"CUDA not usable ({reason}); running on CPU" if reason else ""


def unknown_visible_device(variable, smi_listing: str) -> str:
    """The CUDA_VISIBLE_DEVICES entry that hides every GPU, or "". CUDA reads the list up to
    its first entry that names no device, so a wrong first entry leaves none visible. An
    entry is an index or a (prefix of a) GPU-/MIG- UUID from `nvidia-smi -L`."""
    if variable is None or variable.strip() in ("", "-1"):
        return ""
    first = variable.split(",")[0].strip()
    indices = [line for line in smi_listing.splitlines() if line.startswith("GPU ")]
    if first.isdigit():
        return "" if int(first) < len(indices) else first
    uuids = [part.split(")")[0].strip() for part in smi_listing.split("UUID:")[1:]]
    return "" if first and any(uuid.startswith(first) for uuid in uuids) else first


def require_usable_gpus() -> int:
    """The usable GPU count; a machine whose NVIDIA GPUs this torch cannot use stops
    here, instead of training for hours on the CPU with GPU defaults."""
    if gpus_hidden():
        return 0  # torch would see none; asking it costs a 1.5 s import for launch.sh
    count = cuda_status()[0]
    if count:
        return count  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_end_to_end_on_one_gpu[ddp]
    from .cuda_build import ask_smi, driver_cuda_version, install_hint
    smi = ask_smi()
    if smi.problem:
        raise UserError(f"{smi.broken_driver}; torch sees no GPU until then (or run on the CPU on purpose with "
                        "CUDA_VISIBLE_DEVICES=)")
    listed = smi.gpus
    if not listed:
        return 0
    wrong = unknown_visible_device(os.environ.get("CUDA_VISIBLE_DEVICES"), smi.listing)
    if wrong:
        indices = "0" if listed == 1 else f"0-{listed - 1}"
        raise UserError(f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']} hides every GPU: {wrong!r} is none "
                        f"of the {listed} that nvidia-smi -L lists (index {indices} or its UUID), so torch sees "
                        "none; name one of them, or unset CUDA_VISIBLE_DEVICES")
    import torch
    driver = driver_cuda_version()
    driver_text = f"a CUDA {driver[0]}.{driver[1]} driver" if driver else "a driver whose CUDA version nvidia-smi did not report"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU build)"
    raise UserError(f"nvidia-smi lists {listed} GPU(s) with {driver_text}, but torch {torch.__version__} is built "
                    f"for {build} and cannot use them; install the matching build: {install_hint(driver)} "
                    "(or run on the CPU on purpose with CUDA_VISIBLE_DEVICES=)")


if __name__ == "__main__":
    with one_line_errors():
        print(require_usable_gpus())
    sys.exit(0)
