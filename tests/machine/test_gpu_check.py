"""scripts/gpu_check.sh without a GPU: one line and exit 2; its plan of checks for 1 and 2
GPUs; its table and JSON; its exit status. The checks themselves need a GPU."""
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

ENV = {"date": "2026-11-23", "gpu": "NVIDIA H100 80GB HBM3", "gpus": 1, "driver": "580.65.06",
       "torch": "2.14.1", "torch_cuda": "13.0", "dali": "2.4.0"}


def by_name(checks):
    return {c.name: c for c in checks}


def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no usable CUDA GPU"), proc.stderr
    assert not list(tmp_path.iterdir())


def test_one_gpu_plan_covers_every_mode_option_and_recovery_on_one_gpu():
    checks = gpu_check.plan(1, dali=True, nsys=True, pytest_ok=True)
    names = by_name(checks)
    for name in ("gpu-marked tests", "dp", "dp --dp-balanced", "ddp", "ddp_dali memory", "ddp_dali raw",
                 "ddp_dali jpeg", "fsdp", "pp (1 stage)", "bf16", "fp16 (GradScaler)", "channels_last",
                 "accumulation x2", "activation checkpointing", "--resume continues", "pp --resume continues",
                 "SIGTERM stop, then --resume", "profiled run (nsys)"):
        assert name in names and not names[name].skip, name
    assert not any(name.startswith("2 GPUs") for name in names)
    trains = [c for c in checks if c.kind == "train"]
    assert all(c.args[:2] == ("--num_gpu", "1") and c.gpus == 1 for c in trains)
    modes = {c.args[c.args.index("--mode") + 1] for c in trains}
    assert modes == {"dp", "ddp", "ddp_dali", "fsdp", "pp"}
    assert names["pp --resume continues"].args[:4] == ("--num_gpu", "1", "--mode", "pp")
    for name, flag in (("bf16", "bf16"), ("fp16 (GradScaler)", "fp16"), ("channels_last", "--channels-last"),
                       ("accumulation x2", "--accum-steps"), ("activation checkpointing", "--activation-checkpointing"),
                       ("ddp_dali jpeg", "jpeg"), ("dp --dp-balanced", "--dp-balanced")):
        assert flag in names[name].args, name
    assert ("env.backend", "nccl") in names["ddp"].expect


def test_two_gpus_add_a_pass_with_nccl_dp_splitting_and_sync_bn():
    one = gpu_check.plan(1, dali=True, nsys=True, pytest_ok=True)
    two = gpu_check.plan(2, dali=True, nsys=True, pytest_ok=True)
    extra = [c for c in two if c.name not in by_name(one)]
    assert extra and all(c.name.startswith("2 GPUs") and c.gpus == 2 and c.args[:2] == ("--num_gpu", "2")
                         for c in extra)
    names = by_name(extra)
    assert ("env.backend", "nccl") in names["2 GPUs: ddp over NCCL"].expect
    assert "--sync-bn" in names["2 GPUs: ddp --sync-bn"].args
    assert {c.args[c.args.index("--mode") + 1] for c in extra} == {"dp", "ddp", "ddp_dali", "fsdp", "pp"}
    assert names["2 GPUs: pp --resume (gathered checkpoint)"].kind == "resume"
    assert ("env.world_size", 2) in names["2 GPUs: pp, 2 stages over NCCL"].expect
    assert by_name(gpu_check.plan(8, dali=True, nsys=True, pytest_ok=True)).keys() == by_name(two).keys()


def test_missing_dali_nsys_or_pytest_skip_their_checks_with_the_reason():
    checks = gpu_check.plan(2, dali=False, nsys=False, pytest_ok=False)
    skipped = {c.name: c.skip for c in checks if c.skip}
    assert {n for n in skipped if "ddp_dali" in n} == {c.name for c in checks if "ddp_dali" in c.name}
    assert all("DALI" in skipped[n] for n in skipped if "ddp_dali" in n)
    assert "nsys" in skipped["profiled run (nsys)"] and "pytest" in skipped["gpu-marked tests"]
    assert not by_name(checks)["ddp"].skip
    assert "bf16" in by_name(gpu_check.plan(1, dali=True, nsys=True, pytest_ok=True, bf16=False))["bf16"].skip
    assert "gpu-marked tests" not in by_name(gpu_check.plan(1, dali=True, nsys=True, pytest_ok=True, tests=False))


def metrics(device="cuda", epochs=1, test=gpu_check.TEST, backend="nccl", loss=2.3):
    return {"env": {"device": device, "backend": backend},
            "epochs": [{"epoch": e, "train_loss": loss} for e in range(epochs)],
            "test": {"samples": test}}


@pytest.mark.parametrize("run, problem", [
    (metrics(), ""), (metrics(device="cpu"), "ran on cpu"), (metrics(epochs=0), "epochs []"),
    (metrics(loss=float("nan")), "no finite training loss"), (metrics(test=999), "test samples 999"),
    (metrics(backend="gloo"), "env.backend='gloo', expected 'nccl'")])
