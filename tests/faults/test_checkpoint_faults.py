"""Checkpoint faults: a disk that fills up while saving (docs/FAILURES.md)."""
import contextlib
import shutil
import socket
import subprocess

import pytest
import torch

from tests.conftest import error_lines, run_cli

# Two steps an epoch: the save that fails comes seconds after the start.
TINY = ["--dataset", "synthetic", "--synthetic-train", "130", "--synthetic-test", "20", "--model", "resnet20",
        "--workers", "0", "--no-progress"]


@contextlib.contextmanager
def small_tmpfs(folder, size_bytes: int):
    """A tmpfs of size_bytes at folder (needs root, as CI and this lab run), unmounted after."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.strip()}): run as root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.mark.slow  # 16 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(two_epoch_run, tmp_path):
    """Room for last.pt but not for the next save beside it: rank 0's write fails with ENOSPC.
    Before, that was 62 lines: rank 0's traceback, rank 1's lost rank 0, the launcher's."""
    trained = two_epoch_run("dp")[1] / "last.pt"
    size = trained.stat().st_size
    with small_tmpfs(tmp_path / "full", size + size // 2) as folder:
        shutil.copy(trained, folder / "last.pt")
        before = (folder / "last.pt").read_bytes()
        proc = run_cli(["--mode", "ddp", "--num_gpu", 2, "--data", tmp_path / "data", "--ckpt", folder, "--resume",
                        "--epochs", 3, "--batch-size", 64, "--valid-size", 0, "--metrics", tmp_path / "m.json",
                        *TINY], budget=15)
        lines = error_lines(proc)
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1, proc.stderr
        assert f"no room to save a checkpoint in {folder}" in lines[0]
        assert "MiB are free; the previous last.pt there is kept" in lines[0]
        assert "Traceback" not in proc.stderr + proc.stdout
        assert (folder / "last.pt").read_bytes() == before
        assert sorted(p.name for p in folder.iterdir()) == ["last.pt"]  # no temp file left behind
        assert torch.load(folder / "last.pt", weights_only=True)["epoch"] == 2


@pytest.mark.slow  # CI's slow step (pytest.ini); the single-file case stays in the main suite
def test_a_full_disk_while_saving_shards_is_the_same_one_line_and_keeps_the_previous_shards(two_epoch_run, tmp_path):
    """fsdp: every rank writes its shard (torch.distributed.checkpoint); the folder has room for
    the previous save but not the next. Before, each rank raised torch's CheckpointException."""
    trained = two_epoch_run("fsdp")[1]
    shards = torch.load(trained / "last.pt", weights_only=True)["shards"]
    size = sum(p.stat().st_size for p in (trained / shards).iterdir()) + (trained / "last.pt").stat().st_size
    with small_tmpfs(tmp_path / "full", size + size // 2) as folder:
        shutil.copy(trained / "last.pt", folder / "last.pt")
        shutil.copytree(trained / shards, folder / shards)
        before = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        proc = run_cli(["--mode", "fsdp", "--num_gpu", 2, "--data", tmp_path / "data", "--ckpt", folder, "--resume",
                        "--epochs", 3, "--batch-size", 64, "--valid-size", 0, "--metrics", tmp_path / "m.json",
                        *TINY], budget=20)
        lines = error_lines(proc)
        assert proc.returncode == 2, proc.stderr
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"rank 0 ({socket.gethostname()}): no room to save a checkpoint in {folder}: ")
        assert "MiB are free; the previous last.pt there is kept" in lines[0]
        assert "Traceback" not in proc.stderr + proc.stdout
        after = {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        assert after == before  # the half-written shard folder is gone, the previous one untouched
