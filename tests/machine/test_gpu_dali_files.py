"""The path the lab runs by default, on GPUs: ddp_dali on the kit's PNG tree (--dali-source files),
which DALI decodes on the GPU (`mixed`), through train_cifar.py on 1 and 2 GPUs, on a small tree
made on the fly (scripts/kit_driver.py's write_png_tree). gpu_check's rows `ddp_dali files (PNG
tree, mixed decode)` and `2 GPUs: ...` run the same path at its own scale.

`gpu`-marked: skipped without CUDA (and without DALI); the 2-GPU one below two GPUs."""
import math

import pytest

from scripts.kit_driver import write_png_tree
from tests.conftest import read_metrics, run_cli

pytestmark = pytest.mark.gpu
N_TRAIN, N_TEST = 600, 100


@pytest.fixture(scope="module")
def png_tree(tmp_path_factory):
    return write_png_tree(tmp_path_factory.mktemp("kit") / "cifar10_images", N_TRAIN, N_TEST)


@pytest.mark.parametrize("gpus", [1, pytest.param(2, marks=pytest.mark.gpus(2))])
def test_ddp_dali_trains_on_the_kits_png_tree_decoded_on_the_gpu(gpus, png_tree, tmp_path):
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    proc = run_cli(["--mode", "ddp_dali", "--dali-source", "files", "--num_gpu", gpus, "--data", png_tree,
                    "--ckpt", tmp_path, "--epochs", 1, "--batch-size", 64, "--valid-size", 100, "--model", "resnet20",
                    "--workers", 1, "--no-progress"], timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = read_metrics(tmp_path / "metrics.json")
    assert m["config"]["dali_source"] == "files" and m["env"]["dataset"] == "cifar10"
    assert m["env"]["device"] == "cuda" and len(m["env"]["gpus"]) == gpus == m["env"]["world_size"]
    assert m["env"]["backend"] == "nccl" and [e["epoch"] for e in m["epochs"]] == [0]
    assert math.isfinite(m["epochs"][0]["train_loss"]) and m["test"]["samples"] == N_TEST
