"""Which torch and DALI builds match this machine's NVIDIA driver and GPUs.

Standard library only: scripts/setup.sh runs it with the system python3 before any
virtual environment exists, and handler/runtime/devices.py uses it to name the fix when
torch cannot use the machine's GPUs.

    python3 handler/runtime/cuda_build.py    # prints TORCH_INDEX_URL=..., TORCH_PINS=..., DALI_PACKAGE=..., REASON=...
"""
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Optional, Tuple

DALI_VERSION = "2.4.0"
TORCH_PINS = "torch==2.14.1 torchvision==0.29.1"  # as in requirements.txt (a test keeps them equal)
CU12_INDEX = "https://download.pytorch.org/whl/cu126"
SMI_TIMEOUT_S = 10
CUDA13_MIN_CAPABILITY = (7, 5)  # Turing: the oldest GPU that torch's CUDA 13 builds run on


@dataclass(frozen=True)
class Build:
    torch_index_url: Optional[str]  # None: PyPI's default torch (a CUDA 13 build)
    dali_package: str
    reason: str


def _smi(*args: str, smi: str = "nvidia-smi") -> str:
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def smi_gpu_list(smi: str = "nvidia-smi") -> str:
    """`nvidia-smi -L`: a line per GPU ("GPU 0: <name> (UUID: GPU-...)"), then its MIG devices."""
    return _smi("-L", smi=smi)


def smi_gpu_count(smi: str = "nvidia-smi") -> int:
    """GPUs the driver lists (all of them: nvidia-smi ignores CUDA_VISIBLE_DEVICES)."""
    return sum(line.startswith("GPU ") for line in smi_gpu_list(smi).splitlines())


def driver_cuda_version(smi: str = "nvidia-smi") -> Optional[Tuple[int, int]]:
    """The newest CUDA this driver runs ("CUDA Version: 12.4" in nvidia-smi's header),
    or None without a working nvidia-smi or without GPUs."""
    if not smi_gpu_count(smi):
        return None
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", _smi(smi=smi))
    return (int(found.group(1)), int(found.group(2))) if found else None


def smi_compute_capability(smi: str = "nvidia-smi") -> Optional[Tuple[int, int]]:
    """The lowest compute capability among the GPUs the driver lists ("7.0" for a V100), or
    None where nvidia-smi cannot say (drivers before 510 lack the compute_cap field)."""
    found = re.findall(r"^\s*(\d+)\.(\d+)\s*$", _smi("--query-gpu=compute_cap", "--format=csv,noheader", smi=smi),
                       re.MULTILINE)
    return min((int(major), int(minor)) for major, minor in found) if found else None


def choose_build(driver: Optional[Tuple[int, int]], override_url: Optional[str] = None,
                 capability: Optional[Tuple[int, int]] = None) -> Build:
    """The builds for a driver that runs CUDA `driver` and GPUs whose lowest compute
    capability is `capability` (None: unknown, taken as new enough)."""
    if driver is None:
        build = Build(None, f"nvidia-dali-cuda120=={DALI_VERSION}", "no NVIDIA GPU: PyPI's torch (runs on the CPU)")
    elif driver[0] >= 13 and capability is not None and capability < CUDA13_MIN_CAPABILITY:
        # A CUDA 13 driver (R580) runs older GPUs too, but torch's CUDA 13 builds carry
        # kernels for 7.5 and newer only (CUDA 13 cannot build for Maxwell, Pascal or Volta):
        # training would die with "no kernel image is available". The cu126 builds carry them,
        # and torch 2.14 is the last release that publishes cu126 wheels: torch 2.15 drops
        # them. A TORCH_PINS bump past 2.14 leaves these GPUs without a build, and this branch
        # must then refuse them in one line instead.
        build = Build(CU12_INDEX, f"nvidia-dali-cuda120=={DALI_VERSION}",
                      f"CUDA {driver[0]}.{driver[1]} driver, but compute capability {capability[0]}.{capability[1]} "
                      "is below the 7.5 that CUDA 13 builds need: torch from PyTorch's cu126 index")
    elif driver[0] >= 13:
        build = Build(None, f"nvidia-dali-cuda130=={DALI_VERSION}",
                      f"CUDA {driver[0]}.{driver[1]} driver: PyPI's torch (a CUDA 13 build)")
    elif driver[0] == 12:
        # CUDA's minor-version compatibility: a cu126 build runs on every 12.x driver.
        build = Build(CU12_INDEX, f"nvidia-dali-cuda120=={DALI_VERSION}",
                      f"CUDA {driver[0]}.{driver[1]} driver: torch from PyTorch's cu126 index")
    else:
        build = Build(None, f"nvidia-dali-cuda120=={DALI_VERSION}",
                      f"CUDA {driver[0]}.{driver[1]} driver is older than CUDA 12, which torch 2.6+ needs: "
                      "update the NVIDIA driver (or hide the GPUs with CUDA_VISIBLE_DEVICES=)")
    if override_url:
        build = Build(override_url, build.dali_package, f"{build.reason}; torch index from TORCH_INDEX_URL")
    return build


def install_hint(driver: Optional[Tuple[int, int]]) -> str:
    """The pip command that installs the build matching `driver`."""
    build = choose_build(driver, os.environ.get("TORCH_INDEX_URL"), smi_compute_capability())
    index = f" --index-url {build.torch_index_url}" if build.torch_index_url else ""
    return (f"pip install --force-reinstall {TORCH_PINS}{index} && pip install {build.dali_package} "
            "(scripts/setup.sh does this)")


def dali_install_hint() -> str:
    """The one DALI install hint (a missing DALI in --mode ddp_dali, scripts/gpu_check.py): the
    build for this machine's driver, as scripts/setup.sh would choose it."""
    package = choose_build(driver_cuda_version(), capability=smi_compute_capability()).dali_package
    return f"pip install {package} (the build for this machine's NVIDIA driver; scripts/setup.sh installs it)"


def main() -> int:
    driver = driver_cuda_version()
    build = choose_build(driver, os.environ.get("TORCH_INDEX_URL"), smi_compute_capability() if driver else None)
    print(f"TORCH_INDEX_URL={shlex.quote(build.torch_index_url or '')}")
    print(f"TORCH_PINS={shlex.quote(TORCH_PINS)}")
    print(f"DALI_PACKAGE={shlex.quote(build.dali_package)}")
    print(f"REASON={shlex.quote(build.reason)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
