"""GPU paths proved without a GPU: bf16 only where it is native, the torch build for old GPUs
on a CUDA 13 driver, gpu_check stopped by SIGTERM, an nsys that makes no report, the proof
offline, budgets from measured times, and what a run leaves. docs/GPU_CHECK.md.

There is no GPU here: each test that needs one fakes only the CUDA boundary (torch.cuda's
device queries) or nvidia-smi (a stand-in script on PATH), and says so."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import bench.gpu as bench_gpu
from handler.runtime import cuda_build
from handler.runtime.errors import UserError
from tests.conftest import ROOT
from tests.proof.test_gpu_check import alive, gpu_check, planning
from scripts.gpu_check_machine import measured_times, nsys_problem  # noqa: E402
from scripts.gpu_check_run import Runner, run_all  # noqa: E402

V100 = ("Tesla V100-SXM2-16GB", (7, 0))
T4 = ("Tesla T4", (7, 5))
H100 = ("NVIDIA H100 80GB HBM3", (9, 0))


@pytest.fixture
def gpus_like(monkeypatch):
    """torch.cuda answers as on a machine with `count` GPUs of one kind; is_bf16_supported()
    says True as torch 2.4+ does on every CUDA GPU (it counts emulation)."""
    import torch

    from handler.runtime.devices import cuda_status

    def fake(kind, count=1):
        name, capability = kind
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
        cuda_status.cache_clear()
    yield fake
    cuda_status.cache_clear()


# --- bf16 where it is native only -------------------------------------------------------

@pytest.mark.parametrize("gpus", [1, 2])
def test_amp_bf16_is_refused_in_one_line_naming_fp16_on_a_gpu_without_native_bf16(gpus, gpus_like):
    from handler.modes import parse_config
    gpus_like(V100, count=2)
    with pytest.raises(UserError) as refused:
        parse_config(["--mode", "ddp", "--amp", "bf16", "--num_gpu", str(gpus)], cuda_count=2)
    line = str(refused.value)
    assert "\n" not in line and "--amp fp16" in line and "Tesla V100-SXM2-16GB" in line and "7.0" in line
    assert parse_config(["--mode", "ddp", "--amp", "fp16"], cuda_count=2).amp == "fp16"


def test_on_a_v100_pp_which_refuses_fp16_is_told_to_use_amp_off(gpus_like):
    from handler.modes import parse_config
    gpus_like(V100, count=2)
    with pytest.raises(UserError) as refused:
        parse_config(["--mode", "pp", "--amp", "bf16", "--num_gpu", "2"], cuda_count=2)
    assert "use --amp off (--mode pp refuses fp16 too)" in str(refused.value)


def test_amp_bf16_runs_on_ampere_and_newer(gpus_like):
    from handler.modes import parse_config
    gpus_like(H100, count=2)
    assert parse_config(["--mode", "ddp", "--amp", "bf16"], cuda_count=2).amp == "bf16"


@pytest.mark.slow  # 35 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_on_a_v100_gpu_check_skips_the_bf16_row_and_its_2_gpu_dp_row_uses_fp16(gpus_like, tmp_path, capsys,
                                                                             nsys_turn):
    gpus_like(V100, count=2)
    assert gpu_check.main(["--list", "--no-tests", "--out", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    bf16_row = next(line for line in listed.splitlines() if line.endswith(")") and "  bf16  (skipped" in line)
    assert "no native bf16" in bf16_row
    assert "2 GPUs: dp fp16 + activation checkpointing" in listed and "dp bf16" not in listed


@pytest.mark.slow  # 11 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_on_an_h100_gpu_check_runs_the_bf16_rows(gpus_like, tmp_path, capsys, nsys_turn):
    gpus_like(H100, count=2)
    assert gpu_check.main(["--list", "--no-tests", "--out", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "  bf16\n" in listed and "2 GPUs: dp bf16 + activation checkpointing" in listed


@pytest.mark.parametrize("kind, bf16", [(V100, False), (T4, False), (H100, True)])
def test_bench_gpu_times_bf16_only_where_it_is_native(kind, bf16, gpus_like):
    gpus_like(kind)
    assert ("bf16" in bench_gpu.precision_args()) is bf16 and "--channels-last" in bench_gpu.precision_args()


# --- the torch build for the GPU, not only the driver -------------------------------------

def stand_in_smi(folder, name, capability, cuda="13.0"):
    """An nvidia-smi on PATH as R580 answers: -L, the header, and --query-gpu=compute_cap."""
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$1" in
  -L) echo 'GPU 0: {name} (UUID: GPU-0)'; echo 'GPU 1: {name} (UUID: GPU-1)' ;;
  --query-gpu=compute_cap) echo '{capability}'; echo '{capability}' ;;
  *) echo '| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: {cuda}     |' ;;
esac
""")
    smi.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "TORCH_INDEX_URL")}
    return {**env, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("name, capability, index, dali", [
    ("Tesla V100-SXM2-16GB", "7.0", cuda_build.CU12_INDEX, "nvidia-dali-cuda120"),
    ("Tesla P100-PCIE-16GB", "6.0", cuda_build.CU12_INDEX, "nvidia-dali-cuda120"),
    ("Tesla T4", "7.5", "", "nvidia-dali-cuda130"),
    ("NVIDIA H100 80GB HBM3", "9.0", "", "nvidia-dali-cuda130")])
def test_on_a_cuda_13_driver_gpus_below_7_5_get_the_cuda_12_6_build(name, capability, index, dali, tmp_path):
    env = stand_in_smi(tmp_path / "bin", name, capability)
    done = subprocess.run([sys.executable, str(ROOT / "handler" / "runtime" / "cuda_build.py")], env=env,
                          capture_output=True, text=True, timeout=30)
    lines = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert lines["TORCH_INDEX_URL"].strip("'") == index and dali in lines["DALI_PACKAGE"], done.stdout
    assert ("below the 7.5" in lines["REASON"]) is bool(index)


def test_the_install_hint_for_a_v100_names_the_cuda_12_6_index(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", stand_in_smi(tmp_path / "bin", *("Tesla V100-SXM2-16GB", "7.0"))["PATH"])
    monkeypatch.delenv("TORCH_INDEX_URL", raising=False)
    assert cuda_build.smi_compute_capability() == (7, 0)
    assert f"--index-url {cuda_build.CU12_INDEX}" in cuda_build.install_hint((13, 0))
    assert "nvidia-dali-cuda120" in cuda_build.dali_install_hint()


# --- SIGTERM leaves nothing running --------------------------------------------------------

DRIVER = """
import sys
from argparse import Namespace
from pathlib import Path
sys.path.insert(0, {root!r})
from scripts import gpu_check
from scripts.gpu_check_plan import REHEARSAL, Check
out = Path({out!r})
checks = [Check("slow check", "pytest", ({test!r},)), Check("never started", "pytest", ({test!r},))]
env = gpu_check.environment(rehearsal=True)
args = Namespace(budget=0, part="1/1", rehearse=True)
sys.exit(gpu_check.run(checks, args, REHEARSAL, out, env))
"""

SLOW_TEST = """
import os, subprocess, time
def test_sleeps_with_a_child(tmp_path):
    child = subprocess.Popen(["sleep", "120"])
    with open({pids!r}, "w") as f:
        f.write(f"{{os.getpid()}} {{child.pid}}")
    time.sleep(120)
"""


def test_sigterm_ends_the_running_checks_processes_writes_the_report_and_exits_non_zero(tmp_path):
    # The check is a real gpu_check pytest check (its own session, a child of its own), as a
    # training run's spawned ranks would be; SIGTERM is what `timeout` and Slurm send.
    pids = tmp_path / "pids"
    test = tmp_path / "test_slow.py"
    test.write_text(SLOW_TEST.format(pids=str(pids)))
    script = DRIVER.format(root=str(ROOT), out=str(tmp_path / "out"), test=str(test))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2) and time.time() < deadline:
        time.sleep(0.1)
    check_pids = [int(p) for p in pids.read_text().split()]
    try:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        ended = time.time() + 10
        while any(alive(p) for p in check_pids) and time.time() < ended:
            time.sleep(0.1)
        assert not any(alive(p) for p in check_pids), "the check's processes outlived gpu_check"
    finally:
        for pid in check_pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "STOPPED by SIGTERM after 0 of 2 checks" in err
    rows = json.loads((tmp_path / "out" / "gpu_check.json").read_text())["checks"]
    assert [(r["check"], r["result"]) for r in rows] == [("slow check", "fail"), ("never started", "not run")]
    assert "SIGTERM" in rows[0]["detail"] and not (tmp_path / "out" / "data").exists()


# --- an nsys that makes no report ----------------------------------------------------------

def broken_nsys(folder):
    """An nsys like the one in Nsight Compute's folder: on PATH, but `profile` makes nothing."""
    folder.mkdir(exist_ok=True)
    (folder / "nsys").write_text("#!/bin/sh\necho 'nsys: the profiling target is missing from this install' >&2\n"
                                 "exit 1\n")
    (folder / "nsys").chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def test_an_nsys_that_makes_no_report_skips_the_profiled_row_with_the_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", broken_nsys(tmp_path / "bin"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # main sets it for --rehearse; restored after
    problem = nsys_problem()
    assert "made no report of a tiny run" in problem and "profiling target is missing" in problem
    assert gpu_check.main(["--rehearse", "--list", "--only", "profiled*", "--out", str(tmp_path)]) == 0
    listed = capsys.readouterr()
    assert f"profiled run (nsys)  (skipped: {problem})" in listed.out
    assert "skipping 1 row(s) (profiled run (nsys)): " in listed.err


def test_an_nsys_that_makes_reports_passes_the_probe(nsys_turn):
    if not subprocess.run(["bash", "-c", "command -v nsys"], capture_output=True).stdout:
        pytest.skip("no nsys on this machine")
    assert nsys_problem() == ""


# --- offline, with the torch the machine has -----------------------------------------------

@pytest.mark.slow  # an end-to-end run of 13-17 s: CI's slow step (the main run's 10 minutes)
def test_without_an_index_it_goes_offline_with_the_first_python_that_has_torch(tmp_path):
    # Port 9 on loopback: nothing listens, so the index probe fails at once, as offline.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "VIRTUAL_ENV")}
    env["GPU_CHECK_INDEX_URL"] = "http://127.0.0.1:9/simple/"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--rehearse", "--list", "--only", "ddp",
                           "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no package index answered within 5 s: running --offline" in proc.stderr
    assert f"--offline: using {ROOT}/.venv/bin/python (torch " in proc.stderr and "setup:" not in proc.stderr


def test_offline_on_one_gpu_fits_one_10_minute_command_and_names_each_missing_piece(gpus_like, tmp_path,
                                                                                    capsys, monkeypatch):
    gpus_like(H100, count=1)
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    monkeypatch.setenv("PATH", broken_nsys(tmp_path / "bin"))
    args = gpu_check.arguments(["--offline"])
    assert args.budget == gpu_check.OFFLINE_BUDGET_S < 600
    assert gpu_check.arguments(["--offline", "--budget", "300"]).budget == 300
    assert gpu_check.main(["--offline", "--list", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert sum("DALI" in line for line in err) == 1 and sum("nsys" in line for line in err) == 1
    assert sum("the 2-GPU pass (" in line and "needs a second GPU" in line for line in err) == 1


# --- budgets from measured times; what a run leaves ----------------------------------------

def test_budget_and_parts_use_the_last_measured_seconds(tmp_path, capsys):
    checks = planning.select(planning.plan(1, dali=True, nsys=True, pytest_ok=True, tests=False), ["ddp", "fsdp"])
    env = {"rehearsal": False, "gpu": "NVIDIA H100 80GB HBM3"}
    rows = [{"check": "ddp", "result": "pass", "seconds": 31.0}, {"check": "fsdp", "result": "fail", "seconds": 2.0}]
    (tmp_path / "gpu_check.json").write_text(json.dumps({"env": env, "checks": rows}))
    (tmp_path / "gpu_check_part1of2.json").write_text(json.dumps({"env": {**env, "gpu": "Tesla T4"}, "checks": [
        {"check": "fsdp", "result": "pass", "seconds": 99.0}]}))
    measured = measured_times(tmp_path, env)
    assert measured == {"ddp": 31.0}  # a failure may have ended early; another GPU's times differ
    assert planning.estimate_s(checks[0], planning.GPU, measured) == 31.0
    assert planning.estimate_s(checks[1], planning.GPU, measured) == planning.LAUNCH_S["cuda"]
    said = []
    results = run_all(checks, lambda check: "", lambda *a, **k: said.append(" ".join(a)), budget_s=20,
                      measured=measured)
    assert results[0].result == "not run" and "its measured time 31 s is over" in results[0].detail
    assert results[1].result == "pass"


def test_a_launch_still_running_at_the_budgets_end_is_stopped_and_its_row_says_so(tmp_path):
    # A check slower than its estimate must not carry the command past --budget (one
    # 10-minute command): its process group is stopped there.
    from scripts.gpu_check_run import BudgetSpent, timed
    runner = Runner(sys.executable, tmp_path, planning.REHEARSAL, budget_s=2)
    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(BudgetSpent, match="--budget 2 s ran out during this check"):
        runner.run(["bash", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], tmp_path / "run")
    assert time.monotonic() - started < 10
    deadline = time.time() + 10
    while alive(int(pidfile.read_text())) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(int(pidfile.read_text()))
    problem, _ = timed(lambda check: runner.run(["sleep", "60"], tmp_path / "again") and "", None, time.monotonic)
    assert problem.startswith("BudgetSpent: --budget 2 s ran out")


def test_a_run_keeps_no_checkpoints(tmp_path):
    # A stand-in interpreter writes the checkpoints train_cifar.py would and exits 0: the
    # Runner's own clean-up is what is tested, not training.
    python = tmp_path / "python"
    python.write_text('#!/bin/bash\nwhile [ $# -gt 0 ]; do [ "$1" = --ckpt ] && ckpt="$2"; '
                      '[ "$1" = --save ] && save="$2"; shift; done\n'
                      'mkdir -p "$ckpt/stages"; [ "${save:-ckpt}" = none ] || touch "$ckpt/last.pt" '
                      '"$ckpt/stages/stage0.pt"\necho "save=${save:-ckpt}" >> "$ckpt/saves"\n')
    python.chmod(0o755)
    runner = Runner(str(python), tmp_path / "out", planning.REHEARSAL)
    checks = planning.plan(1, dali=True, nsys=True, pytest_ok=True, tests=False)
    for check in (c for c in checks if c.name in ("ddp", "--resume continues", "pp --resume continues")):
        runner(check)
    runs = tmp_path / "out" / "runs"
    assert not list(runs.rglob("*.pt")) and list(runs.rglob("log.txt"))
    assert (runs / "ddp" / "saves").read_text() == "save=none\n"
    assert (runs / "--resume_continues" / "saves").read_text() == "save=ckpt\nsave=ckpt\n"
