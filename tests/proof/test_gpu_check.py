"""scripts/gpu_check.sh: without a GPU one line and exit 2; its plan for 1 and 2 GPUs; its
rehearsal on this CPU, end to end through the real environment(), plan(), run_all() and
write_reports(); --only, --part, --budget and the progress lines. docs/GPU_CHECK.md."""
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, run_process
from tests.parallel import one_at_a_time

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
assert spec and spec.loader
gpu_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_check)

from scripts import gpu_check_plan as planning  # noqa: E402  (importable once gpu_check.py has run)
from scripts import gpu_check_rehearse as rehearsal  # noqa: E402
from scripts.gpu_check_report import environment, write_reports  # noqa: E402
from scripts.gpu_check_run import Result, Runner, run_all, verify  # noqa: E402

# The rehearsal runs in the suite in parts (--part k/8) of about 25 s each by its estimates;
# seconds measured per part on 2 cores (docs/GPU_CHECK.md "Rehearsal").
REHEARSAL_PARTS = 8
REHEARSAL_PART_BUDGET = 60


def by_name(checks):
    return {c.name: c for c in checks}


def full_plan(gpus=2, **kw):
    return gpu_check.plan(gpus, **{"dali": True, "nsys": True, "pytest_ok": True, **kw})


def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no usable CUDA GPU"), proc.stderr
    assert "--rehearse" in lines[0] and not list(tmp_path.iterdir())


def test_the_real_environment_names_this_cpu_machine_and_its_versions():
    # Calls the real environment(): an import it makes that no longer exists fails here.
    import torch
    for rehearse in (True, False):
        env = environment(rehearsal=rehearse)
        assert env["gpus"] == 0 and env["gpu"].startswith("none (CPU: ") and env["rehearsal"] is rehearse
        assert env["torch"] == torch.__version__ and env["dali"] and len(env["load_average"]) == 3


def test_on_a_gpu_the_environment_names_the_gpu_and_the_driver(monkeypatch, tmp_path):
    # No GPU here: torch.cuda and nvidia-smi, the CUDA boundary, answer as on an H100 machine.
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 580.65.06\necho 580.65.06\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    env = environment()
    assert (env["gpus"], env["gpu"], env["driver"]) == (2, "NVIDIA H100 80GB HBM3", "580.65.06")


def test_one_gpu_plan_covers_every_mode_option_and_recovery_on_one_gpu():
    checks = full_plan(1)
    names = by_name(checks)
    for name in ("gpu-marked tests", "dp", "dp --dp-balanced", "ddp", "ddp_dali memory", "ddp_dali raw",
                 "ddp_dali jpeg", "fsdp", "pp (1 stage)", "bf16", "fp16 (GradScaler)", "channels_last",
                 "accumulation x2", "activation checkpointing", "--resume continues", "pp --resume continues",
                 "SIGTERM stop, then --resume", "profiled run (nsys)"):
        assert name in names and not names[name].skip, name
    assert not any(name.startswith("2 GPUs") for name in names)
    trains = [c for c in checks if c.kind == "train"]
    assert all(c.args[:2] == ("--num_gpu", "1") and c.gpus == 1 for c in trains)
    assert {c.args[c.args.index("--mode") + 1] for c in trains} == {"dp", "ddp", "ddp_dali", "fsdp", "pp"}
    assert names["pp --resume continues"].args[:4] == ("--num_gpu", "1", "--mode", "pp")
    for name, flag in (("bf16", "bf16"), ("fp16 (GradScaler)", "fp16"), ("channels_last", "--channels-last"),
                       ("accumulation x2", "--accum-steps"), ("activation checkpointing", "--activation-checkpointing"),
                       ("ddp_dali jpeg", "jpeg"), ("dp --dp-balanced", "--dp-balanced")):
        assert flag in names[name].args, name
    assert ("env.backend", "nccl") in names["ddp"].expect


