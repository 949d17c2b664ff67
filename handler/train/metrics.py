"""The run's metrics JSON (docs/METRICS.md), rewritten by rank 0 after every epoch."""
import datetime
import importlib.metadata
import json
import os
import platform

import torch

from ..runtime import cpu_memory

def environment(cfg, notes, hosts=None) -> dict:
    """`hosts`: {rank: hostname} (dist.hostnames()); env.nodes counts the distinct hosts."""
    from ..runtime.devices import cuda_status
    fallback = cfg.dataset_fallback and f"--dataset auto ran SYNTHETIC data: {cfg.dataset_fallback}"
    notes = [n for n in (cuda_status()[1], os.environ.get("HARNESS_PROFILE_NOTE"), fallback, *notes) if n]
    gpus = ([torch.cuda.get_device_name(i) for i in range(cfg.num_gpu)] if cfg.use_cuda else [])
    hosts = hosts or {0: platform.node()}
    return {"mode": cfg.mode, "world_size": cfg.world_size, "backend": cfg.backend,
            "hosts": {str(rank): name for rank, name in sorted(hosts.items())}, "nodes": len(set(hosts.values())),
            "device": "cuda" if cfg.use_cuda else "cpu", "gpus": gpus, "dataset": cfg.dataset,
            "dataset_fallback": cfg.dataset_fallback or None,
            "torch": torch.__version__, "torchvision": package_version("torchvision"),
            "dali": dali_version(), "nsys": os.environ.get("HARNESS_NSYS") or None,
            "cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(), "cpu_cores": cpu_cores(),
            "torch_threads": torch.get_num_threads(), "cpu_allocator": cpu_memory.setting(),
            "notes": list(notes),
            "started_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def cpu_cores() -> int | None:
    """The cores this process may run on (its affinity, which a container or taskset narrows);
    the what-if's loaders share them (handler/profiling/scaling/machine.py)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def model_facts(model: torch.nn.Module) -> dict:
    """The whole model's trainable parameters and the MB of fp32 gradients a step all-reduces
    (4 bytes each, MB of 10^6): the what-if's payload (docs/PROFILING.md, the summary's `run`)."""
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable_params": params, "grad_mb": params * 4 / 1e6}


DALI_WHEELS = ("nvidia-dali-cuda130", "nvidia-dali-cuda120", "nvidia-dali-cuda110")


def package_version(package: str):
    """An installed package's version, read without importing it (torchvision costs 1.7 s)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def dali_version():
    """DALI's version from its wheel's metadata (importing it costs rank 0 0.3-0.45 s)."""
    return next(filter(None, map(package_version, DALI_WHEELS)), None)


class MetricsFile:
    def __init__(self, cfg, env: dict, history=(), model: dict | None = None):
        self.path = cfg.metrics
        self.data = {"schema": 1, "config": cfg.as_dict(), "env": env, "model": model,
                     "epochs": list(history), "test": None, "total_time_s": None}

    def add_epoch(self, record: dict) -> None:
        self.data["epochs"].append(record)
        self.write()

    def finish(self, test: dict, total_time_s: float) -> None:
        self.data["test"] = test
        self.data["total_time_s"] = total_time_s
        self.write()

    def write(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(folder, exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=2)
        os.replace(tmp, self.path)
