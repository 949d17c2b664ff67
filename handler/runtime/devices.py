"""What accelerators this process can use, asked once; the one place that counts GPUs.

`python -m handler.runtime.devices [MODE]` prints the usable GPU count for scripts/launch.sh (so
the shell never counts with nvidia-smi, which ignores CUDA_VISIBLE_DEVICES), or stops
in one line when the machine has GPUs that this torch build cannot use, and, first, in one
line per module the trainer needs that this Python cannot import (`import_problems`).
"""
import functools
import importlib.util
import os
import sys
import warnings
from typing import List, Optional, Sequence, Tuple

from .cuda_build import gpus_hidden
from .errors import UserError, need, one_line_errors


# What train_cifar.py imports beyond the standard library (module: its pip package); DALI only for
# --mode ddp_dali. Looked up without importing them: a Python without torch is told in one line
# per module, before anything imports torch (train_cifar.py, launch.sh, scripts/gpu_check.py).
TRAINER_NEEDS = {"torch": "torch", "torchvision": "torchvision", "numpy": "numpy", "tqdm": "tqdm", "PIL": "pillow"}
DALI_MODULE = "nvidia.dali"


def module_present(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # nvidia.dali: the namespace package may exist without dali
        return False


def import_problems(mode: str = "") -> List[str]:
    """One line per module the trainer (in `mode`) needs and this Python cannot import."""
    lines = [f"{sys.executable} cannot import {module}, which train_cifar.py needs: pip install {package} "
             "(scripts/setup.sh makes .venv with everything), or run it with a Python that has it (PYTHON= for "
             "scripts/launch.sh)" for module, package in TRAINER_NEEDS.items() if not module_present(module)]
    if mode == "ddp_dali" and not module_present(DALI_MODULE):
        from .cuda_build import dali_install_hint
        lines.append(f"{sys.executable} cannot import {DALI_MODULE}, which --mode ddp_dali needs: "
                     f"{dali_install_hint()}")
    return lines


def mode_in(argv: Sequence[str], default: str = "ddp") -> str:
    """The --mode that argparse will read from `argv` (its last one)."""
    mode = default
    for i, arg in enumerate(argv):
        if arg == "--mode" and i + 1 < len(argv):
            mode = argv[i + 1]
        elif arg.startswith("--mode="):
            mode = arg.split("=", 1)[1]
    return mode


def require_imports(mode: str) -> None:
    """Stop, one line per module this Python lacks, before anything imports torch."""
    problems = import_problems(mode)
    if problems:
        raise UserError("\n".join(problems))


def repeated_visible_device(variable: Optional[str]) -> str:
    """The CUDA_VISIBLE_DEVICES entry named twice, or "": CUDA then sees no GPU at all. Entries
    count up to the first negative one (CUDA stops reading there); 0 and 00 are one GPU."""
    seen = set()
    for entry in (variable or "").split(","):
        entry = entry.strip()
        if entry.startswith("-"):
            break
        key = str(int(entry)) if entry.isdigit() else entry
        if key and key in seen:
            return entry
        seen.add(key)
    return ""


def repeated_devices_problem() -> str:
    """The one line for a GPU named twice in this process's CUDA_VISIBLE_DEVICES, else ""."""
    variable = os.environ.get("CUDA_VISIBLE_DEVICES")
    repeat = repeated_visible_device(variable)
    return (f"CUDA_VISIBLE_DEVICES={variable} names GPU {repeat} twice, and CUDA then sees no GPU at all; list each "
            "GPU once (e.g. CUDA_VISIBLE_DEVICES=0,1)") if repeat else ""


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
    repeat = repeated_devices_problem()
    need(not repeat, repeat)
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
    driver = driver_cuda_version()
    if driver is None:  # listed, yet no CUDA version: the driver's fault, not the torch build's
        from .cuda_build import LISTED_FIX, header_problem
        problem = header_problem() or "nvidia-smi -L lists the GPUs but plain nvidia-smi shows no CUDA version"
        raise UserError(f"{problem}{LISTED_FIX}; torch sees no GPU until then (or run on the CPU on purpose with "
                        "CUDA_VISIBLE_DEVICES=)")
    import torch
    driver_text = f"a CUDA {driver[0]}.{driver[1]} driver"
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU build)"
    raise UserError(f"nvidia-smi lists {listed} GPU(s) with {driver_text}, but torch {torch.__version__} is built "
                    f"for {build} and cannot use them; install the matching build: {install_hint(driver)} "
                    "(or run on the CPU on purpose with CUDA_VISIBLE_DEVICES=)")


if __name__ == "__main__":
    with one_line_errors():
        require_imports(sys.argv[1] if len(sys.argv) > 1 else "")
        print(require_usable_gpus())
    sys.exit(0)
