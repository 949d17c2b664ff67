"""Which torch and DALI builds match this machine's NVIDIA driver and GPUs.

Standard library only: scripts/setup.sh runs it with the system python3 before any
virtual environment exists, and handler/runtime/devices.py uses it to name the fix when
torch cannot use the machine's GPUs.

    python3 handler/runtime/cuda_build.py    # prints TORCH_INDEX_URL=..., TORCH_PINS=..., DALI_PACKAGE=..., REASON=...
                                             # or, where no build fits, one line and exit 2
"""
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import List, Optional, Tuple

DALI_VERSION = "2.4.0"
TORCH_PINS = "torch==2.14.1 torchvision==0.29.1"  # as in requirements.txt (a test keeps them equal)
CU12_INDEX = "https://download.pytorch.org/whl/cu126"
CU128_INDEX = "https://download.pytorch.org/whl/cu128"
SMI_TIMEOUT_S = 10
DRIVER_FIX = (": the driver is installed but not working; reboot (a kernel or driver update without a reboot "
              "does this), or reload its kernel module, or reinstall the NVIDIA driver for the running kernel")
LISTED_FIX = (": the NVIDIA driver lists the GPUs but does not work; reboot, or reinstall the NVIDIA driver (with its "
              "CUDA library), until plain nvidia-smi shows the GPUs and a CUDA version")
CUDA13_MIN_CAPABILITY = (7, 5)  # Turing: the oldest GPU that torch's CUDA 13 builds run on
Capability = Tuple[int, int]


@dataclass(frozen=True)
class TorchBuild:
    name: str
    index_url: Optional[str]  # None: PyPI's default torch
    min_driver: Capability  # the oldest driver CUDA version it runs on
    kernels: Tuple[Capability, ...]  # the architectures it carries kernels for
    dali_package: str


_DALI12, _DALI13 = f"nvidia-dali-cuda120=={DALI_VERSION}", f"nvidia-dali-cuda130=={DALI_VERSION}"
# torch 2.14's builds, oldest CUDA first. cu126 runs on every 12.x driver (CUDA's minor-version
# compatibility) and keeps Maxwell to Volta, but stops at sm_90. cu128 adds Blackwell (sm_100
# B200, sm_120 RTX 50xx), whose drivers are R570 (CUDA 12.8) or newer; Volta is counted as
# cu126's, the build that certainly has it. PyPI's default is a CUDA 13 build: 7.5 and newer
# (CUDA 13 cannot build for Maxwell, Pascal or Volta). torch 2.14 is the last release with cu126
# wheels: a TORCH_PINS bump past 2.14 leaves GPUs below 7.5 without a build, refused in one line.
BUILDS = (
    TorchBuild("cu126", CU12_INDEX, (12, 0), ((5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)), _DALI12),
    TorchBuild("cu128", CU128_INDEX, (12, 8), ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (12, 0)), _DALI12),
    TorchBuild("PyPI's default (CUDA 13)", None, (13, 0),
               ((7, 5), (8, 0), (8, 6), (9, 0), (10, 0), (11, 0), (12, 0)), _DALI13),
)


def has_kernels(build: TorchBuild, capability: Capability) -> bool:
    """A kernel built for sm_XY runs on every GPU of major X and minor Y or above (sm_86 on 8.9)."""
    return any(major == capability[0] and minor <= capability[1] for major, minor in build.kernels)


@dataclass(frozen=True)
class Build:
    torch_index_url: Optional[str]  # None: PyPI's default torch (a CUDA 13 build)
    dali_package: str
    reason: str
    ok: bool = True  # False: no build fits; `reason` is the one line that says why


def _smi(*args: str, smi: str = "nvidia-smi") -> str:
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


