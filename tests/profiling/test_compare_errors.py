"""The comparison's option errors, its fallbacks, and how a timeout or SIGTERM stops a cell:
in-process where possible, one short subprocess for SIGTERM."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import handler.compare.runner as runner
from handler.compare import provenance
from handler.compare.__main__ import load_comm_bench, use_nsys
from handler.compare.cells import Cell, Variant, build_variants, parse_counts, sweep_hooks
from handler.compare.results import _with_other, dataset_description, recipe
from handler.compare.runner import Outcome, run_cell
from handler.modes import MODES
from handler.runtime.errors import UserError
from tests.conftest import ROOT
from tests.profiling.test_compare import TINY


@pytest.mark.parametrize("text", ["a,b", "0,2", ","])
def test_counts_that_are_not_positive_integers_are_one_line(text):
    with pytest.raises(UserError, match="is not a list of positive integers"):
        parse_counts(text)


def test_no_modes_and_no_cells_means_every_mode_and_an_empty_modes_is_refused():
    assert [v.mode for v in build_variants(None, [], MODES)] == list(MODES)
    with pytest.raises(UserError, match="nothing to run"):
        build_variants(" , ", [], MODES)


def test_an_empty_hooks_list_is_refused():
    with pytest.raises(UserError, match="--hooks is empty"):
        sweep_hooks(build_variants("ddp", [], MODES), ",", ("allreduce", "fp16"))


def test_all_zero_phase_shares_mean_none_recorded():
    assert _with_other({"data": 0.0, "forward": 0.0}) is None


def test_cifar10_without_its_folder_recorded_is_not_called_real_and_no_metrics_give_an_empty_recipe():
    cell = Cell(Variant("ddp", "ddp"), 1)
    real = Outcome(cell, "ok", metrics={"env": {"dataset": "cifar10"}, "config": {}})
    assert dataset_description([real]) == ("cifar10: a folder in CIFAR-10's layout (its path was not recorded, so "
                                           "its files were not checked)")
    assert recipe([Outcome(cell, "failed")]) == {}


@pytest.mark.parametrize("content", [None, "not json", '{"rows": [{"hook": "fp16"}]}'])
def test_a_comm_bench_file_that_is_not_bench_comms_is_one_line(content, tmp_path):
    path = tmp_path / "comm.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match="is not a bench.comm result"):
        load_comm_bench(path)


def test_profile_1_without_nsys_on_path_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="--profile 1 but nsys is not on PATH"):
        use_nsys("1")


def test_without_proc_or_git_the_provenance_says_what_it_can(tmp_path, monkeypatch):
    # /proc and git are the platform's (macOS has no /proc; a bare machine may lack git).
    monkeypatch.setattr(provenance, "Path", lambda path: tmp_path / "absent")
    assert provenance.cpu_model() and provenance.memory_gib() is None
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provenance.code_version() == "unknown"


def test_a_cell_past_its_timeout_is_stopped_with_its_whole_group(tmp_path, monkeypatch):
    # launch.sh stands in as a script that never ends (and a child that ignores SIGTERM),
    # so the timeout path, the group SIGTERM and the SIGKILL after the grace all run.
    launch = tmp_path / "launch.sh"
    launch.write_text("trap '' TERM\nsleep 300 &\necho $! > \"$CKPT_DIR.child\"\nwait\n")
    monkeypatch.setattr(runner, "LAUNCH", launch)
    monkeypatch.setattr(runner, "STOP_GRACE_S", (0.5, 5))
    started = time.monotonic()
    outcome = run_cell(Cell(Variant("ddp", "ddp"), 1), tmp_path / "out", profile=False, train_args=[],
                       timeout_s=1)
    assert outcome.status == "failed" and outcome.error == "timed out after 1 s (--timeout)"
    assert outcome.exit_code == -signal.SIGKILL and time.monotonic() - started < 20
    child = int((tmp_path / "out" / "cells" / outcome.cell.slug / "ckpt.child").read_text())
    time.sleep(0.2)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running or sleeping; a zombie waiting for its reaper counts as ended."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow  # an end-to-end run of 13-17 s: CI's slow step (the main run's 10 minutes)
def test_sigterm_stops_the_matrix_and_the_report_says_interrupted(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.Popen([sys.executable, "-m", "handler.compare", "--modes", "ddp", "--counts", "1",
                             "--hooks", "allreduce", "--profile", "0", "--out", str(out), "--", *TINY, "--epochs", "50",
                             "--data", str(tmp_path / "data")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert "cells (" in proc.stdout.readline()
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stdout
    rows = json.loads((out / "results.json").read_text())["cells"]
    assert [r["status"] for r in rows] == ["interrupted"]


def test_stopping_a_cell_whose_processes_already_ended_is_quiet():
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    runner._stop(proc)  # its group is gone: nothing to signal, no error
    assert proc.returncode == 0
