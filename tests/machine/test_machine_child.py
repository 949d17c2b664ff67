"""The machine checks hold no CUDA context past themselves (handler/runtime/machine.py): the
launcher runs them in a short-lived child, a torchrun worker checks only its own GPU after
set_device, a hung GPU<->GPU copy is named within a bound, and the compute mode is read from
nvidia-smi. No GPU here: the CUDA calls (a kernel on GPU i, a copy a->b, set_device, the
GPUs' UUIDs) and nvidia-smi are the boundary, replaced; in the child by a sitecustomize on its
PYTHONPATH, whose calls can also crash (os.abort, as a driver fault would) or hang, and which
can print a banner first, as clusters' sitecustomize files do."""
import dataclasses
import json
import os
import time

import pytest

from handler.runtime import machine
from handler.runtime.compute_modes import EXCLUSIVE_MEANING
from handler.runtime.errors import UserError
from handler.train.config import Config
from tests.conftest import ROOT

GPU_DDP = Config(mode="ddp", use_cuda=True, num_gpu=2, device="cuda:0")

STAND_IN = """
import atexit, json, os, subprocess, sys, time
from handler.runtime import machine
if os.environ.get("STAND_IN_BANNER"):  # as a cluster's sitecustomize prints on `module load`
    print(os.environ["STAND_IN_BANNER"], flush=True)
record = os.environ["STAND_IN_RECORD"]
def note(what):
    with open(record, "a") as f:
        f.write(json.dumps([os.getpid(), *what]) + "\\n")
def fault(call):
    how = os.environ.get("STAND_IN_" + call.upper())
    if how == "hang":
        time.sleep(3600)
    if how == "fork-abort":  # a grandchild that keeps the child's stdout open past the crash
        note(["grandchild", subprocess.Popen(["sleep", "60"]).pid])
    if how in ("abort", "fork-abort"):
        print("stand-in driver: an illegal memory access in the " + call, file=sys.stderr, flush=True)
        os.abort()
def kernel(index):
    note(["kernel", index])
    fault("kernel")
    return 16.0
def copy(a, b):
    note(["copy", a, b])
    fault("copy")
    return True
def identities(count):
    uuids = os.environ.get("STAND_IN_UUIDS")
    return [(uuid, None) for uuid in uuids.split(",")][:count] if uuids else []
def slow_exit(marker):
    time.sleep(1.5)  # a CUDA teardown or nsys's flush at exit
    open(marker, "w").close()
if os.environ.get("STAND_IN_EXIT_MARKER"):
    atexit.register(slow_exit, os.environ["STAND_IN_EXIT_MARKER"])
machine._cuda_kernel, machine._cuda_copy, machine._cuda_identities = kernel, copy, identities
"""


