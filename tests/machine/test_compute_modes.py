"""The compute modes judged are those of the GPUs the run uses (handler/runtime/compute_modes.py):
nvidia-smi lists every GPU whatever CUDA_VISIBLE_DEVICES says, so its rows are matched to the
run's GPUs by the UUID or PCI bus id torch reports in the checks' child, else (named) by
CUDA_VISIBLE_DEVICES. No GPU here: torch's answers are the stand-in's STAND_IN_UUIDS (the CUDA
boundary, in the child) and nvidia-smi is a stand-in script (tests/machine/test_machine_child.py)."""
import dataclasses
import os

import pytest

from handler.runtime import machine
from handler.runtime.compute_modes import compute_mode_lines, matched, matched_by_variable, smi_rows
from handler.runtime.errors import UserError
from tests.machine.test_machine_child import GPU_DDP, child_cuda, smi  # noqa: F401 (child_cuda: a fixture)


def uuid(index: int) -> str:
    """The stand-in nvidia-smi's GPU `index`, as torch reports a UUID: bare, lower case."""
    return f"{index:08x}-1111-2222-3333-444455556666"


def use(monkeypatch, tmp_path, modes, visible, torch_uuids):
    monkeypatch.setenv("PATH", f"{smi(tmp_path, modes)}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    if torch_uuids:
        monkeypatch.setenv("STAND_IN_UUIDS", ",".join(torch_uuids))


@pytest.mark.parametrize("torch_tells", [True, False])
def test_a_hidden_prohibited_gpu_does_not_stop_a_run_on_a_visible_one(torch_tells, child_cuda, tmp_path,
                                                                     monkeypatch, capsys):
    # Before: GPU 1 PROHIBITED refused a run with CUDA_VISIBLE_DEVICES=0, advising to hide GPU 1.
    use(monkeypatch, tmp_path, ["Default", "Prohibited"], "0", [uuid(0)] if torch_tells else [])
    machine.check_machine(dataclasses.replace(GPU_DDP, mode="dp", num_gpu=1), one_process=True)
    assert [c[1:] for c in child_cuda()] == [["kernel", 0]]
    assert capsys.readouterr().err == ""


def test_a_visible_prohibited_gpu_is_refused_by_the_number_the_run_gives_it(child_cuda, tmp_path, monkeypatch):
    # CUDA_VISIBLE_DEVICES=2,0: the run's GPU 0 is nvidia-smi's GPU 2.
    use(monkeypatch, tmp_path, ["Default", "Default", "Prohibited"], "2,0", [uuid(2), uuid(0)])
    with pytest.raises(UserError) as err:
        machine.check_machine(GPU_DDP, one_process=False)
    line = str(err.value)
    assert line.startswith("GPU 0 (nvidia-smi's GPU 2) in compute mode PROHIBITED: no process may use it")
    assert "nvidia-smi -i 2 -c DEFAULT" in line and "matched through" not in line
    assert child_cuda() == []


def test_the_exclusive_process_note_names_only_the_runs_gpus(child_cuda, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    use(monkeypatch, tmp_path, ["Exclusive_Process", "Default", "Exclusive_Process"], "1,2", [uuid(1), uuid(2)])
    machine.check_machine(GPU_DDP, one_process=False)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: GPU 1 (nvidia-smi's GPU 2) in compute mode "
                                                   "EXCLUSIVE_PROCESS, one process per GPU: ")


@pytest.mark.parametrize("visible, refused", [("GPU-00000001", True), ("GPU-00000000", False),
                                              ("GPU-00000001-1111-2222-3333-444455556666", True)])
def test_uuid_entries_of_cuda_visible_devices_name_the_gpu_when_torch_cannot(visible, refused, child_cuda,
                                                                            tmp_path, monkeypatch):
    use(monkeypatch, tmp_path, ["Default", "Prohibited"], visible, [])
    config = dataclasses.replace(GPU_DDP, mode="dp", num_gpu=1)
    if not refused:
        machine.check_machine(config, one_process=True)
        return
    with pytest.raises(UserError, match=r"^GPU 0 \(nvidia-smi's GPU 1\) in compute mode PROHIBITED \(matched "
                                        r"through CUDA_VISIBLE_DEVICES as nvidia-smi numbers GPUs"):
        machine.check_machine(config, one_process=True)


ROWS = smi_rows([("0", "GPU-aa", "00000000:17:00.0", "Default"), ("1", "GPU-bb", "00000000:65:00.0", "Prohibited")])


def test_torchs_order_wins_over_nvidia_smis_and_a_mig_device_matches_its_gpus_bus():
    # CUDA numbers fastest first: the run's GPU 0 may be nvidia-smi's 1. A MIG device's own UUID
    # is not in nvidia-smi's GPU rows; its PCI bus id is its GPU's.
    pairs = matched(ROWS, [("bb", None), ("mig-uuid-unknown", (0, 0x17, 0))])
    assert [(n, row.index) for n, row in pairs] == [(0, "1"), (1, "0")]
    note, refusal = compute_mode_lines("ddp", pairs)
    assert note == "" and refusal.startswith("GPU 0 (nvidia-smi's GPU 1) in compute mode PROHIBITED")


def test_the_fallback_reads_cuda_visible_devices_as_cuda_does():
    assert [(n, r.index) for n, r in matched_by_variable(ROWS, 2, None)] == [(0, "0"), (1, "1")]
    assert [(n, r.index) for n, r in matched_by_variable(ROWS, 2, "1,0")] == [(0, "1"), (1, "0")]
    assert [(n, r.index) for n, r in matched_by_variable(ROWS, 2, "GPU-b")] == [(0, "1")]
    assert matched_by_variable(ROWS, 2, "7,0") == []  # CUDA stops at the first entry naming no GPU
