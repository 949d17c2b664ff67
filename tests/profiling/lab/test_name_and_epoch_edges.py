"""File names as a student's copies hold them (a byte that is not UTF-8, a name past the file system's
255 bytes), a damaged export beside its report, a run cut short in its first epoch beside a good one,
and the one epoch figure of a capture window that skipped the warm-up. Real exports from tests/data/nsys,
reshaped in copies; the report runs in-process through its one_line_errors."""
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from handler.profiling.scaling.epochs import of_times
from tests.nsys_helpers import REPO, profile, require_nsys
from tests.profiling.lab.test_report_edges import GOOD, KILLED, WORKERS, one_line, page_damaged, run


def named(folder: Path, raw: bytes) -> Path:
    """A path under folder whose name is the raw bytes, as a copy from an archive leaves it."""
    return folder / os.fsdecode(raw)


def test_a_report_whose_name_is_not_utf8_gets_its_summary_with_the_byte_shown(tmp_path, capsys):
    """`ddp_\\xfcbung.sqlite`: before, `UnicodeEncodeError` writing .summary.md."""
    report = shutil.copyfile(GOOD, named(tmp_path, b"ddp_\xfcbung.sqlite"))
    status, out, err = run("report", [report], capsys)
    assert status == 0, err
    page = named(tmp_path, b"ddp_\xfcbung.summary.md").read_text()
    assert page.startswith("# Profile: ddp_\\xfcbung.sqlite") and "# Profile: ddp_\\xfcbung.sqlite" in out


def test_the_lab_page_of_a_folder_whose_name_is_not_utf8_is_drawn_with_the_byte_shown(tmp_path, capsys):
    """Before: `TypeError` in matplotlib's figure title, and no page."""
    folder = named(tmp_path, b"ddp_\xfcbung")
    folder.mkdir()
    shutil.copyfile(GOOD, folder / "ddp_1cpu.sqlite")
    status, out, err = run("report", [folder, "--lab", "--out", tmp_path / "lab"], capsys)
    assert status == 0, err
    lab = json.loads((tmp_path / "lab" / "lab.json").read_text())
    assert Path(lab["reports"][0]["figure"]["file"]).is_file()
    assert "# Lab profiles" in (tmp_path / "lab" / "lab.md").read_text() and "# Lab profiles" in out


def test_the_what_if_of_a_summary_whose_name_is_not_utf8_prints_the_byte_shown(tmp_path, capsys):
    """Before: `UnicodeEncodeError` printing the page's first line, which names the file."""
    run("report", [shutil.copyfile(WORKERS, tmp_path / "w.sqlite"), "--brief"], capsys)
    summary = Path(shutil.copyfile(tmp_path / "w.summary.json", named(tmp_path, b"\xfcbung.summary.json")))
    status, out, err = run("whatif", [summary, "--gpus", "2"], capsys)
    assert status == 0 and out.startswith("From \\xfcbung.summary.json (2 CPU processes"), err
    status, _, err = run("whatif", [summary.with_name(summary.name + "x")], capsys)
    assert "\\xfcbung.summary.jsonx does not exist" in one_line(status, err, "whatif")


@pytest.mark.parametrize("given", ["report", "report --metrics", "whatif", "summary name"])
def test_a_name_past_the_file_systems_limit_is_one_line_naming_it(tmp_path, capsys, given):
    """Before: `OSError: File name too long`, a traceback."""
    long = tmp_path / ("x" * 300)
    if given == "report":
        status, _, err = run("report", [long.with_suffix(".nsys-rep")], capsys)
    elif given == "report --metrics":
        status, _, err = run("report", [GOOD, "--metrics", long, "--out", tmp_path / "out"], capsys)
    elif given == "whatif":
        status, _, err = run("whatif", [long.with_suffix(".json")], capsys)
    else:  # a report of 245 characters is a valid name; its .summary.md is not
        status, _, err = run("report", [shutil.copyfile(GOOD, tmp_path / ("r" * 245 + ".sqlite"))], capsys)
    line = one_line(status, err, "whatif" if given == "whatif" else "report")
    assert " is too long for the file system (" in line and line.endswith("rename the file (or its folder) shorter")


