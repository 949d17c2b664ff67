"""The caller's CUDA_VISIBLE_DEVICES reaches the trainer narrowed, never widened:
scripts/lab_runs.sh (here through run_ddp.sh) runs on the first 1 and 2 of the caller's GPUs (it used to run on 0 and
0,1 whatever the caller chose), CUDA_VISIBLE_DEVICES= keeps both runs on the CPU (it used to
un-hide GPUs 0 and 0,1), and scripts/launch.sh reads LOCAL_GPU_IDS as places in a set
CUDA_VISIBLE_DEVICES, refusing in one line a place that is not there.

No GPU here, so a stand-in Python plays the two things that cross CUDA: torch's GPU count
(`python -m handler.runtime.devices`, as on a 4-GPU box: the entries of CUDA_VISIBLE_DEVICES,
else 4) and the trainer, which records the CUDA_VISIBLE_DEVICES it was started with and stops.
Everything else runs in the real Python; a hidden CUDA_VISIBLE_DEVICES= is counted by the real
handler.runtime.devices."""
import os
import sys

import pytest

from tests.conftest import ROOT, error_lines, run_process


def four_gpu_python(folder):
    folder.mkdir()
    python = folder / "python"
    python.write_text(f"""#!/bin/sh
case "$1" in */train_cifar.py) echo "${{CUDA_VISIBLE_DEVICES-unset}}" >>"{folder}/trainer_saw"; exit 0 ;; esac
[ "$1 $2" = "-m handler.runtime.devices" ] && echo asked >>"{folder}/devices_asked"
if [ "$1 $2" = "-m handler.runtime.devices" ] && [ -n "${{CUDA_VISIBLE_DEVICES-x}}" ]; then
    [ -z "${{CUDA_VISIBLE_DEVICES+x}}" ] && echo 4 || echo "$CUDA_VISIBLE_DEVICES" | tr , '\\n' | wc -l
    exit 0
fi
exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    return python


def run(script, tmp_path, **env):
    """bash scripts/<script> in a checkout whose outputs land in tmp_path; (run, what the trainer saw)."""
    for name in ("scripts", "handler", "models", "train_cifar.py"):
        os.symlink(ROOT / name, tmp_path / name)
    python = four_gpu_python(tmp_path / "bin")
    base = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "LOCAL_GPU_IDS")}
    proc = run_process(["bash", f"scripts/{script}"], cwd=tmp_path, budget=20, inherit=False,
                       env={**base, "PROFILE": "0", "PYTHON": str(python), "TIMESTAMP": "t0", **env})
    saw = tmp_path / "bin" / "trainer_saw"
    return proc, saw.read_text().splitlines() if saw.exists() else []


@pytest.mark.parametrize("caller, runs", [
    ("2,3", ["2", "2,3"]),   # the first 1 and 2 of the caller's GPUs
    ("", ["", ""]),          # CUDA_VISIBLE_DEVICES= keeps the CPU
    (None, ["0", "0,1"]),    # unset: all 4 visible, the kit's GPUs 0 and 0,1
])
def test_lab_runs_keeps_the_callers_visible_devices(caller, runs, tmp_path):
    proc, saw = run("run_ddp.sh", tmp_path, **({} if caller is None else {"CUDA_VISIBLE_DEVICES": caller}))
    assert proc.returncode == 0, proc.stderr
    assert saw == runs, proc.stderr


def test_lab_runs_on_one_visible_gpu_of_four_runs_on_it_and_skips_two(tmp_path):
    proc, saw = run("run_ddp.sh", tmp_path, CUDA_VISIBLE_DEVICES="3")
    assert proc.returncode == 0 and saw == ["3"], proc.stderr
    assert "lab_runs: skipping the 2-GPU run of ddp: 1 GPU(s) visible" in proc.stderr


@pytest.mark.parametrize("caller, ids, gpus", [("2,3", "1", "3"), ("GPU-a,GPU-b", "1,0", "GPU-b,GPU-a"),
                                               (None, "1", "1")])
def test_launch_reads_local_gpu_ids_as_places_in_the_callers_list(caller, ids, gpus, tmp_path):
    proc, saw = run("launch.sh", tmp_path, MODE="ddp", LOCAL_GPU_IDS=ids,
                    **({} if caller is None else {"CUDA_VISIBLE_DEVICES": caller}))
    assert proc.returncode == 0 and saw == [gpus], proc.stderr


@pytest.mark.parametrize("caller, ids, problem", [
    ("2,3", "2", "LOCAL_GPU_IDS=2: '2' is not a place in CUDA_VISIBLE_DEVICES=2,3; under it LOCAL_GPU_IDS "
                 "counts 0..1 in that list"),
    ("", "0", "LOCAL_GPU_IDS=0 names a GPU but CUDA_VISIBLE_DEVICES='' hides every GPU; unset LOCAL_GPU_IDS "
              "to run on the CPU, or unset CUDA_VISIBLE_DEVICES"),
])
def test_launch_never_widens_the_callers_devices(caller, ids, problem, tmp_path):
    proc, saw = run("launch.sh", tmp_path, MODE="ddp", LOCAL_GPU_IDS=ids, CUDA_VISIBLE_DEVICES=caller)
    assert proc.returncode == 2 and error_lines(proc) == [f"launch: {problem}"], proc.stderr
    assert saw == [], "the trainer started"


@pytest.mark.parametrize("caller, ids, repeat", [("0,1", "0,0", "0"), (None, "1,1", "1"), ("2,3,4", "1, 01", "01")])
def test_launch_refuses_a_local_gpu_id_named_twice_in_one_line(caller, ids, repeat, tmp_path):
    # Before: LOCAL_GPU_IDS=0,0 under CUDA_VISIBLE_DEVICES=0,1 passed, and CUDA saw no GPU (0,0).
    proc, saw = run("launch.sh", tmp_path, MODE="ddp", LOCAL_GPU_IDS=ids,
                    **({} if caller is None else {"CUDA_VISIBLE_DEVICES": caller}))
    assert proc.returncode == 2 and error_lines(proc) == [
        f"launch: LOCAL_GPU_IDS={ids} names GPU {repeat} twice, and CUDA then sees no GPU; list each GPU once "
        "(e.g. LOCAL_GPU_IDS=0,1)"], proc.stderr
    assert saw == [] and not (tmp_path / "bin" / "devices_asked").exists()


def test_launch_refuses_more_local_gpu_ids_than_num_gpus(tmp_path):
    proc, saw = run("launch.sh", tmp_path, MODE="ddp", LOCAL_GPU_IDS="0,1,2", NUM_GPUS="2")
    assert proc.returncode == 2 and error_lines(proc) == [
        "launch: LOCAL_GPU_IDS=0,1,2 names 3 GPUs but NUM_GPUS=2; name 2 of them, or leave NUM_GPUS out to use "
        "all 3"], proc.stderr
    assert saw == []


@pytest.mark.parametrize("setting, value, said", [
    ("MODE", "", "MODE is set but empty; name a mode (e.g. MODE=ddp), or unset it for ddp_dali"),
    ("DATA_DIR", "{file}", "DATA_DIR={file} is a file; name the CIFAR-10 folder"),
    ("CKPT_DIR", "{file}/ckpt", "CKPT_DIR={file}/ckpt is under {file}, which is a file; name a folder"),
    ("NSIGHT_LOG_DIR", "{file}/a/b", "NSIGHT_LOG_DIR={file}/a/b is under {file}, which is a file; name a folder"),
    ("NSIGHT_LOG_DIR", "{file}", "NSIGHT_LOG_DIR={file} is a file; name a folder"),
    ("PYTHON", "{file}.nowhere", "PYTHON={file}.nowhere is not a program that runs; name a Python 3 that has torch"),
])
def test_a_bad_launch_setting_is_one_line_before_python_or_any_set_up(setting, value, said, tmp_path):
    # Before: MODE= ran ddp_dali; a file as NSIGHT_LOG_DIR was mkdir's message (exit 1) after torch's
    # start-up; a PYTHON that is not there, bash's "No such file".
    file = tmp_path / "afile"
    file.write_text("")
    proc, saw = run("launch.sh", tmp_path, **{"MODE": "ddp", setting: value.format(file=file)})
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("launch: " + said.format(file=file)), \
        proc.stderr
    assert saw == [] and not (tmp_path / "bin" / "devices_asked").exists()


@pytest.mark.parametrize("script, file, env, said", [
    ("lab_runs.sh", None, {}, "lab_runs: no mode; usage: bash scripts/lab_runs.sh dp|ddp|ddp_dali"),
    ("run_ddp.sh", "runs", {}, "lab_runs: runs is a file, where this run needs a folder"),
    ("run_ddp.sh", "kit", {"DATASET_DIR": "kit"}, "lab_runs: kit is a file, where this run needs a folder"),
])
def test_a_bad_lab_run_setting_is_one_line_before_python_or_any_set_up(script, file, env, said, tmp_path):
    # Before: bash's own `1: usage` line (exit 1), and a file named runs was mkdir's message after torch's start-up.
    if file:
        (tmp_path / file).write_text("")
    proc, saw = run(script, tmp_path, **env)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(said), proc.stderr
    assert saw == [] and not (tmp_path / "bin" / "devices_asked").exists()