def test_a_check_passes_only_on_a_finished_cuda_run_as_expected(run, problem, tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(run))
    found = gpu_check.verify(path, gpu_check.train("ddp", "--mode", "ddp", env__backend="nccl"))
    assert (problem in found and found) if problem else found == ""
    assert gpu_check.verify(tmp_path / "missing.json", gpu_check.train("x")) == "no metrics file"


def fake_runner(outcomes):
    def run(check):
        outcome = outcomes.get(check.name, "")
        if outcome == "timeout":
            raise subprocess.TimeoutExpired(["train"], 240)
        return outcome
    return run


def test_table_and_json_hold_one_row_per_check_naming_the_machine(tmp_path):
    checks = [gpu_check.train("ddp"), gpu_check.train("fsdp"), gpu_check.train("ddp_dali jpeg", skip="no DALI"),
              gpu_check.Check("SIGTERM", "sigterm")]
    said = []
    results = gpu_check.run_all(checks, fake_runner({"fsdp": "exit 1; see log", "SIGTERM": "timeout"}), said.append)
    assert [r.result for r in results] == ["pass", "fail", "skip", "fail"]
    assert results[3].detail == "timed out after 240 s"
    assert any(line.startswith("gpu_check: SKIPPED ddp_dali jpeg: no DALI") for line in said)
    md, js = gpu_check.write_reports(results, ENV, tmp_path)
    data = json.loads(js.read_text())
    assert data["passed"] is False and data["env"] == ENV and data["total_s"] == pytest.approx(sum(r.seconds for r in results), abs=0.1)
    assert [row["check"] for row in data["checks"]] == ["ddp", "fsdp", "ddp_dali jpeg", "SIGTERM"]
    for row in data["checks"]:
        assert {"check", "result", "seconds", "gpu", "driver", "torch", "dali"} <= row.keys()
        assert (row["gpu"], row["driver"], row["torch"], row["dali"]) == (ENV["gpu"], "580.65.06", "2.14.1", "2.4.0")
    table = [line for line in md.read_text().splitlines() if line.startswith("| ")]
    assert table[0].startswith("| check | result | seconds | GPU | driver | torch | DALI |")
    assert len(table) == 1 + len(checks) and "| fsdp | fail |" in md.read_text()
    assert "FAILED: fsdp, SIGTERM" in md.read_text()


@pytest.mark.parametrize("outcomes, dali, code", [({}, True, 0), ({"fsdp": "exit 1"}, True, 1), ({}, False, 0)])
def test_exit_status_is_non_zero_on_any_failure_and_missing_dali_is_loud(outcomes, dali, code, tmp_path,
                                                                        monkeypatch, capsys):
    import handler.runtime.devices as devices
    monkeypatch.setattr(devices, "cuda_status", lambda: (1, ""))
    monkeypatch.setattr(gpu_check, "environment", lambda: ENV)
    monkeypatch.setattr(gpu_check, "Runner", lambda python, out: fake_runner(outcomes))
    monkeypatch.setattr(gpu_check, "module_present", lambda name: dali or name != "nvidia.dali")
    assert gpu_check.main(["--out", str(tmp_path)]) == code
    err = capsys.readouterr().err
    assert ("WARNING: NVIDIA DALI is not installed: SKIPPING every ddp_dali check" in err) == (not dali)
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert all(r["result"] == "skip" for r in rows if "ddp_dali" in r["check"]) == (not dali)


def test_a_timed_out_check_stops_its_whole_process_group(tmp_path):
    # A hung run must not leave spawned ranks behind for the next check.
    runner = gpu_check.Runner(sys.executable, tmp_path)
    pidfile = tmp_path / "child.pid"
    with pytest.raises(subprocess.TimeoutExpired):
        runner.run(["bash", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], tmp_path / "run", timeout=2)
    child = int(pidfile.read_text())
    deadline = time.time() + 10
    while alive(child) and time.time() < deadline:
        time.sleep(0.1)
    assert not alive(child)
    assert "sleep 60" in (tmp_path / "run" / "log.txt").read_text()


def alive(pid) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_tests_it_leaves_out_are_the_ones_its_own_checks_repeat():
    source = (ROOT / "tests" / "machine" / "test_gpu.py").read_text()
    assert f"def {gpu_check.ONE_GPU_MODES_TEST}(" in source
    from tests.machine.test_gpu import MODES  # every mode that test runs at 1 GPU is a check of its own
    trains = [c for c in gpu_check.plan(1, dali=True, nsys=True, pytest_ok=True) if c.kind == "train"]
    assert {m[0] for m in MODES} <= {c.args[c.args.index("--mode") + 1] for c in trains}


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_planned_run_is_a_valid_command_line_on_that_many_gpus(gpus, tmp_path):
    # The runs cannot start here, but their options pass train_cifar.py's own validation.
    from handler.modes import parse_config
    runner = gpu_check.Runner(sys.executable, tmp_path)
    for check in gpu_check.plan(gpus, dali=True, nsys=True, pytest_ok=True):
        if check.kind in ("train", "resume", "sigterm"):
            argv = runner.train_cmd(check, tmp_path / "run", "--epochs", "2")[2:]
            cfg = parse_config(argv, cuda_count=gpus)
            assert cfg.use_cuda and cfg.num_gpu == check.gpus and cfg.model == "resnet18", check.name