@pytest.fixture
def child_cuda(tmp_path, monkeypatch):
    """The child's CUDA calls are stand-ins that record (pid, call); the parent's must not run."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(STAND_IN)
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{ROOT}")
    monkeypatch.setenv("STAND_IN_RECORD", str(tmp_path / "calls.jsonl"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the stand-in GPUs are visible
    monkeypatch.setenv("PATH", f"{smi(tmp_path, ['Default', 'Default'])}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(machine, "_cuda_kernel", lambda i: pytest.fail("the launcher ran a kernel itself"))
    monkeypatch.setattr(machine, "_cuda_copy", lambda a, b: pytest.fail("the launcher copied itself"))

    def calls():
        path = tmp_path / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return calls


def smi(tmp_path, modes):
    """A stand-in nvidia-smi answering the compute-mode queries as the driver does, for every GPU
    (GPU i has UUID GPU-0000000i-..., bus 0x1i); its folder, for PATH."""
    folder = tmp_path / "smi"
    folder.mkdir(exist_ok=True)
    rows = [f"{i}, GPU-{i:08x}-1111-2222-3333-444455556666, 00000000:{0x10 + i:02X}:00.0, {m}"
            for i, m in enumerate(modes)]
    (folder / "nvidia-smi").write_text(
        "#!/bin/sh\ncase \"$1\" in\n"
        + "--query-gpu=index,uuid,pci.bus_id,compute_mode) " + "; ".join(f"echo '{row}'" for row in rows) + " ;;\n"
        + "--query-gpu=compute_mode) " + "; ".join(f"echo '{m}'" for m in modes) + " ;;\n*) exit 9 ;;\nesac\n")
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


@pytest.mark.parametrize("call, stage", [("kernel", "kernels"), ("copy", "copies")])
def test_a_child_that_crashes_is_named_as_a_crash_with_its_signal_and_last_stderr_line(call, stage, child_cuda,
                                                                                      monkeypatch, capsys):
    # Before: a crash in the copies read as the 30-s IOMMU/ACS hang (and refused dp for it), its stderr dropped.
    monkeypatch.setenv(f"STAND_IN_{call.upper()}", "abort")
    started = time.monotonic()
    with pytest.raises(UserError) as err:
        machine.check_machine(dataclasses.replace(GPU_DDP, mode="dp"), one_process=True)
    line = str(err.value)
    assert time.monotonic() - started < 60 and "\n" not in line
    assert f"died of SIGABRT in the {stage} stage" in line, line
    assert f"stand-in driver: an illegal memory access in the {call}" in line
    assert "IOMMU" not in line and "did not finish" not in line
    if call == "copy":  # the NCCL modes can turn peer-to-peer off: a warning, as for a hang
        assert "DataParallel would crash the same way" in line and machine.GO_ON in line
        machine.check_machine(GPU_DDP, one_process=False)
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("warning: the GPU checks") and "SIGABRT" in lines[0]
        assert lines[0].endswith("NCCL's peer-to-peer may crash the same way: set NCCL_P2P_DISABLE=1")


@pytest.mark.parametrize("banner", ["Lmod: loaded cuda/12.4 (not JSON)", '{"warnings": ["a banner shaped as an answer"]}',
                                    "[1, 2]"])
def test_a_banner_on_the_childs_stdout_is_passed_over_and_the_checks_still_answer(banner, child_cuda, monkeypatch,
                                                                                  capsys):
    # Before: the banner raised JSONDecodeError in the launcher (a traceback) and left the child running.
    monkeypatch.setenv("STAND_IN_BANNER", banner)
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    machine.check_machine(GPU_DDP, one_process=False)
    calls = child_cuda()
    assert [c[1:] for c in calls] == [["kernel", 0], ["kernel", 1], ["copy", 0, 1], ["copy", 1, 0]]
    assert capsys.readouterr().err == ""
    assert not [pid for pid in child_pids(calls) if alive(pid)], "the child was left running"


def test_a_child_that_crashes_while_its_grandchild_holds_its_stdout_is_a_crash_not_a_hang(child_cuda, monkeypatch):
    # Before: the launcher waited for the end of the child's output, which the grandchild held open:
    # the crash read as a hang after the whole bound (120 s; 30 here).
    monkeypatch.setenv("STAND_IN_KERNEL", "fork-abort")
    monkeypatch.setattr(machine, "KERNELS_BOUND_S", 30.0)
    started = time.monotonic()
    try:
        with pytest.raises(UserError, match=r"died of SIGABRT in the kernels stage \(stand-in driver: an illegal"):
            machine.check_machine(GPU_DDP, one_process=False)
        assert time.monotonic() - started < 20
    finally:
        for _, what, pid in (c for c in child_cuda() if c[1] == "grandchild"):
            os.kill(pid, 9)  # the grandchild the stand-in started, by its PID
    assert not [pid for pid, what, *_ in child_cuda() if what == "kernel" and alive(pid)], "the child was left"


def test_a_child_silent_past_its_bound_before_the_copies_is_a_hang_and_is_ended(child_cuda, monkeypatch):
    monkeypatch.setenv("STAND_IN_KERNEL", "hang")
    monkeypatch.setattr(machine, "KERNELS_BOUND_S", 6.0)  # the child's start is bounded by it too
    with pytest.raises(UserError, match=r"did not finish within 6 s in the kernels stage; run nvidia-smi"):
        machine.check_machine(GPU_DDP, one_process=False)
    assert not [pid for pid in child_pids(child_cuda()) if alive(pid)], "a hung child was left running"


def test_a_child_that_answered_is_let_exit_not_killed_mid_teardown(child_cuda, tmp_path, monkeypatch):
    # Before: poll() right after the answer line found it still exiting and SIGKILLed it.
    marker = tmp_path / "exited"
    monkeypatch.setenv("STAND_IN_EXIT_MARKER", str(marker))
    machine.check_machine(GPU_DDP, one_process=False)
    assert marker.exists(), "the child was killed before its exit handlers ran"


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
    assert len(lines) == 1 and lines[0].startswith("note: GPU 0 in compute mode EXCLUSIVE_PROCESS (matched "
                                                   "through CUDA_VISIBLE_DEVICES")
    assert lines[0].endswith(EXCLUSIVE_MEANING[mode])


def test_a_prohibited_gpu_stops_the_run_in_one_line_before_any_check(child_cuda, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{smi(tmp_path, ['Default', 'Prohibited'])}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UserError, match=r"^GPU 1 in compute mode PROHIBITED.*: no process may use it; leave it out "
                                        r"of CUDA_VISIBLE_DEVICES.*nvidia-smi -i 1 -c DEFAULT"):
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
