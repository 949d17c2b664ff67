"""handler/runtime/machine.py's checks, each ending in one line that names the fix. Only the CUDA
calls themselves (a kernel on GPU i, a copy from GPU a to GPU b) are replaced: this machine has
no GPU, and a broken GPU cannot be made on purpose. Everything around them runs as it is.
`run_checks` is what the launcher's child process runs (tests/machine/test_machine_child.py
runs it in the child)."""
import time

import pytest

from handler.DDP.utils import initialize_group
from handler.runtime import machine
from handler.runtime.errors import UserError
from handler.train.config import Config
from tests.conftest import free_port



def fake_cuda(monkeypatch, *, kernel=lambda i: 16.0, copy=lambda a, b: True):
    monkeypatch.setattr(machine, "_cuda_kernel", kernel)
    monkeypatch.setattr(machine, "_cuda_copy", copy)


def test_a_gpu_without_kernels_for_this_torch_stops_in_one_line_naming_the_setup(monkeypatch):
    def kernel(index):
        if index == 1:
            raise RuntimeError("CUDA error: no kernel image is available for execution on the device\nmore")
        return 16.0
    fake_cuda(monkeypatch, kernel=kernel)
    with pytest.raises(UserError, match=r"^GPU 1 cannot run this torch's kernels \(CUDA error: no kernel image .*"
                                        r"scripts/setup.sh") as err:
        machine.run_checks(2, "dp", nccl=False)
    assert "\n" not in str(err.value)


def test_broken_peer_copies_refuse_dp_unless_told_to_go_on_and_warn_ddp(monkeypatch):
    fake_cuda(monkeypatch, copy=lambda a, b: (a, b) != (0, 1))
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    with pytest.raises(UserError, match=r"copies 0->1 return wrong values .*DataParallel would train on garbage.*"
                                        "NCCL_P2P_DISABLE=1.*HARNESS_ALLOW_BROKEN_PEERS=1"):
        machine.run_checks(2, "dp", nccl=False)
    monkeypatch.setenv("HARNESS_ALLOW_BROKEN_PEERS", "1")
    lines = machine.run_checks(2, "dp", nccl=False)
    monkeypatch.delenv("HARNESS_ALLOW_BROKEN_PEERS")
    lines += machine.run_checks(2, "ddp", nccl=True)
    assert len(lines) == 2 and all("set NCCL_P2P_DISABLE=1" in line for line in lines)


def test_good_gpus_pass_silently_and_a_cpu_run_asks_cuda_nothing(monkeypatch, capsys):
    fake_cuda(monkeypatch)
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    assert machine.run_checks(2, "ddp", nccl=True) == []
    fake_cuda(monkeypatch, kernel=lambda i: pytest.fail("a CPU run touched CUDA"))
    monkeypatch.setattr(machine, "checks_in_child", lambda *a, **k: pytest.fail("a CPU run started the GPU checks"))
    machine.check_machine(Config(), one_process=False)
    assert "GPU" not in capsys.readouterr().err


def test_a_small_dev_shm_is_named_with_nccl_shm_disable(monkeypatch):
    monkeypatch.delenv("NCCL_SHM_DISABLE", raising=False)
    warning = machine.check_shm(min_bytes=1 << 60)  # no /dev/shm is that big: this one is "too small"
    assert warning.startswith("warning: /dev/shm is ") and "NCCL_SHM_DISABLE=1" in warning
    assert machine.check_shm(min_bytes=1) == ""
    monkeypatch.setenv("NCCL_SHM_DISABLE", "1")
    assert machine.check_shm(min_bytes=1 << 60) == ""


def test_a_group_that_does_not_form_within_the_bound_names_nccl_p2p_disable(capsys):
    """Rank 0 of 2 alone: the peer never comes, as when NCCL hangs over broken peer-to-peer."""
    started = time.monotonic()
    with pytest.raises(Exception):
        initialize_group(0, "127.0.0.1", free_port(), 2, use_cuda=False, timeout_s=2, start_bound_s=0.3)
    assert time.monotonic() - started < 30
    err = capsys.readouterr().err
    assert "the process group has not formed after 0 s" in err and "NCCL_P2P_DISABLE=1" in err


def test_launch_profiles_without_the_cpu_sampling_that_warns_in_unprivileged_containers():
    """CPU sampling and context-switch tracing need perf events, which an unprivileged container
    refuses with a warning (perf_event_paranoid); launch.sh's nsys options turn both off."""
    import subprocess
    from tests.conftest import ROOT
    opts = subprocess.run(["bash", "-c", f'source {ROOT}/scripts/nsys_options.sh && printf "%s\\n" "${{NSYS_PROFILE_OPTS[@]}}"'],
                          capture_output=True, text=True, check=True).stdout.split()
    assert "--sample=none" in opts and "--cpuctxsw=none" in opts


def test_gpu_check_reports_every_finding_as_its_one_line(monkeypatch, tmp_path):
    from scripts.gpu_check_report import write_reports
    monkeypatch.delenv("NCCL_SHM_DISABLE", raising=False)
    fake_cuda(monkeypatch, copy=lambda a, b: False)
    monkeypatch.setattr(machine, "SHM_MIN_BYTES", 1)
    lines = machine.run_checks(2, "ddp", nccl=True)  # what findings(2) runs in its child
    assert len(lines) == 1 and "copies 0->1, 1->0 return wrong values" in lines[0]
    markdown, _ = write_reports([], {"machine_checks": lines}, tmp_path)
    assert lines[0] in markdown.read_text()


def test_a_copy_that_fails_outright_counts_as_broken(monkeypatch):
    def copy(a, b):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    fake_cuda(monkeypatch, copy=copy)
    assert "copies 0->1, 1->0 return wrong values" in machine.check_peer_copies(2, "ddp")
