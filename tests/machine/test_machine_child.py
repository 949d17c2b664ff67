"""The machine checks hold no CUDA context past themselves (handler/runtime/machine.py): the
launcher runs them in a short-lived child, a torchrun worker checks only its own GPU after
set_device, a hung GPU<->GPU copy is named within a bound, and the compute mode is read from
nvidia-smi. No GPU here: the CUDA calls (a kernel on GPU i, a copy a->b, set_device) and
nvidia-smi are the boundary, replaced; in the child by a sitecustomize on its PYTHONPATH."""
import dataclasses
import json
import os
import time

import pytest

from handler.runtime import machine
from handler.runtime.errors import UserError
from handler.train.config import Config
from tests.conftest import ROOT

GPU_DDP = Config(mode="ddp", use_cuda=True, num_gpu=2, device="cuda:0")

STAND_IN = """
import json, os, time
from handler.runtime import machine
record = os.environ["STAND_IN_RECORD"]
def note(what):
    with open(record, "a") as f:
        f.write(json.dumps([os.getpid(), *what]) + "\\n")
def kernel(index):
    note(["kernel", index])
    return 16.0
def copy(a, b):
    note(["copy", a, b])
    if os.environ.get("STAND_IN_COPY") == "hang":
        time.sleep(3600)
    return True
machine._cuda_kernel, machine._cuda_copy = kernel, copy
"""


@pytest.fixture
def child_cuda(tmp_path, monkeypatch):
    """The child's CUDA calls are stand-ins that record (pid, call); the parent's must not run."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{ROOT}")
    monkeypatch.setenv("STAND_IN_RECORD", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("PATH", f"{smi(tmp_path, ['Default', 'Default'])}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(machine, "_cuda_kernel", lambda i: pytest.fail("the launcher ran a kernel itself"))
    monkeypatch.setattr(machine, "_cuda_copy", lambda a, b: pytest.fail("the launcher copied itself"))

    def calls():
        path = tmp_path / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return calls


def smi(tmp_path, modes):
    """A stand-in nvidia-smi answering --query-gpu=compute_mode; its folder, for PATH."""
    folder = tmp_path / "smi"
    folder.mkdir(exist_ok=True)
    (folder / "nvidia-smi").write_text("#!/bin/sh\ncase \"$1\" in --query-gpu=compute_mode) "
                                       + "; ".join(f"echo '{m}'" for m in modes) + " ;; *) exit 9 ;; esac\n")
    (folder / "nvidia-smi").chmod(0o755)
    return folder


def test_the_launcher_checks_every_gpu_in_a_child_that_is_gone_before_the_ranks_start(child_cuda, capsys):
    machine.check_machine(GPU_DDP, one_process=False)
    calls = child_cuda()
    assert {pid for pid, *_ in calls} != {os.getpid()} and len({pid for pid, *_ in calls}) == 1
    assert [c[1:] for c in calls] == [["kernel", 0], ["kernel", 1], ["copy", 0, 1], ["copy", 1, 0]]
    assert "GPU" not in capsys.readouterr().err


def test_a_hung_gpu_to_gpu_copy_is_named_in_one_line_within_its_bound(child_cuda, monkeypatch, capsys):
    monkeypatch.setenv("STAND_IN_COPY", "hang")
    monkeypatch.setattr(machine, "COPIES_BOUND_S", 2.0)
    started = time.monotonic()
    machine.check_machine(GPU_DDP, one_process=False)
    lines = capsys.readouterr().err.splitlines()
    assert time.monotonic() - started < 60
    assert len(lines) == 1 and "did not finish within 2 s" in lines[0]
    assert "NCCL_P2P_DISABLE=1" in lines[0] and "IOMMU" in lines[0] and "ACS" in lines[0]
    with pytest.raises(UserError, match=r"did not finish within 2 s.*DataParallel would hang.*NCCL_P2P_DISABLE=1"):
        machine.check_machine(dataclasses.replace(GPU_DDP, mode="dp"), one_process=True)
    assert not [pid for pid in child_pids(child_cuda()) if alive(pid)], "a hung child was left running"


def child_pids(calls):
    return {pid for pid, *_ in calls}


def alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_gpu_checks_findings_come_from_a_child_too(child_cuda, monkeypatch):
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    assert machine.findings(2) == []
    assert child_pids(child_cuda()) and os.getpid() not in child_pids(child_cuda())


def test_a_torchrun_worker_checks_only_its_own_gpu_after_set_device(monkeypatch):
    import torch
    for key, value in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
                           MASTER_ADDR="127.0.0.1").items():
        monkeypatch.setenv(key, value)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("set_device", index)))
    monkeypatch.setattr(machine, "_cuda_kernel", lambda index: calls.append(("kernel", index)) or 16.0)
    monkeypatch.setattr(machine, "_cuda_copy", lambda a, b: pytest.fail("a worker copied between GPUs"))
    monkeypatch.setattr(machine, "checks_in_child", lambda *a, **k: pytest.fail("a worker checked every GPU"),
                        raising=False)
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    machine.check_machine(GPU_DDP, one_process=False)
    assert calls == [("set_device", 1), ("kernel", 1)]


@pytest.mark.parametrize("mode", ["dp", "ddp", "ddp_dali", "fsdp", "pp"])
def test_exclusive_process_gpus_get_one_line_saying_what_it_means_for_the_mode(mode, child_cuda, tmp_path,
                                                                               monkeypatch, capsys):
    monkeypatch.setenv("PATH", f"{smi(tmp_path, ['Exclusive_Process', 'Default'])}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    machine.check_machine(dataclasses.replace(GPU_DDP, mode=mode), one_process=mode == "dp")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: GPU 0 (as nvidia-smi numbers them) in compute mode "
                                                   "EXCLUSIVE_PROCESS")
    assert lines[0].endswith(machine.EXCLUSIVE_MEANING[mode])


def test_a_prohibited_gpu_stops_the_run_in_one_line_before_any_check(child_cuda, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{smi(tmp_path, ['Default', 'Prohibited'])}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UserError, match=r"^GPU 1 .* PROHIBITED: .*CUDA_VISIBLE_DEVICES.*nvidia-smi -c DEFAULT"):
        machine.check_machine(GPU_DDP, one_process=False)
    assert child_cuda() == []


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_more_torchrun_workers_than_gpus_stop_in_check_local_ranks_one_line(amp, monkeypatch):
    """--nproc_per_node 4 on 2 GPUs: 'invalid device ordinal' came out as 'GPU 2 cannot run this
    torch's kernels', and with --amp bf16 as a traceback from the capability query."""
    import torch
    from handler.modes import parse_config
    for key, value in dict(RANK="3", WORLD_SIZE="4", LOCAL_RANK="3", LOCAL_WORLD_SIZE="4",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT="29500").items():
        monkeypatch.setenv(key, value)

    def capability(index):
        if index >= 2:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return (9, 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError) as err:
        parse_config(["--mode", "ddp", "--amp", amp], cuda_count=2)
    assert str(err.value).startswith("LOCAL_RANK 3 of 4 processes on this node but only 2 GPU(s) are visible")
    assert "torchrun --nproc_per_node 2" in str(err.value)