@dataclass(frozen=True)
class SmiAnswer:
    """`nvidia-smi -L`, classified. `problem` (else "") names a driver that is installed but
    unreachable, with nvidia-smi's own message; only without one does an empty `listing` mean
    no NVIDIA GPU."""
    listing: str
    problem: str = ""

    @property
    def gpus(self) -> int:
        return sum(line.startswith("GPU ") for line in self.listing.splitlines())

    @property
    def broken_driver(self) -> str:
        """The problem and its fix, for a one-line error; "" where the driver answers."""
        return f"{self.problem}{DRIVER_FIX}" if self.problem else ""


def nvidia_gpu_on_bus() -> bool:
    """An NVIDIA display or 3D controller (vendor 0x10de, class 0x03xx) on the PCI bus, or the
    driver's /proc entry. HARNESS_SYSROOT (empty) prefixes both paths, as install_nsys.sh's
    NSYS_INSTALL_SYSROOT does: the tests point it at a fake machine."""
    root = os.environ.get("HARNESS_SYSROOT", "")
    if os.path.exists(f"{root}/proc/driver/nvidia/version"):
        return True
    devices = f"{root}/sys/bus/pci/devices"
    for name in os.listdir(devices) if os.path.isdir(devices) else []:
        try:
            with open(f"{devices}/{name}/vendor") as vendor, open(f"{devices}/{name}/class") as kind:
                if vendor.read().strip() == "0x10de" and kind.read().strip().startswith("0x03"):
                    return True
        except OSError:
            continue
    return False


def ask_smi(smi: str = "nvidia-smi") -> SmiAnswer:
    """Ask nvidia-smi for its GPUs and classify the outcome: listed GPUs; none (no nvidia-smi, an
    empty list, or Debian's nvidia-smi on a machine without an NVIDIA GPU); or a broken driver
    (a hung nvidia-smi, a library/driver mismatch, or a failure beside an NVIDIA GPU on the bus)."""
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except OSError:
        return SmiAnswer("")
    except subprocess.TimeoutExpired:
        return SmiAnswer("", f"nvidia-smi did not answer within {SMI_TIMEOUT_S} s (the NVIDIA driver is hung)")
    if done.returncode == 0:
        return SmiAnswer(done.stdout)
    said = next((line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()), "no message")
    if "driver/library version mismatch" in said.lower() or nvidia_gpu_on_bus():
        return SmiAnswer("", f'nvidia-smi cannot reach the NVIDIA driver ("{said}", exit {done.returncode})')
    return SmiAnswer("")


def header_problem(smi: str = "nvidia-smi") -> str:
    """Beside GPUs that `nvidia-smi -L` lists: "" where plain nvidia-smi reports the driver's CUDA
    version, else what it did instead, in its own words (an NVML error, no CUDA version)."""
    try:
        done = subprocess.run([smi], capture_output=True, text=True, timeout=SMI_TIMEOUT_S)
    except OSError as err:
        return f"nvidia-smi -L lists the GPUs but plain nvidia-smi cannot run ({err.strerror})"
    except subprocess.TimeoutExpired:
        return f"nvidia-smi -L lists the GPUs but plain nvidia-smi did not answer within {SMI_TIMEOUT_S} s"
    said = next((line.strip() for line in (done.stdout + done.stderr).splitlines() if line.strip()), "no message")
    if done.returncode != 0:
        return f'nvidia-smi -L lists the GPUs but plain nvidia-smi failed ("{said}", exit {done.returncode})'
    if not re.search(r"CUDA Version:\s*\d+\.\d+", done.stdout):
        shown = re.search(r"CUDA Version:\s*(\S+)", done.stdout)
        return ("nvidia-smi -L lists the GPUs but plain nvidia-smi shows no CUDA version"
                + (f" (CUDA Version: {shown.group(1)})" if shown else ""))
    return ""