def test_the_lab_page_of_long_valid_names_names_its_own_files_within_the_limit(tmp_path, capsys):
    """A folder of 120 and a report of 200 characters, each a valid name: before, the page's own figure name
    (folder + report) passed 255 bytes: `OSError: File name too long`. A path past the 512 bytes SQLite
    opens is one line saying so (before: "check the file, its permissions and its disk")."""
    folder = tmp_path / ("d" * 120)
    folder.mkdir()
    report = shutil.copyfile(WORKERS, folder / ("ddp_" + "r" * 196 + ".sqlite"))
    status, _, err = run("report", [report, "--lab", "--out", tmp_path / "lab"], capsys)
    assert status == 0, err
    assert all(len(p.name) <= 255 for p in (tmp_path / "lab").rglob("*")) and (tmp_path / "lab" / "lab.md").is_file()
    deep = folder / ("e" * 200) / ("f" * 200)
    deep.mkdir(parents=True)
    status, _, err = run("report", [shutil.copyfile(WORKERS, deep / "w.sqlite"), "--out", tmp_path / "out"], capsys)
    assert "cannot be opened: its path is " in one_line(status, err, "report") and "past the 512 SQLite opens" in err


def test_a_damaged_export_beside_its_report_names_an_export_command_that_replaces_it(tmp_path, capsys):
    """X.sqlite beside X.nsys-rep, damaged inside, is reused on every run. Before, its advice
    (`nsys export --type sqlite REPORT`) failed with nsys' "File already exists"."""
    report = tmp_path / "ddp_1gpu.nsys-rep"
    report.write_bytes(b"\x00" * 64)
    os.utime(report, (1_000_000_000, 1_000_000_000))
    export = page_damaged(GOOD, tmp_path / "ddp_1gpu.sqlite", "StringIds")
    status, _, err = run("report", [report], capsys)
    line = one_line(status, err, "report")
    assert f"{export} is truncated or damaged" in line
    assert line.endswith(f"export ddp_1gpu.nsys-rep again over it (nsys export --type sqlite --force-overwrite=true "
                         f"--output {export} {report}), or move ddp_1gpu.sqlite away and run the report again: it "
                         "exports ddp_1gpu.nsys-rep afresh")