def test_two_gpus_add_a_pass_with_nccl_dp_splitting_sync_bn_and_the_sigstop_test():
    one, two = full_plan(1), full_plan(2)
    extra = [c for c in two if c.name not in by_name(one)]
    assert extra and all(c.name.startswith("2 GPUs") and c.gpus == 2 for c in extra)
    names = by_name(extra)
    assert ("env.backend", "nccl") in names["2 GPUs: ddp over NCCL"].expect
    assert "--sync-bn" in names["2 GPUs: ddp --sync-bn"].args
    trains = [c for c in extra if c.kind == "train"]
    assert all(c.args[:2] == ("--num_gpu", "2") for c in trains)
    assert {c.args[c.args.index("--mode") + 1] for c in trains} == {"dp", "ddp", "ddp_dali", "fsdp", "pp"}
    assert names["2 GPUs: pp --resume (gathered checkpoint)"].kind == "resume"
    assert ("env.world_size", 2) in names["2 GPUs: pp, 2 stages over NCCL"].expect
    sigstop = names["2 GPUs: a SIGSTOPped rank is named"]
    assert sigstop.kind == "pytest" and gpu_check.SIGSTOP_TEST in sigstop.args
    assert gpu_check.SIGSTOP_TEST in by_name(two)["gpu-marked tests"].args[-1]  # not run twice
    assert by_name(full_plan(8)).keys() == by_name(two).keys()


def test_missing_dali_nsys_or_pytest_skip_their_checks_with_the_reason():
    checks = gpu_check.plan(2, dali=False, nsys=False, pytest_ok=False)
    skipped = {c.name: c.skip for c in checks if c.skip}
    assert {n for n in skipped if "ddp_dali" in n} == {c.name for c in checks if "ddp_dali" in c.name}
    assert all("DALI" in skipped[n] for n in skipped if "ddp_dali" in n)
    assert "nsys" in skipped["profiled run (nsys)"] and "pytest" in skipped["gpu-marked tests"]
    assert not by_name(checks)["ddp"].skip
    assert "bf16" in by_name(full_plan(1, bf16=False))["bf16"].skip
    assert not any(c.kind == "pytest" for c in full_plan(2, tests=False))


def test_the_rehearsal_translates_every_check_and_no_gpu_only_expectation_survives():
    for gpu in (full_plan(2), full_plan(2, dali=False, nsys=False)):
        rehearsed = rehearsal.rehearse(gpu)
        assert [c.name for c in rehearsed] == [c.name for c in gpu]
        assert all(c.note for c in rehearsed)
        assert not any(value == "nccl" for c in rehearsed for _, value in c.expect)
    rehearsed = by_name(rehearsal.rehearse(full_plan(2)))
    assert ("env.backend", "gloo") in rehearsed["2 GPUs: ddp over NCCL"].expect
    assert ("env.world_size", 2) in rehearsed["2 GPUs: pp, 2 stages over NCCL"].expect
    for name in ("fp16 (GradScaler)", "2 GPUs: ddp --sync-bn", "2 GPUs: dp splits the batch"):
        assert rehearsed[name].skip.startswith("GPU only: "), name
    assert rehearsed["gpu-marked tests"].args[-1] == "--collect-only"
    assert "mixed" in rehearsed["ddp_dali jpeg"].note
    with pytest.raises(KeyError, match="TRANSLATIONS"):
        rehearsal.translate(gpu_check.train("a new check", "--mode", "ddp"))


def metrics(device="cuda", epochs=1, test=planning.GPU.test, backend="nccl", loss=2.3):
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
    found = verify(path, gpu_check.train("ddp", "--mode", "ddp", env__backend="nccl"))
    assert (problem in found and found) if problem else found == ""
    assert verify(tmp_path / "missing.json", gpu_check.train("x")) == "no metrics file"


def test_a_rehearsed_check_expects_a_cpu_run_of_the_tiny_size(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(metrics(device="cpu", backend="gloo", test=planning.REHEARSAL.test)))
    check = rehearsal.translate(gpu_check.train("ddp", "--mode", "ddp", env__backend="nccl"))
    assert verify(path, check, 1, planning.REHEARSAL) == ""
    assert "ran on cpu" in verify(path, check, 1, planning.GPU)


