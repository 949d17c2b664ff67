"""Every bad input gets one line naming the problem and the fix, and a non-zero exit."""
import sys

import pytest

import train_cifar
from handler.DALI.options import DaliOptions
from handler.PP.options import PipelineOptions
from handler.modes import parse_config
from handler.runtime.errors import UserError
from tests.conftest import SMALL, error_lines, run_cli


def fails_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_cifar.main([str(a) for a in argv])
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("note:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize("argv,expected", [
    (["--mode", "tp"], "invalid choice: 'tp'"),
    (["--num_gpu", "0"], "--num_gpu 0 is not a positive count"),
    (["--num-gpu", "-2"], "--num_gpu -2 is not a positive count"),
    (["--num_gpu", "3", "--batch-size", "64"], "--batch-size 64 is the global batch and must split evenly over 3"),
    (["--num_gpu", "2", "--batch-size", "2"], "gives 1 image per process; BatchNorm needs at least 2"),
    (["--model", "vgg"], "--model 'vgg' is unknown"),
    (["--epochs", "0"], "--epochs 0"),
    (["--cutout", "40"], "--cutout 40"),
    (["--accum-steps", "3", "--batch-size", "64"], "--accum-steps 3 must divide"),
    (["--amp", "fp16"], "--amp fp16 needs a GPU"),
    (["--lr", "abc"], "invalid float value: 'abc'"),
    # Options of one mode were once accepted, and ignored, by the others.
    (["--mode", "ddp", "--dali-source", "raw"], "--dali-source picks ddp_dali's input files; use it with --mode ddp_dali"),
    (["--mode", "fsdp", "--pp-schedule", "gpipe"], "--pp-schedule shapes the pipeline of --mode pp; use --mode pp, or drop it"),
    (["--mode", "ddp_dali", "--microbatches", "8", "--pp-schedule", "gpipe"],
     "--pp-schedule --microbatches shape the pipeline of --mode pp; use --mode pp, or drop them for --mode ddp_dali"),
])
def test_bad_option_gives_one_clear_line(argv, expected, capsys):
    assert expected in fails_with_one_line(argv, capsys)


def test_num_gpu_above_visible_gpus_names_the_count():
    with pytest.raises(UserError, match=r"--num_gpu 3 but only 2 GPU\(s\) are visible"):
        parse_config(["--num_gpu", "3"], cuda_count=2)


def test_unwritable_ckpt_dir_is_caught_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = fails_with_one_line(["--ckpt", blocker / "ckpt", "--data", tmp_path, *SMALL], capsys)
    assert "--ckpt" in line and "not writable" in line


def test_unwritable_metrics_dir_is_caught_before_training(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = fails_with_one_line(["--metrics", blocker / "m.json", "--ckpt", tmp_path, "--data", tmp_path, *SMALL], capsys)
    assert "--metrics" in line


def test_valid_size_not_below_train_size_is_caught_before_training(data_root, tmp_path, capsys):
    line = fails_with_one_line(["--data", data_root, "--ckpt", tmp_path, "--valid-size", 5000, *SMALL], capsys)
    assert "--valid-size 5000 leaves no training images" in line


def test_missing_data_in_offline_cifar10_mode(tmp_path, capsys, monkeypatch):
    import handler.data.cifar_files as files
    monkeypatch.setattr(files, "URL", "http://127.0.0.1:9/cifar-10-python.tar.gz")
    line = fails_with_one_line(["--dataset", "cifar10", "--data", tmp_path / "nothing", "--ckpt", tmp_path], capsys)
    assert "could not be downloaded" in line and "--dataset synthetic" in line


@pytest.mark.parametrize("content", [None, b"garbage"])
def test_resume_from_missing_or_non_checkpoint_file(data_root, tmp_path, capsys, content):
    path = tmp_path / "x.pt"
    if content is not None:
        path.write_bytes(content)
    line = fails_with_one_line(["--resume", path, "--ckpt", tmp_path, "--data", data_root, *SMALL], capsys)
    assert str(path) in line


def test_busy_port_is_named(data_root, tmp_path, capsys):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = fails_with_one_line(["--mode", "ddp", "--port", port, "--data", data_root,
                                    "--ckpt", tmp_path, *SMALL], capsys)
    assert f"--port {port}" in line


def test_real_process_exits_nonzero_with_one_line(tmp_path):
    proc = run_cli(["--mode", "nope"], budget=6)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "invalid choice" in lines[0]


def test_ddp_dali_without_dali_installed_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import nvidia.dali now fails
    line = fails_with_one_line(["--mode", "ddp_dali", "--ckpt", tmp_path, *SMALL], capsys)
    assert "needs NVIDIA DALI: pip install nvidia-dali-cuda120==2.4.0" in line


def test_one_modes_options_are_taken_by_that_mode():
    pp = parse_config(["--mode", "pp", "--num_gpu", "2", "--batch-size", "64", "--pp-schedule", "gpipe",
                       "--microbatches", "8"], cuda_count=0)
    assert (PipelineOptions.of(pp).pp_schedule, PipelineOptions.of(pp).microbatches) == ("gpipe", 8)
    assert DaliOptions.of(parse_config(["--mode", "ddp_dali", "--dali-source", "raw"], cuda_count=0)).dali_source == "raw"
    # The defaults, spelt out, are no change: any mode takes them.
    assert parse_config(["--mode", "ddp", "--pp-schedule", "1f1b", "--microbatches", "4"], cuda_count=0).mode == "ddp"