def test_the_damaged_exports_advice_works_when_followed(tmp_path, capsys):
    report = profile([sys.executable, "-c", "pass"], tmp_path / "tiny")
    subprocess.run([require_nsys(), "export", "--type=sqlite", str(report)], cwd=tmp_path, capture_output=True,
                   timeout=120, check=True)
    export = report.with_suffix(".sqlite")
    page_damaged(Path(shutil.copyfile(export, tmp_path / "whole.sqlite")), export, "StringIds")
    status, _, err = run("report", [report], capsys)
    command = one_line(status, err, "report").split("over it (", 1)[1].split("), or move", 1)[0]
    done = subprocess.run(shlex.split(command), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "File already exists" not in done.stdout + done.stderr
    status, _, err = run("report", [report], capsys)
    assert "truncated or damaged" not in err  # the export is whole again (a run of `python -c pass` has no ranges to read)


def without_epoch(source: Path, target: Path, epoch: int) -> Path:
    """A copy whose every rank's `epoch N` range, and the ranges inside it, are gone: what a capture
    window that starts after it records (--profile-epochs 1:2 leaves out epoch 0)."""
    shutil.copyfile(source, target)
    target.chmod(0o644)
    with closing(sqlite3.connect(target)) as db:
        spans = db.execute("SELECT n.globalTid, n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON "
                           "n.textId = s.id WHERE coalesce(n.text, s.value) = ?", (f"epoch {epoch}",)).fetchall()
        for tid, start, end in spans:
            db.execute("DELETE FROM NVTX_EVENTS WHERE globalTid = ? AND start >= ? AND end <= ?", (tid, start, end))
        db.commit()
    return target


def test_a_run_cut_short_in_its_first_epoch_beside_a_good_one_is_predicted_from_the_good_one(tmp_path, capsys):
    """Before: the lab page's what-if read "the what-if model failed on this report (KeyError: 1)"."""
    folder = tmp_path / "nsight_logs" / "ddp_20260101_000000"
    folder.mkdir(parents=True)
    without_epoch(KILLED, folder / "gpu_1.sqlite", 0)  # it ended inside epoch 1: no epoch completed
    shutil.copyfile(WORKERS, folder / "gpu_2.sqlite")
    status, out, err = run("report", [tmp_path / "nsight_logs", "--out", tmp_path / "lab"], capsys)
    assert status == 0, err
    whatif = out.split("## What-if", 1)[1]
    assert "KeyError" not in out and "failed" not in whatif and "no prediction" not in whatif
    assert "From the ddp report (2 CPU processes, " in whatif and "| 2 CPU processes | 8.60 | 8.60 | its report |" in whatif
    assert "| ddp | no complete epoch, cut short in epoch 1 |" in out


def test_a_window_after_the_warm_up_keeps_every_epoch_it_holds_and_a_window_with_it_leaves_it_out():
    assert of_times([(1, 10.0), (2, 12.0)], warmup=0) | {"rule": ""} == {
        "s": 11.0, "epochs": [1, 2], "spread": pytest.approx(2 / 11), "noisy": True, "rule": "",
        "fastest_s": 10.0, "slowest_s": 12.0}
    assert of_times([(0, 30.0), (1, 10.0), (2, 12.0)], warmup=0)["epochs"] == [1, 2]
    assert of_times([(0, 30.0)], warmup=0)["epochs"] == [0]  # the only one
    assert of_times([(3, 30.0), (4, 10.0)])["epochs"] == [4]  # the warm-up unknown: the first held is it


@pytest.mark.parametrize("window", [False, True], ids=["whole run", "--profile-epochs 1:2"])
def test_the_head_line_prints_the_measured_epoch_of_the_summary_and_its_page(tmp_path, capsys, window):
    """Before: the head line was the mean over every epoch with the warm-up, the page's the median
    after the first; and a window of epochs 1-2 kept epoch 2 alone (spread 0 %)."""
    report = without_epoch(WORKERS, tmp_path / "ddp_cpu2.sqlite", 0) if window else \
        shutil.copyfile(WORKERS, tmp_path / "ddp_cpu2.sqlite")
    status, out, err = run("report", [report, "--brief"], capsys)
    assert status == 0, err
    summary = json.loads((tmp_path / "ddp_cpu2.summary.json").read_text())
    measured = summary["measured_epoch"]
    assert measured["epochs"] == [1, 2]  # epoch 0 left out of the whole run; nothing left out of the window
    head = f"epoch {measured['s']:.2f} s"
    assert head in summary["one_line"] and head in out
    page = (tmp_path / "ddp_cpu2.summary.md").read_text()
    assert f"`{summary['one_line']}`" in page and f"the what-if use) {measured['s']:.3g} s: the median of epochs 1-2" in page


def test_the_what_if_page_links_its_model_and_tables_its_facts_instead_of_sentences(tmp_path, capsys):
    """Before: a 421-word paragraph of the model before the tables, and each prediction's facts one
    sentence of about 150 words. The model lives once in docs/PROFILING.md, which the page links."""
    from handler.profiling.whatif import ASSUMPTIONS, MODEL_SECTION
    run("report", [shutil.copyfile(WORKERS, tmp_path / "w.sqlite"), "--brief"], capsys)
    status, out, err = run("whatif", [tmp_path / "w.summary.json", "--gpus", "2"], capsys)
    assert status == 0, err
    lines = out.splitlines()
    assert ASSUMPTIONS in lines and len(ASSUMPTIONS.split()) < 25
    assert "#### The what-if's model" in (REPO / "docs" / "PROFILING.md").read_text()
    assert MODEL_SECTION == "docs/PROFILING.md#the-what-ifs-model"
    facts = [line for line in lines[lines.index("| fact | value | where it was read |") + 2:] if line.startswith("| ")]
    facts = facts[:next(i for i, line in enumerate(facts) if line.startswith("| count |"))]
    assert [f.split(" | ")[0] for f in facts][:3] == ["| mode", "| link", "| sent a step"]
    assert max(len(line.split()) for line in lines) < 80, max(lines, key=lambda line: len(line.split()))