def test_progress_lines_and_a_failing_launch_make_fail_rows_in_the_table_and_json(tmp_path):
    # A real Runner whose interpreter is `false`: every launch exits 1, as a broken run would.
    checks = rehearsal.rehearse([gpu_check.train("ddp", "--mode", "ddp", env__backend="nccl"),
                                 gpu_check.train("fp16 (GradScaler)", "--mode", "ddp", "--amp", "fp16")])
    said = []
    written = []  # the report is rewritten after each check
    results = run_all(checks, Runner("false", tmp_path, planning.REHEARSAL), lambda *a, **k: said.append(" ".join(a)),
                      after=lambda done: written.append([r.result for r in done]))
    assert [r.result for r in results] == ["fail", "skip"] and written == [["fail"], ["fail", "skip"]]
    assert results[0].detail.startswith("exit 1; see ") and results[0].note == rehearsal.GLOO
    assert said[0] == "[1/2] ddp ..." and said[1].startswith("FAIL ") and " s: exit 1" in said[1]
    assert said[2].startswith("[2/2] fp16 (GradScaler) ... skipped: GPU only: ")
    md, js = write_reports(results, environment(rehearsal=True), tmp_path)
    data = json.loads(js.read_text())
    assert data["passed"] is False and data["env"]["rehearsal"] is True
    assert [(row["check"], row["result"]) for row in data["checks"]] == [("ddp", "fail"), ("fp16 (GradScaler)", "skip")]
    text = md.read_text()
    assert "say nothing about GPU times" in text and "FAILED: ddp" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| check | result | seconds | GPU | driver | torch | DALI | detail | rehearsal |")
    assert len(table) == 3 and table[1].startswith("| ddp | fail |") and rehearsal.GLOO in table[1]


def test_a_budget_leaves_checks_that_would_not_fit_unstarted_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # main sets it for --rehearse; restored after
    code = gpu_check.main(["--rehearse", "--only", "ddp,fp16*", "--budget", "1", "--out", str(tmp_path)])
    assert code == 3
    out = capsys.readouterr().out
    assert "ESTIMATE" in out and "[1/2] ddp ... NOT RUN: not started: its estimate 5 s is over the 1 s left" in out
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert [(r["check"], r["result"]) for r in rows] == [("ddp", "not run"), ("fp16 (GradScaler)", "skip")]
    assert "NOT RUN (--budget): ddp" in (tmp_path / "gpu_check.md").read_text()


def test_only_and_part_choose_checks_each_exactly_once_in_balanced_consecutive_parts():
    checks = full_plan(2)
    assert [c.name for c in planning.select(checks, ["ddp_dali*", "fsdp"])] == [
        "ddp_dali memory", "ddp_dali raw", "ddp_dali jpeg", "ddp_dali files (PNG tree; mixed decode)", "fsdp"]
    with pytest.raises(ValueError, match="--only nope: no such check"):
        planning.select(checks, ["nope", "ddp"])
    for n in (1, 2, 3, 4):
        parts = [planning.select(checks, part=(k, n)) for k in range(1, n + 1)]
        assert [c for part in parts for c in part] == checks  # consecutive, each once
        costs = [sum(planning.estimate_s(c) for c in part) for part in parts]
        assert max(costs) - min(costs) <= 2 * max(planning.estimate_s(c) for c in checks), costs
    for bad in ("0/2", "3/2", "x"):
        with pytest.raises(ValueError, match="--part"):
            planning.parse_part(bad)


def test_a_timed_out_check_stops_its_whole_process_group(tmp_path):
    # A hung run must not leave spawned ranks behind for the next check.
    runner = Runner(sys.executable, tmp_path)
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
    trains = [c for c in full_plan(1) if c.kind == "train"]
    assert {m[0] for m in MODES} <= {c.args[c.args.index("--mode") + 1] for c in trains}


@pytest.mark.parametrize("gpus", [1, 2])
def test_every_planned_run_is_a_valid_command_line_on_that_many_gpus(gpus, tmp_path, monkeypatch):
    # The runs cannot start here, but their options pass train_cifar.py's own validation.
    # --amp bf16's rule asks the GPUs' compute capability: torch.cuda, the CUDA boundary,
    # answers as an H100's.
    import torch
    from handler.modes import parse_config
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "NVIDIA H100 80GB HBM3")
    runner = Runner(sys.executable, tmp_path)
    for check in full_plan(gpus):
        if check.kind in ("train", "resume", "sigterm"):
            argv = runner.train_cmd(check, tmp_path / "run", "--epochs", "2")[2:]
            cfg = parse_config(argv, cuda_count=gpus)
            assert cfg.use_cuda and cfg.num_gpu == check.gpus and cfg.model == "resnet18", check.name