def gpus_hidden() -> bool:
    """CUDA_VISIBLE_DEVICES set to nothing: the explicit way to run on the CPU."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() in ("", "-1")


def smi_gpu_count(smi: str = "nvidia-smi") -> int:
    """GPUs the driver lists (all of them: nvidia-smi ignores CUDA_VISIBLE_DEVICES)."""
    return ask_smi(smi).gpus


def driver_cuda_version(smi: str = "nvidia-smi") -> Optional[Capability]:
    """The newest CUDA this driver runs ("CUDA Version: 12.4" in nvidia-smi's header),
    or None without a working nvidia-smi or without GPUs."""
    if not smi_gpu_count(smi):
        return None
    found = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", _smi(smi=smi))
    return (int(found.group(1)), int(found.group(2))) if found else None


def smi_compute_capabilities(smi: str = "nvidia-smi") -> Optional[Tuple[Capability, Capability]]:
    """The lowest and the highest compute capability among the GPUs the driver lists ((7, 0) for
    a V100), or None where nvidia-smi cannot say (drivers before 510 lack the compute_cap field)."""
    found = re.findall(r"^\s*(\d+)\.(\d+)\s*$", _smi("--query-gpu=compute_cap", "--format=csv,noheader", smi=smi),
                       re.MULTILINE)
    caps = [(int(major), int(minor)) for major, minor in found]
    return (min(caps), max(caps)) if caps else None


def smi_compute_capability(smi: str = "nvidia-smi") -> Optional[Capability]:
    """The lowest compute capability among the GPUs the driver lists, or None (as above)."""
    caps = smi_compute_capabilities(smi)
    return caps[0] if caps else None


def smi_gpu_rows(smi: str = "nvidia-smi") -> List[Tuple[str, str, str, str]]:
    """Each listed GPU's (index, UUID, PCI bus id, compute mode), e.g. ("0", "GPU-5f2c...",
    "00000000:17:00.0", "Exclusive_Process"); [] where nvidia-smi cannot say. Like -L, it lists
    every GPU, whatever CUDA_VISIBLE_DEVICES says (handler/runtime/compute_modes.py maps them)."""
    answer = _smi("--query-gpu=index,uuid,pci.bus_id,compute_mode", "--format=csv,noheader", smi=smi)
    rows = [tuple(field.strip() for field in line.split(",")) for line in answer.splitlines()]
    return [(row[0], row[1], row[2], row[3]) for row in rows if len(row) == 4]


def _text(version: Capability) -> str:
    return f"{version[0]}.{version[1]}"


def choose_build(driver: Optional[Capability], override_url: Optional[str] = None,
                 capability: Optional[Capability] = None, highest: Optional[Capability] = None,
                 no_gpu: str = "no NVIDIA GPU") -> Build:
    """The builds for a driver that runs CUDA `driver` and GPUs whose lowest compute capability
    is `capability` and highest `highest` (None: unknown, taken as new enough and as the lowest).
    PyPI's default where it fits all three; else the oldest build with kernels for both. `no_gpu`
    says why there is no driver to fit."""
    if driver is None:
        return Build(override_url, _DALI12, f"{no_gpu}: PyPI's torch (runs on the CPU)"
                     + ("; torch index from TORCH_INDEX_URL" if override_url else ""))
    if driver[0] < 12:
        build = Build(None, _DALI12, f"CUDA {_text(driver)} driver is older than CUDA 12, which torch 2.6+ needs: "
                                     "update the NVIDIA driver (or hide the GPUs with CUDA_VISIBLE_DEVICES=)")
    else:
        build = _fitting(driver, capability, highest or capability)
    if override_url and build.ok:
        build = Build(override_url, build.dali_package, f"{build.reason}; torch index from TORCH_INDEX_URL")
    return build


def _fitting(driver: Capability, lowest: Optional[Capability], highest: Optional[Capability]) -> Build:
    with_kernels = [b for b in BUILDS if all(c is None or has_kernels(b, c) for c in (lowest, highest))]
    runs = [b for b in with_kernels if driver >= b.min_driver]
    gpus = ("GPUs of compute capability " + (_text(lowest) if lowest == highest else f"{_text(lowest)} to {_text(highest)}")
            if lowest and highest else "GPUs of unknown compute capability")
    if not with_kernels:
        assert lowest is not None and highest is not None  # no build lacks kernels for an unknown GPU
        if lowest == highest:
            return Build(None, _DALI12, f"no torch {TORCH_PINS.split()[0]} build has kernels for compute capability "
                                        f"{_text(lowest)}: hide these GPUs with CUDA_VISIBLE_DEVICES= to run on the CPU",
                         ok=False)
        return Build(None, _DALI12, f"no torch build has kernels for both compute capability {_text(lowest)} and "
                                    f"{_text(highest)} (cu126 stops at 9.0, newer builds start at 7.5): separate "
                                    "the GPUs with CUDA_VISIBLE_DEVICES and set up each kind apart", ok=False)
    if not runs:
        need = min(b.min_driver for b in with_kernels)
        return Build(None, _DALI12, f"{gpus} need a CUDA {_text(need)} or newer driver for a torch build with their "
                                    f"kernels, and this one runs CUDA {_text(driver)}: update the NVIDIA driver", ok=False)
    build = next((b for b in runs if b.index_url is None), runs[0])
    below = (f" ({_text(lowest)} is below the 7.5 that CUDA 13 builds need)"
             if driver[0] >= 13 and lowest and lowest < CUDA13_MIN_CAPABILITY else "")
    return Build(build.index_url, build.dali_package,
                 f"CUDA {_text(driver)} driver, {gpus}{below}: torch {build.name}"
                 + (f" from {build.index_url}" if build.index_url else ""))


def install_hint(driver: Optional[Capability]) -> str:
    """The pip command that installs the build matching `driver` and the GPUs."""
    build = choose_build(driver, os.environ.get("TORCH_INDEX_URL"), *(smi_compute_capabilities() or (None, None)))
    if not build.ok:
        return build.reason
    index = f" --index-url {build.torch_index_url}" if build.torch_index_url else ""
    return (f"pip install --force-reinstall {TORCH_PINS}{index} && pip install {build.dali_package} "
            "(scripts/setup.sh does this)")


def dali_install_hint() -> str:
    """The one DALI install hint (a missing DALI in --mode ddp_dali, scripts/gpu_check.py): the
    build for this machine's driver, as scripts/setup.sh would choose it."""
    package = choose_build(driver_cuda_version(), None, *(smi_compute_capabilities() or (None, None))).dali_package
    return f"pip install {package} (the build for this machine's NVIDIA driver; scripts/setup.sh installs it)"


