"""The one-line errors and fallbacks of small helpers, in-process: each costs milliseconds,
and a run through the CLI would only reach them by a slower road."""
import ctypes
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from handler.runtime import cpu_memory
from handler.runtime.precision import cpu as cpu_precision
from handler.runtime.errors import UserError, one_line_errors
from handler.runtime.umask import apply_user_umask
from handler.train.checkpoint import FORMAT, PlainState, load_checkpoint, save_atomic
from handler.train.config import Config
from handler.train.preflight import _earlier_run
from tests.conftest import run_cli


@pytest.mark.parametrize("value", ["abc", "1777", "-1"])
def test_a_umask_that_is_not_octal_0_to_777_is_one_line(value, monkeypatch):
    monkeypatch.setenv("HARNESS_UMASK", value)
    with pytest.raises(UserError, match=f"HARNESS_UMASK='{value}' is not an octal umask"):
        apply_user_umask()


def test_a_valid_umask_is_applied(monkeypatch):
    monkeypatch.setenv("HARNESS_UMASK", "0027")
    before = os.umask(0o022)
    try:
        apply_user_umask()
        assert os.umask(0o022) == 0o027
    finally:
        os.umask(before)


def test_a_failed_save_leaves_no_temp_file_and_keeps_the_old_checkpoint(tmp_path):
    path = tmp_path / "last.pt"
    save_atomic({"format": FORMAT, "model": {}}, str(path))
    with pytest.raises(Exception):
        save_atomic({"model": lambda: None}, str(path))  # a lambda cannot be pickled
    assert os.listdir(tmp_path) == ["last.pt"]
    assert load_checkpoint(str(path), "cpu")["model"] == {}


def test_a_torch_file_not_written_by_the_harness_is_refused_in_one_line(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"state_dict": {}}, path)
    with pytest.raises(UserError, match="not a checkpoint written by this harness"):
        load_checkpoint(str(path), "cpu")


def test_a_sharded_checkpoint_resumed_by_a_plain_mode_names_fsdp():
    with pytest.raises(UserError, match="sharded \\(fsdp\\) state; resume it with --mode fsdp"):
        PlainState().restore({"shards": "shards-e1"}, "last.pt", model=None, optimizer=None)


def test_a_plain_checkpoint_resumed_by_fsdp_names_its_mode():
    from handler.FSDP.checkpoint import ShardedState
    with pytest.raises(UserError, match="unsharded state from another mode; resume it with --mode pp"):
        ShardedState().restore({"model": {}, "config": {"mode": "pp"}}, "last.pt", model=None, optimizer=None)


def test_an_unreadable_earlier_last_pt_still_stops_a_fresh_start(tmp_path):
    (tmp_path / "last.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="already holds a file this harness cannot read"):
        _earlier_run(Config(ckpt=str(tmp_path)), restarted=False)


def test_harness_glibc_defaults_keeps_the_allocator_as_it_is(monkeypatch):
    monkeypatch.setenv("HARNESS_GLIBC_DEFAULTS", "1")
    assert cpu_memory._apply() == "glibc defaults (HARNESS_GLIBC_DEFAULTS=1)"


@pytest.mark.parametrize("libc, said", [
    (OSError("libc.so.6: cannot open"), "platform default (no glibc mallopt)"),
    (type("Refusing", (), {"mallopt": staticmethod(lambda option, value: 0)})(),
     "glibc defaults (mallopt refused the thresholds)"),
])
def test_an_allocator_without_mallopt_or_refusing_it_is_said_not_hidden(libc, said, monkeypatch):
    # The C library is the boundary: this machine's glibc accepts the thresholds, so a
    # platform without glibc (musl, macOS) and a refusing mallopt are stood in for here.
    for name in [k for k in os.environ if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD",
                                                                          "HARNESS_GLIBC_DEFAULTS")]:
        monkeypatch.delenv(name)

    def cdll(name):
        if isinstance(libc, Exception):
            raise libc
        return libc
    monkeypatch.setattr(ctypes, "CDLL", cdll)
    assert cpu_memory._apply() == said


