"""The GPU-only profile analysis on real GPU captures: scripts/launch.sh under nsys, then the summary.

All `gpu`-marked (scripts/gpu_check.sh runs them); they also need nsys. The CPU tests
(tests/profiling/test_profile_pp_gpu.py, _gpu_metrics_device.py, _data_gpu.py) check the same rules on
copies of real exports; these check that a real capture of our modes gives them what they expect: DALI's threads and kernels,
pp's NCCL send/recv linked to its ranges, and TARGET_INFO_CUDA_DEVICE. They have not yet
run on a GPU (none was available when they were written, 2026-11-23).
"""
import json
import os
import re
import sqlite3
import subprocess
import sys

import pytest

from tests.conftest import N_TEST, N_TRAIN, gpu_count, run_process
from tests.nsys_helpers import REPO, once_more_if_nsys_failed_to_start, require_nsys
from tests.parallel import one_at_a_time

pytestmark = pytest.mark.gpu

ARGS = ["--model", "resnet20", "--epochs", "1", "--batch-size", "64", "--valid-size", "100", "--dataset", "synthetic",
        "--synthetic-train", str(N_TRAIN), "--synthetic-test", str(N_TEST), "--workers", "2", "--no-progress"]
PIPELINE_KERNEL = re.compile(r"\b(dali|nvjpeg|nvimgcodec)::")


def profiled(data_root, folder, mode, gpus, *extra, **env):
    """A profiled launch; returns (summary JSON, path of its SQLite export)."""
    require_nsys()
    if mode == "ddp_dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    settings = {"MODE": mode, "NUM_GPUS": str(gpus), "PROFILE": "1", "PYTHON": sys.executable,
                "DATA_DIR": str(data_root), "CKPT_DIR": str(folder / "ckpt"), "NSIGHT_LOG_DIR": str(folder),
                "NSIGHT_FILE_NAME": "run", **env}
    with one_at_a_time("nsys"):
        run = once_more_if_nsys_failed_to_start(
            lambda: run_process(["bash", REPO / "scripts" / "launch.sh", *ARGS, *extra], env=settings, timeout=600))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads((folder / "run.summary.json").read_text()), folder / "run.sqlite"


def test_dali_gpu_work_in_a_real_ddp_dali_capture_is_data_gpu(data_root, tmp_path):
    summary, export = profiled(data_root, tmp_path, "ddp_dali", 1, "--dali-source", "jpeg")
    with sqlite3.connect(export) as db:
        rows = db.execute("SELECT k.end - k.start, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                          "JOIN StringIds s ON s.id = k.demangledName").fetchall()
    dali_s = sum(d for d, name in rows if PIPELINE_KERNEL.search(name)) / 1e9
    gpu = summary["ranks"][0]["gpu"]
    assert dali_s > 0, "no dali:: or nvjpeg:: kernel in the capture: the kernel-name rule has nothing to match"
    assert gpu["pipeline_threads"] > 0 and gpu["phase_kernel_s"]["data_gpu"] > 0
    # Every DALI/nvJPEG kernel is data (GPU), or unattributed when launched outside training batches.
    assert dali_s <= gpu["phase_kernel_s"]["data_gpu"] + gpu["unattributed_s"] + 1e-9
    assert "data (GPU)" in summary["one_line"]


@pytest.mark.gpus(2)
def test_pp_bubble_in_a_real_two_gpu_capture_comes_from_kernels(data_root, tmp_path):
    summary, _ = profiled(data_root, tmp_path, "pp", 2, "--microbatches", "4")
    stages = [r["pipeline"] for r in summary["ranks"]]
    assert [s["stage"] for s in stages] == [0, 1]
    for s in stages:
        assert s["source"] == "gpu kernels", s.get("note")
        assert 0 < s["busy_share"] < 1 and s["bubble_share"] == pytest.approx(1 - s["busy_share"])
        assert s["cpu_ranges"]["span_s"] > 0
    assert stages[1]["wait_share"] > 0  # stage 1's NCCL recv kernels wait for stage 0


def device_uuid(visible: str) -> str:
    """UUID of CUDA device 0 under CUDA_VISIBLE_DEVICES=visible, as torch sees it."""
    code = "import torch; print(torch.cuda.get_device_properties(0).uuid)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "CUDA_VISIBLE_DEVICES": visible},
                         capture_output=True, text=True, check=True).stdout.strip()
    return out.lower().removeprefix("gpu-")


@pytest.mark.gpus(2)
def test_gpu_metrics_under_a_cuda_visible_devices_subset_are_the_used_gpus(data_root, tmp_path):
    last = str(gpu_count() - 1)  # CUDA device 0 of the run is the machine's last GPU
    summary, export = profiled(data_root, tmp_path, "ddp", 1, GPU_METRICS="1", LOCAL_GPU_IDS=last)
    rank = summary["ranks"][0]
    if rank["gpu_metrics"] is None:
        pytest.skip("nsys sampled no GPU metrics here (counter permission or GPU); see the launch output")
    if summary["gpu_metrics_mapping"] != "TARGET_INFO_CUDA_DEVICE":
        assert summary["gpu_metrics_mapping"].startswith("assumed")
        pytest.skip("this nsys writes no TARGET_INFO_CUDA_DEVICE; the summary says the ids were assumed")
    (gpu,) = rank["gpu_metrics_gpus"].values()
    assert list(rank["gpu_metrics"]) == [str(gpu)]
    with sqlite3.connect(export) as db:
        (uuid,) = db.execute("SELECT uuid FROM TARGET_INFO_GPU WHERE id = ?", (gpu,)).fetchone()
    assert uuid.lower().removeprefix("gpu-") == device_uuid(last)
