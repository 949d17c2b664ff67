"""Where a measurement came from: hardware, software versions, code version, date.

Shared by the comparison report and the bench/ scripts, so every number the repo
publishes carries the same header.
"""
import datetime
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Optional

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


def gpus() -> list[str]:
    from ..runtime.devices import cuda_status
    import torch
    return [torch.cuda.get_device_name(i) for i in range(cuda_status()[0])]


def hardware() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_gib": memory_gib(), "gpus": gpus()}


def versions() -> dict[str, Any]:
    import torch
    from ..train.metrics import dali_version, package_version
    from ..profiling.nsys import nsys_version
    return {"python": platform.python_version(), "torch": torch.__version__,
            "torchvision": package_version("torchvision"), "dali": dali_version(), "nsys": nsys_version()}


def code_version() -> str:
    """The git commit, marked `+changes` when the work tree differs from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()
    try:
        commit = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except OSError:
        return "unknown"
    return f"{commit}{' +changes' if dirty else ''}" if commit else "unknown"


def now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def provenance(command: str) -> dict[str, Any]:
    return {"date": now(), "command": command, "hardware": hardware(), "versions": versions(),
            "code": code_version()}


def dataset_identity(root: str | None) -> str:
    """What a folder in CIFAR-10's layout holds, saying only what is known: "real CIFAR-10" only where
    its python batches are CIFAR-10's own files (torchvision.datasets.CIFAR10's md5s, checked with its
    check_integrity); otherwise the folder and its image count, and why it is not named CIFAR-10."""
    from ..data.cifar_files import FOLDER, TEST_FILE, TRAIN_FILES, has_layout
    from ..data.cifar_images import has_image_tree
    if not root:
        return "a folder in CIFAR-10's layout (its path was not recorded, so its files were not checked)"
    if not Path(root).is_dir():
        return f"a folder in CIFAR-10's layout, {root} (not found here, so its files were not checked)"
    if has_layout(root):
        count = _batch_images(Path(root) / FOLDER, (*TRAIN_FILES, TEST_FILE))
        try:
            from torchvision.datasets import CIFAR10  # pyright: ignore[reportMissingTypeStubs]
            from torchvision.datasets.utils import check_integrity  # pyright: ignore[reportMissingTypeStubs]
        except ImportError:
            return f"{root}: {count} in CIFAR-10's layout (torchvision is not installed to check them)"
        wrong = [name for name, md5 in (*CIFAR10.train_list, *CIFAR10.test_list)
                 if not check_integrity(str(Path(root) / FOLDER / name), md5)]
        if not wrong:
            return f"real CIFAR-10 ({root}: {count}; torchvision's checksums match)"
        return (f"{root}: {count} in CIFAR-10's layout, NOT CIFAR-10's files ({', '.join(wrong)} "
                f"differ{'s' if len(wrong) == 1 else ''} from torchvision's checksums)")
    if has_image_tree(root):
        count = sum(1 for p in Path(root).glob("*/*/*") if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        return (f"{root}: {count} images in a PNG tree of CIFAR-10's layout (torchvision's checksums cover "
                "only its python batches, so not checked as CIFAR-10)")
    return f"{root}: not in CIFAR-10's layout"


def _batch_images(folder: Path, names: tuple[str, ...]) -> str:
    """"N images" in CIFAR-10 python batches, or why they could not be counted."""
    import pickle
    total = 0
    for name in names:
        try:
            with open(folder / name, "rb") as f:
                batch = pickle.load(f, encoding="latin1")
            total += len(batch.get("labels", batch.get(b"labels", ())))
        except Exception as err:  # a corrupt batch is the training's to refuse; here it only goes uncounted
            return f"images not counted ({name} could not be read: {type(err).__name__})"
    return f"{total} images"


def markdown(prov: dict[str, Any], extra: Optional[dict[str, str]] = None) -> list[str]:
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