def test_an_unreadable_cpuinfo_counts_as_emulated_bf16(tmp_path, monkeypatch):
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    assert cpu_precision.native_bf16(str(tmp_path / "no-cpuinfo")) is False


def test_a_cpu_with_native_bf16_gets_no_note(monkeypatch):
    # The CPU's flags are the hardware boundary: this machine may lack avx512_bf16.
    monkeypatch.setattr(cpu_precision, "native_bf16", lambda: True)
    assert cpu_precision.bf16_note() == ""


def test_ctrl_c_inside_one_line_errors_is_one_line_and_exit_130():
    # xdist's workers ignore SIGINT and a child inherits that, so Python would install no
    # handler: give it the one a process started from a shell has.
    code = ("import os, signal, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from handler.runtime.errors import one_line_errors\n"
            "with one_line_errors('train'):\n"
            "    print('ready', flush=True)\n"
            "    while True:\n"
            "        time.sleep(0.05)\n")
    # Short sleeps, as a training's steps are: a SIGINT that lands after 'ready' but before the
    # sleep's system call starts is run by Python only at its next bytecode, which one
    # time.sleep(60) put 60 s away (this test timed out once, on a loaded box).
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err.strip() == "train: interrupted"


def test_one_line_errors_turns_a_user_error_into_exit_2(capsys):
    with pytest.raises(SystemExit) as stop:
        with one_line_errors("bench"):
            raise UserError("--x is wrong; use --y")
    assert stop.value.code == 2 and capsys.readouterr().err == "bench: --x is wrong; use --y\n"


class _NanLoader:
    """120 batches of NaN images, counting how many the epoch takes."""

    def __init__(self):
        self.taken = 0

    def __len__(self):
        return 120

    def set_epoch(self, epoch):
        pass

    def __iter__(self):
        for _ in range(120):
            self.taken += 1
            yield torch.full((2, 3, 32, 32), float("nan")), torch.zeros(2, dtype=torch.long)


def test_a_diverged_loss_stops_the_epoch_at_the_next_check_not_at_its_end():
    from contextlib import nullcontext

    from handler.train.divergence import CHECK_EVERY, Diverged, DivergenceGuard
    from handler.train.loop import Step, train_epoch
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3072, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = Step(model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                scaler=torch.amp.GradScaler("cpu", enabled=False), autocast=nullcontext)
    bar = type("Bar", (), {"update": lambda self, n: None})()
    stop = type("Stop", (), {"should_stop": lambda self: False})()
    loader = _NanLoader()
    with pytest.raises(Diverged, match="epoch 1, step 0"):
        train_epoch(step, loader, 0, torch.device("cpu"), bar, stop=stop, guard=DivergenceGuard(torch.device("cpu"), 1))
    assert loader.taken == CHECK_EVERY < len(loader)