def sigstop_test_is_here() -> bool:
    files = (ROOT / "tests" / "machine").glob("*.py")
    return any(f"def {gpu_check.SIGSTOP_TEST}(" in path.read_text() for path in files)


# The first part only (the whole rehearsal costs about 140 s of both cores), in CI's slow step
# (pytest.ini); .ci/run runs the whole of it as its own step: bash scripts/gpu_check.sh --rehearse.
@pytest.mark.slow
@pytest.mark.parametrize("k", [1])
def test_the_rehearsal_runs_its_part_of_the_gpu_plan_on_this_cpu_end_to_end(k, tmp_path):
    # The whole rehearsal, in parts so that no test runs long: the real gpu_check.sh,
    # environment(), plan(), run_all() and write_reports(), every launch real, on this CPU.
    part = f"{k}/{REHEARSAL_PARTS}"
    whole = rehearsal.rehearse(full_plan(2, nsys=shutil.which("nsys") is not None))
    names = [c.name for c in planning.select(whole, part=(k, REHEARSAL_PARTS), scale=planning.REHEARSAL)]
    # nsys sessions that start together can fail (tests/parallel.py): profiled runs take turns.
    with one_at_a_time("nsys") if "profiled run (nsys)" in names else contextlib.nullcontext():
        run = run_process(["bash", ROOT / "scripts" / "gpu_check.sh", "--rehearse", "--part", part, "--out", tmp_path],
                          env={"PYTHON": sys.executable}, budget=REHEARSAL_PART_BUDGET)
    data = json.loads((tmp_path / f"gpu_check_part{k}of{REHEARSAL_PARTS}.json").read_text())
    rows = {row["check"]: row for row in data["checks"]}
    assert list(rows) == names
    assert data["env"]["rehearsal"] is True and data["env"]["gpus"] == 0
    sigstop = rows.pop("2 GPUs: a SIGSTOPped rank is named", None)
    absent = sigstop is not None and not sigstop_test_is_here()
    if sigstop is not None:
        assert sigstop["result"] == ("fail" if absent else "pass"), sigstop
        assert not absent or "not in this checkout" in sigstop["detail"]
    assert run.returncode == (1 if absent else 0), run.stdout[-3000:] + run.stderr[-2000:]
    failed = {name: row["detail"] for name, row in rows.items() if row["result"] not in ("pass", "skip")}
    assert not failed, failed
    assert all(row["note"] for row in rows.values())
    skipped = {name for name, row in rows.items() if row["result"] == "skip"}
    assert skipped <= {"fp16 (GradScaler)", "2 GPUs: ddp --sync-bn", "2 GPUs: dp splits the batch",
                       "2 GPUs: dp --dp-balanced", "2 GPUs: dp bf16 + activation checkpointing",
                       "profiled run (nsys)"}, skipped
    assert f"[{len(data['checks'])}/{len(data['checks'])}] " in run.stdout and "ESTIMATE" in run.stdout
    assert "say nothing about GPU times" in (tmp_path / f"gpu_check_part{k}of{REHEARSAL_PARTS}.md").read_text()
    # What a run leaves: no checkpoint, no synthetic data (docs/GPU_CHECK.md "What a run leaves").
    assert not list(tmp_path.rglob("*.pt")) and not (tmp_path / "data").exists()


def test_a_check_that_raises_is_a_failed_row_and_a_missing_parent_package_is_absent():
    from scripts.gpu_check_run import timed

    def broken(check):
        raise ValueError("no such metric")
    problem, seconds = timed(broken, gpu_check.train("ddp", "--mode", "ddp"), time.perf_counter)
    assert problem == "ValueError: no such metric" and seconds >= 0
    # find_spec imports the parent first: a parent that is not installed means absent, not an error.
    assert gpu_check.module_present("no_such_package_here.dali") is False
    assert gpu_check.module_present("json") is True