def main() -> int:
    smi = ask_smi()
    problem = smi.problem
    if problem and not gpus_hidden():
        print(f"setup: {smi.broken_driver}; to set up for the CPU anyway: CUDA_VISIBLE_DEVICES= bash scripts/setup.sh",
              file=sys.stderr)
        return 2
    driver = None if problem else driver_cuda_version()
    if driver is None and not problem and smi.gpus:
        problem = header_problem() or "nvidia-smi -L lists the GPUs but plain nvidia-smi shows no CUDA version"
        if not gpus_hidden():
            print(f"setup: {problem}{LISTED_FIX}; to set up for the CPU anyway: CUDA_VISIBLE_DEVICES= bash "
                  "scripts/setup.sh", file=sys.stderr)
            return 2
    caps = smi_compute_capabilities() if driver else None
    build = choose_build(driver, os.environ.get("TORCH_INDEX_URL"), *(caps or (None, None)),
                         no_gpu=f"{problem}, and CUDA_VISIBLE_DEVICES= hides the GPUs" if problem else "no NVIDIA GPU")
    if not build.ok:
        print(f"setup: no torch build fits this machine: {build.reason}", file=sys.stderr)
        return 2
    print(f"TORCH_INDEX_URL={shlex.quote(build.torch_index_url or '')}")
    print(f"TORCH_PINS={shlex.quote(TORCH_PINS)}")
    print(f"DALI_PACKAGE={shlex.quote(build.dali_package)}")
    print(f"REASON={shlex.quote(build.reason)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
