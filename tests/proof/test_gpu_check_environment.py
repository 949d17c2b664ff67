"""gpu_check's environment(), the real one: the first thing the GPU check runs. An import
that a rename broke stopped it before any check, on every GPU machine."""
import importlib.util
import shutil

import torch

from handler.train.metrics import dali_version
from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)


def test_environment_names_the_gpu_driver_torch_and_dali(monkeypatch):
    # Only the CUDA boundary is faked: this machine has no GPU and no nvidia-smi.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    env = gpu_check.environment()
    assert (env["gpu"], env["gpus"], env["driver"]) == ("NVIDIA H100 80GB HBM3", 2, None)
    assert env["torch"] == torch.__version__ and env["torch_cuda"] == torch.version.cuda
    assert env["dali"] == dali_version() and env["date"]
