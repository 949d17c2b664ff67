"""How the DDP-family modes size and time their process group (handler/DDP/utils.py,
handler/DDP/peers.py, handler/train/config.py): torchrun's world, a node with fewer GPUs
than local ranks, the NCCL timeout against the heartbeat's, the --sync-bn note."""
import dataclasses
import os
import subprocess
import sys

import pytest
import torch

from handler.DDP import peers
from handler.DDP.utils import NCCL_MARGIN_S, group_timeout_s, initialize_group
from handler.runtime.errors import UserError
from handler.train.config import Config
from tests.conftest import ROOT, SLACK

# Each torchrun worker parses command lines (separated by "::") as train_cifar.py does, on a
# node that claims 8 GPUs, and prints the world it got or its one error line. Only the CUDA
# boundary is faked (torch.cuda.device_count/is_available): this machine has no GPU, and
# nothing past parsing touches one. One torchrun for both cases: each costs ~10 s here.
PARSE = """
import os, sys, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 8
from handler.modes import parse_config
from handler.runtime.errors import UserError
for argv in " ".join(sys.argv[1:]).split(" :: "):
    try:
        cfg = parse_config(argv.split())
        print(f"world {cfg.world_size} num_gpu {cfg.num_gpu}", flush=True)
    except UserError as err:
        print(f"rank {os.environ['RANK']}: {err}", flush=True)
"""


@pytest.mark.slow  # 21 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_under_torchrun_its_world_size_decides_and_num_gpu_must_agree(tmp_path):
    script = tmp_path / "parse.py"
    script.write_text(PARSE)
    # 8 visible GPUs used to make a pp run of 8 stages, which resnet18 (4 stages) refused.
    cases = ["--mode pp --model resnet18 --dataset synthetic", "--mode ddp --num_gpu 4 --dataset synthetic"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master_addr=127.0.0.1", "--master_port=0", str(script), *" :: ".join(cases).split()],
                          cwd=ROOT, capture_output=True, text=True, timeout=SLACK * 20,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout.splitlines()
    assert out.count("world 2 num_gpu 2") == 2, proc.stdout
    refusal = "--num_gpu 4 but torchrun started 2 processes (WORLD_SIZE); drop --num_gpu or use --num_gpu 2"
    assert sorted(out[i] for i in range(len(out)) if refusal in out[i]) == [f"rank {r}: {refusal}" for r in (0, 1)]


def test_more_local_ranks_than_gpus_stop_in_one_line_before_set_device(monkeypatch):
    # No GPU here: the CUDA boundary says 2 GPUs; set_device must never be reached.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: pytest.fail(f"set_device({i}) called"))
    for name, value in {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match="LOCAL_RANK 3 but only 2 GPU.s. are visible on this node; "
                                        "start at most 2 processes per node"):
        initialize_group(0, "127.0.0.1", 1, 4, use_cuda=True, timeout_s=30)


@pytest.mark.parametrize("timeout_s", [1, 9, 30, 120, 1800])
def test_nccl_gives_up_well_after_the_heartbeat_names_a_silent_peer(timeout_s):
    limit = peers.silent_after(timeout_s)
    # The heartbeat notices within a beat past its limit; NCCL's watchdog (which aborts the
    # rank) waits NCCL_MARGIN_S (30 s) past both that limit and --dist-timeout.
    assert NCCL_MARGIN_S >= 10 * peers.BEAT_S
    assert group_timeout_s("nccl", timeout_s) >= limit + NCCL_MARGIN_S
    assert group_timeout_s("nccl", timeout_s) >= timeout_s + NCCL_MARGIN_S
    # gloo's timeout is --dist-timeout itself, and the heartbeat's limit sits well inside it.
    assert group_timeout_s("gloo", timeout_s) == timeout_s
    assert limit <= max(peers.MIN_SILENCE_S, timeout_s / 3)


def test_sync_bn_on_gpu_records_its_per_layer_sync_in_the_metrics_notes():
    from handler.DDP.mode import strategy
    from handler.DDP.model import SYNC_BN_NOTE
    cfg = Config(mode="ddp", use_cuda=True, sync_bn=True)
    assert SYNC_BN_NOTE in strategy(cfg).notes
    assert "once per BatchNorm layer per step" in SYNC_BN_NOTE
    assert strategy(dataclasses.replace(cfg, sync_bn=False)).notes == ()


def test_the_flight_recorder_dumps_into_the_run_folder_or_says_this_torch_cannot(tmp_path, monkeypatch):
    from torch._C import _distributed_c10d as c10d
    from handler.DDP import flight_recorder as fr
    for name in (fr.BUFFER_SIZE, fr.DUMP_FILE, "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        monkeypatch.setenv(name, "")  # so that monkeypatch removes what enable() sets
        monkeypatch.delenv(name)
    monkeypatch.setattr(fr, "_folder", None)
    assert fr.dump(0) == ""  # not enabled: nothing to say
    fr.enable(str(tmp_path / "ckpt"), use_cuda=False)
    assert os.environ[fr.DUMP_FILE] == str(tmp_path / "ckpt" / "flight_recorder" / "rank_")
    line = fr.dump(3)  # no group here: an empty record, still a file torchfrtrace reads
    assert line == (f"flight recorder: {tmp_path}/ckpt/flight_recorder/rank_3, read every rank's with "
                    f"`torchfrtrace {tmp_path}/ckpt/flight_recorder`")
    assert (tmp_path / "ckpt" / "flight_recorder" / "rank_3").is_file()
    # torch 2.6 has no general dump (only NCCL's): the line says so and the run goes on.
    monkeypatch.delattr(c10d, "_dump_fr_trace")
    assert fr.dump(3).startswith("no Flight Recorder dump: this torch cannot dump a gloo group's record")


def test_the_spawning_process_holds_the_rendezvous_port_until_the_ranks_are_done():
    """The port a run gets is bound by its launcher from the start (regression: it was only
    chosen free, and another program took it before rank 0 bound it: EADDRINUSE in CI).
    A port already held is one line naming it."""
    import socket

    from handler.DDP.utils import held_store
    with held_store("127.0.0.1", 0) as port:
        assert port > 0
        with socket.socket() as s, pytest.raises(OSError):
            s.bind(("127.0.0.1", port))
        with pytest.raises(UserError, match=f"--port {port} on 127.0.0.1 is not available"), \
                held_store("127.0.0.1", port):
            pass
