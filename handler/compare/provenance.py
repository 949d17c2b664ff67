"""Where a measurement came from: hardware, software versions, code version, date.

Shared by the comparison report and the bench/ scripts, so every number the repo
publishes carries the same header.
"""
import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def gpus() -> list:
    from ..runtime.devices import cuda_status
    import torch
    return [torch.cuda.get_device_name(i) for i in range(cuda_status()[0])]


def hardware() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_gib": memory_gib(), "gpus": gpus()}


def versions() -> dict:
    import torch
    from ..train.metrics import dali_version, package_version
    from ..profiling.nsys import nsys_version
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": package_version("torchvision"), "dali": dali_version(), "nsys": nsys_version()}


def code_version() -> str:
    """The git commit, marked `+changes` when the work tree differs from it."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown"
    return f"{commit}{' +changes' if dirty else ''}" if commit else "unknown"


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def provenance(command: str) -> dict:
    return {"date": now(), "command": command, "hardware": hardware(), "versions": versions(),
            "code": code_version()}


def markdown(prov: dict, extra: Optional[dict] = None) -> list:
    """The provenance block as markdown bullet lines."""
    hw, v = prov["hardware"], prov["versions"]
    lines = [f"- **date**: {prov['date']}",
             f"- **command**: `{prov['command']}`",
             f"- **hardware**: {hw['cpu']}, {hw['cores']} cores, {hw['memory_gib']} GiB RAM; "
             f"GPUs: {', '.join(hw['gpus']) or 'none'}",
             f"- **versions**: python {v['python']}, torch {v['torch']}, torchvision {v['torchvision']}, "
             f"DALI {v['dali'] or 'not installed'}, nsys {v['nsys'] or 'not installed'}",
             f"- **code**: {prov['code']}"]
    lines += [f"- **{k}**: {val}" for k, val in (extra or {}).items()]
    return lines