@pytest.mark.slow  # 13 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_pp_split_with_no_full_batch_per_process_is_one_line(tmp_path):
    # pp drops the last partial batch (fixed micro-batch shapes): 12 images never fill 16.
    proc = run_cli(["--mode", "pp", "--num_gpu", 1, "--dataset", "synthetic", "--synthetic-train", 12,
                    "--synthetic-test", 8, "--valid-size", 0, "--batch-size", 16, "--epochs", 1, "--model", "resnet20",
                    "--save", "none", "--data", tmp_path / "data", "--ckpt", tmp_path / "ckpt"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "12 training images give no full batch of 16 per process; use a smaller --batch-size" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_nan_weights_are_never_saved_over_the_last_good_checkpoint(tmp_path):
    from handler.train.divergence import Diverged
    from handler.train.trainer import _save
    raw = torch.nn.Linear(2, 2)
    with torch.no_grad():
        raw.weight[0, 0] = float("inf")
    with pytest.raises(Diverged, match="the weights hold NaN/inf after epoch 3, step 7; nothing was saved"):
        _save(Config(ckpt=str(tmp_path)), PlainState(), raw=raw, optimizer=None, scheduler=None, scaler=None,
              epochs_done=3, step=7, best_acc=0.0, history=[])
    assert os.listdir(tmp_path) == []


def test_fsdp_keeps_the_shards_that_an_earlier_best_pt_names(tmp_path):
    from handler.FSDP.checkpoint import ShardedState
    for name in ("shards-e1", "shards-e2", "shards-e3"):
        (tmp_path / name).mkdir()
    torch.save({"shards": "shards-e1"}, tmp_path / "best.pt")
    ShardedState().keep(str(tmp_path), {"shards": "shards-e3"}, best=None)
    assert sorted(os.listdir(tmp_path)) == ["best.pt", "shards-e1", "shards-e3"]


def test_a_loader_pass_short_of_its_images_fails_the_bench():
    from bench.loaders import timed_pass
    loader = type("Short", (), {"set_epoch": lambda self, e: None,
                                "__iter__": lambda self: iter([(None, [0, 1, 2])])})()
    with pytest.raises(RuntimeError, match="short yielded 3 images in a pass over 4"):
        timed_pass("short", loader, torch.device("cpu"), 4)()


@pytest.mark.slow  # a 2-rank fsdp run for one check: CI's slow step (pytest.ini)
def test_fsdp_evaluates_a_test_set_whose_shards_differ_by_a_batch(tmp_path):
    # 33 test images over 2 ranks of 16: rank 0 has two batches, rank 1 one; FSDP's forward
    # is a collective, so rank 1 runs a dummy forward (counted nowhere) beside rank 0's second.
    proc = run_cli(["--mode", "fsdp", "--num_gpu", 2, "--dataset", "synthetic", "--synthetic-train", 64,
                    "--synthetic-test", 33, "--valid-size", 0, "--batch-size", 32, "--epochs", 1, "--model", "resnet20",
                    "--save", "none", "--data", tmp_path / "data", "--ckpt", tmp_path / "ckpt"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = json.loads((tmp_path / "ckpt" / "metrics.json").read_text())
    assert m["test"]["samples"] == 33


def test_a_sharded_checkpoint_resumed_by_pp_names_fsdp():
    from handler.PP.checkpoint import PipelineState
    with pytest.raises(UserError, match="sharded \\(fsdp\\) state; resume it with --mode fsdp"):
        PipelineState().restore({"shards": "shards-e1"}, "last.pt", model=None, optimizer=None)


def test_pp_says_which_training_images_make_no_full_batch_and_forks_its_loader_workers(capsys):
    import numpy as np
    from handler.data.dataset import Splits
    from handler.PP.loader import get_PP_loader
    images = lambda n: np.zeros((n, 32, 32, 3), np.uint8)  # noqa: E731
    labels = lambda n: np.arange(n, dtype=np.int64) % 10  # noqa: E731
    splits = Splits(train=(images(10), labels(10)), valid=(images(0), labels(0)), test=(images(4), labels(4)),
                    classes=[str(i) for i in range(10)])
    cfg = Config(mode="pp", batch_size=4, workers=1, world_size=2, rank=0)
    loaders = get_PP_loader(cfg, splits)
    assert "pp: the last 2 training images of each epoch make no full batch of 4" in capsys.readouterr().err
    assert len(loaders.train) == 2
    assert loaders.train.inner.loader.multiprocessing_context.get_start_method() == "fork"


def test_pp_on_a_torch_without_pipelining_is_one_line(monkeypatch):
    # torch before 2.4 has no torch.distributed.pipelining (schedule.py then holds None); no
    # such torch can be installed beside CI's, so the import's outcome is set here.
    from handler.PP import schedule
    monkeypatch.setattr(schedule, "PipelineStage", None)
    with pytest.raises(UserError, match="--mode pp needs torch.distributed.pipelining from torch 2.6 or newer; "
                                        f"this is torch {re.escape(torch.__version__)}: upgrade torch"):
        schedule.require_pipelining()
