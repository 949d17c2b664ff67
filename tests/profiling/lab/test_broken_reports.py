"""A run cut short inside an epoch keeps its page and its complete epochs; a broken report file is
left off the lab page with one line saying what it is, the rest of the page stands, and nothing
stray stays in OUT. Real exports from tests/data/nsys (README.md there), damaged in copies."""
import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.lab.cells import lab_reports
from handler.profiling.lab.page import summary_row, write_lab
from handler.profiling.trace import load_trace
from handler.profiling.lab.whatif_folder import lab_section
from tests.nsys_helpers import REPO, require_nsys

DATA = REPO / "tests" / "data" / "nsys"
GOOD = DATA / "ddp_dali_cpu_nsys2022.4.sqlite"  # one complete epoch 0, 4 steps
KILLED = DATA / "killed_in_epoch1_nsys2022.4.sqlite"  # SIGKILLed inside epoch 1: nsys closed it at the capture's end


def epoch_rows(path: Path) -> dict:
    """'epoch N' -> (start, end) as the export holds them."""
    with closing(sqlite3.connect(path)) as db:
        return {text: (start, end) for start, end, text in db.execute(
            "SELECT e.start, e.end, COALESCE(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
            "ON s.id = e.textId WHERE COALESCE(e.text, s.value) LIKE 'epoch %'")}


def without_epoch_end(source: Path, target: Path) -> Path:
    """A copy whose last epoch never closed, as nsys writes a range the process died inside: no end."""
    shutil.copyfile(source, target)
    target.chmod(0o644)
    with closing(sqlite3.connect(target)) as db:
        db.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE rowid = (SELECT e.rowid FROM NVTX_EVENTS e LEFT JOIN "
                   "StringIds s ON s.id = e.textId WHERE COALESCE(e.text, s.value) LIKE 'epoch %' "
                   "ORDER BY e.start DESC LIMIT 1)")
        db.commit()
    return target


def truncated(source: Path, target: Path) -> Path:
    target.write_bytes(source.read_bytes()[:len(source.read_bytes()) // 3])
    return target


def test_a_run_killed_inside_epoch_1_keeps_epoch_0_and_records_where_it_ended():
    """The real capture: nsys 2022.4 closed the open `epoch 1` at the capture's end (ANALYSIS_DETAILS
    duration). Before, that epoch counted, 2 s long, with its steps; now epoch 0 alone counts."""
    epochs = epoch_rows(KILLED)
    with closing(sqlite3.connect(KILLED)) as db:
        assert epochs["epoch 1"][1] == db.execute("SELECT duration FROM ANALYSIS_DETAILS").fetchone()[0]
    summary = summarize(load_trace(KILLED))
    rank = summary["ranks"][0]
    start, end = epochs["epoch 0"]
    assert rank["epochs"] == [{"epoch": 0, "time_s": (end - start) / 1e9}]
    assert rank["loop"]["epochs"] == 1 and rank["loop"]["steps"] == 3
    assert summary["overall"]["epoch_mean_s"] == pytest.approx((end - start) / 1e9)
    assert summary["incomplete"]["epoch"] == 1 and summary["incomplete"]["complete_epochs"] == 1
    assert summary["incomplete"]["dropped_steps"] == 3
    assert summary["incomplete"]["line"].startswith("the run ended inside epoch 1")


def test_an_epoch_without_an_end_is_cut_short_with_no_complete_epoch_and_its_steps_left_out(tmp_path):
    """Before, the end-less epoch read as a mark: its steps counted with no epoch around them
    (the what-if then divided by a zero epoch time)."""
    summary = summarize(load_trace(without_epoch_end(GOOD, tmp_path / "cut.sqlite")))
    loop = summary["ranks"][0]["loop"]
    assert (loop["epochs"], loop["steps"], loop["epochs_s"]) == (0, 0, 0.0)
    assert summary["incomplete"]["epoch"] == 0 and summary["incomplete"]["complete_epochs"] == 0
    assert summary["incomplete"]["dropped_steps"] == 4
    assert "no epoch completed" in summary["incomplete"]["line"]


def test_a_library_range_without_an_end_is_left_out_and_the_run_is_not_cut_short(tmp_path):
    """DALI's ranges on its own threads, one of them never closed: the epochs stay whole."""
    copy = shutil.copyfile(GOOD, tmp_path / "dali_open.sqlite")
    copy.chmod(0o644)
    with closing(sqlite3.connect(copy)) as db:
        changed = db.execute("UPDATE NVTX_EVENTS SET end = NULL WHERE rowid = (SELECT e.rowid FROM NVTX_EVENTS e "
                             "LEFT JOIN StringIds s ON s.id = e.textId WHERE COALESCE(e.text, s.value) LIKE '[DALI]%' "
                             "AND e.eventType = 59 "
                             "ORDER BY e.start DESC LIMIT 1)").rowcount
        db.commit()
    assert changed == 1
    whole, opened = summarize(load_trace(GOOD)), summarize(load_trace(copy))
    assert opened["incomplete"] is None and opened["ranks"][0]["incomplete"] is None
    assert opened["ranks"][0]["loop"] == whole["ranks"][0]["loop"]


def test_the_report_writes_the_cut_short_record_into_its_summary_json(tmp_path):
    from handler.profiling.report import main
    main([str(KILLED), "--out", str(tmp_path), "--brief"])
    summary = json.loads((tmp_path / f"{KILLED.stem}.summary.json").read_text())
    assert summary["incomplete"]["epoch"] == 1 and summary["ranks"][0]["incomplete"]["epoch"] == 1
    assert "Cut short: the run ended inside epoch 1" in (tmp_path / f"{KILLED.stem}.summary.md").read_text()
    assert summary["one_line"].endswith("; cut short inside epoch 1 (complete epochs counted: 1)")


def test_the_whatif_of_a_run_with_no_complete_epoch_is_one_line_saying_where_it_ended(tmp_path):
    """Before: its steps had no epoch, and the model divided by the zero epoch time."""
    from handler.profiling.report import main
    main([str(without_epoch_end(GOOD, tmp_path / "cut.sqlite")), "--out", str(tmp_path), "--brief"])
    done = subprocess.run([sys.executable, "-m", "handler.profiling.whatif", str(tmp_path / "cut.summary.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "the run ended inside epoch 0" in done.stderr and "finishes at least one epoch" in done.stderr


def test_an_export_beside_other_runs_reports_is_a_report_of_its_own(tmp_path):
    """The defect: a folder with .nsys-rep files hid every .sqlite in it, so an empty export a
    student copied in beside the kit's gpu_1 and gpu_2 reports was neither shown nor named."""
    run = tmp_path / "ddp_20261128_161106"
    run.mkdir()
    for name in ("gpu_1.nsys-rep", "gpu_1.sqlite", "gpu_2.nsys-rep", "gpu_4.sqlite"):
        (run / name).write_bytes(b"")
    assert [Path(r["report"]).name for r in lab_reports([tmp_path])] == ["gpu_1.nsys-rep", "gpu_2.nsys-rep",
                                                                         "gpu_4.sqlite"]
    from handler.profiling.report import reports_of
    assert [p.name for p in reports_of([run])] == ["gpu_1.nsys-rep", "gpu_2.nsys-rep", "gpu_4.sqlite"]


@pytest.fixture(scope="module")
def student_folder(tmp_path_factory):
    """What a student's folder can hold after a bad night: a good report, a run killed inside
    epoch 1, one whose only epoch never closed, an empty export, a truncated one and a text
    file renamed .sqlite. The page is written once, in-process, its stderr kept."""
    folder = tmp_path_factory.mktemp("logs")
    shutil.copyfile(GOOD, folder / "ddp_1gpu.sqlite")
    shutil.copyfile(KILLED, folder / "pp_1gpu.sqlite")
    without_epoch_end(GOOD, folder / "ddp_dali_1gpu.sqlite")
    (folder / "dp_1gpu.sqlite").write_bytes(b"")
    truncated(GOOD, folder / "fsdp_1gpu.sqlite")
    (folder / "ddp_2gpu.sqlite").write_text("epoch 0: 12.5 s\n" * 40)
    out = folder / "lab"
    done = subprocess.run([sys.executable, "-m", "handler.profiling.report", str(folder), "--lab", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    return folder, out, done


@pytest.mark.xdist_group("student_folder")
def test_the_page_is_written_for_the_readable_reports_and_exits_0(student_folder):
    folder, out, done = student_folder
    assert done.returncode == 0, done.stderr
    rows = {r["report"]: r for r in json.loads((out / "lab.json").read_text())["reports"]}
    assert sorted(Path(r).name for r in rows) == ["ddp_1gpu.sqlite", "ddp_dali_1gpu.sqlite", "pp_1gpu.sqlite"]
    assert rows[str(folder / "ddp_1gpu.sqlite")]["incomplete"] is None


@pytest.mark.xdist_group("student_folder")
def test_each_bad_file_is_named_once_on_the_page_in_lab_json_and_on_stderr_as_what_it_is(student_folder):
    folder, out, done = student_folder
    left_off = {Path(b["report"]).name: b["why"] for b in json.loads((out / "lab.json").read_text())["left_off"]}
    assert sorted(left_off) == ["ddp_2gpu.sqlite", "dp_1gpu.sqlite", "fsdp_1gpu.sqlite"]
    assert "is empty (0 bytes)" in left_off["dp_1gpu.sqlite"]
    assert "is truncated" in left_off["fsdp_1gpu.sqlite"] and "its SQLite header says" in left_off["fsdp_1gpu.sqlite"]
    assert "is not SQLite" in left_off["ddp_2gpu.sqlite"]
    page = (out / "lab.md").read_text()
    section = page.split("## Reports left off", 1)[1].split("\n## ", 1)[0]
    assert "3 of 6 reports could not be read" in section
    for why in left_off.values():
        assert section.count(f"- {why}") == 1 and "\n" not in why
    stderr = done.stderr.strip().splitlines()
    assert [line for line in stderr if line.startswith("lab page: LEFT OFF: ")] == \
        [f"lab page: LEFT OFF: {why}" for why in left_off.values()]
    assert "3 of 6 reports left off" in stderr[-1] and "Traceback" not in done.stderr


@pytest.mark.xdist_group("student_folder")
def test_a_cut_short_report_gets_its_cell_saying_where_the_run_ended(student_folder):
    folder, out, _ = student_folder
    rows = {Path(r["report"]).name: r for r in json.loads((out / "lab.json").read_text())["reports"]}
    killed, never = rows["pp_1gpu.sqlite"], rows["ddp_dali_1gpu.sqlite"]
    start, end = epoch_rows(KILLED)["epoch 0"]
    assert killed["epoch_s"] == pytest.approx((end - start) / 1e9) and killed["incomplete"]["epoch"] == 1
    assert never["epoch_s"] is None and never["incomplete"]["complete_epochs"] == 0
    page = (out / "lab.md").read_text()
    assert "**pp, 1 CPU process**: cut short: the run ended inside epoch 1" in page
    assert "**ddp_dali, 1 CPU process**: cut short: the run ended inside epoch 0" in page
    assert "no epoch completed" in page and "cut short in epoch 1" in page
    assert "- **ddp_dali**: no prediction:" in page and "### pp" in page and "### ddp" in page


@pytest.mark.xdist_group("student_folder")
def test_nothing_stray_is_left_in_out(student_folder):
    _, out, _ = student_folder
    assert sorted(p.name for p in out.iterdir()) == ["ddp_1cpu.png", "ddp_dali_1cpu.png", "lab.json", "lab.md",
                                                     "pp_1cpu.png"]


def test_a_folder_of_only_bad_reports_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "a.sqlite").write_bytes(b"")
    (tmp_path / "b.sqlite").write_text("not a database")
    done = subprocess.run([sys.executable, "-m", "handler.profiling.report", str(tmp_path), "--lab",
                           "--out", str(tmp_path / "lab")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "none of the 2 reports can be read" in done.stderr
    assert "a.sqlite is empty (0 bytes)" in done.stderr and "b.sqlite is not SQLite" in done.stderr
    assert not (tmp_path / "lab").exists() or not any((tmp_path / "lab").iterdir())


def damaged(source: Path, target: Path) -> Path:
    """Every other page from the third on overwritten: the header and the schema read, the tables not."""
    data = bytearray(source.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    for start in range(2 * page, len(data) - page + 1, 2 * page):
        data[start:start + page] = b"\xa5" * page
    target.write_bytes(bytes(data))
    return target


@pytest.mark.parametrize("make, says", [
    (lambda p: p.write_bytes(b"") or p, "is empty (0 bytes)"),
    (lambda p: truncated(GOOD, p), "is truncated ("),
    (lambda p: damaged(GOOD, p), "is truncated or damaged, not a readable nsys SQLite export (SQLite: "),
    (lambda p: p.write_text("epoch 0: 12.5 s\n") and p, "is not SQLite (not an nsys SQLite export at all)"),
], ids=["empty", "truncated", "damaged", "text"])
def test_one_broken_export_is_one_line_saying_what_it_is(tmp_path, make, says):
    """Before, an empty one read as an export without NVTX ranges."""
    path = make(tmp_path / "ddp_1gpu.sqlite")
    done = subprocess.run([sys.executable, "-m", "handler.profiling.report", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"report: {path} {says}"), done.stderr


def test_an_nsys_rep_nsys_cannot_export_is_left_off_with_no_export_behind(tmp_path):
    require_nsys()
    (tmp_path / "ddp_2gpu.nsys-rep").write_bytes(b"not a report" * 100)
    (tmp_path / "dp_2gpu.nsys-rep").write_bytes(b"")
    good = shutil.copyfile(GOOD, tmp_path / "ddp_1gpu.sqlite")
    entries = lab_reports([tmp_path / "ddp_2gpu.nsys-rep", tmp_path / "dp_2gpu.nsys-rep", good])
    write_lab(entries, tmp_path / "lab")
    left_off = {Path(b["report"]).name: b["why"] for b in json.loads((tmp_path / "lab" / "lab.json").read_text())["left_off"]}
    assert "nsys could not read" in left_off["ddp_2gpu.nsys-rep"]
    assert "it is damaged, cut off, or not from a finished nsys profile run; copy it again" in left_off["ddp_2gpu.nsys-rep"]
    assert "is empty (0 bytes)" in left_off["dp_2gpu.nsys-rep"]
    assert not (tmp_path / "lab" / "exports").exists()


def test_a_what_if_row_that_fails_gets_its_line_and_the_other_modes_their_tables():
    """The row of a GPU run whose only epoch never closed: steps but a GPU busy share of None."""
    good = {"report": "ddp_1gpu.sqlite", "overall": {"epoch_mean_s": 2.0}, "gpus": None,
            "ranks": [{"rank": 0, "epochs": [{"epoch": 0, "time_s": 2.0}],
                       "loop": {"epochs_s": 2.0, "epochs": 1, "steps": 4, "step_mean_ms": 500.0,
                                "inside_steps_ms": 400.0, "between_steps_ms": 100.0, "phase_ms": {}}}]}
    broken = {**good, "report": "fsdp_1gpu.sqlite", "overall": {"epoch_mean_s": None},
              "gpus": [{"compute_busy_share": None, "kernel_busy_share": None, "epochs_s": 0.0, "nccl_kernel_s": 0.0}],
              "ranks": [{"rank": 0, "loop": {"epochs_s": 0.0, "epochs": 0, "steps": 4, "step_mean_ms": None,
                                             "inside_steps_ms": 400.0, "between_steps_ms": None, "phase_ms": {}}}]}
    lines = lab_section([summary_row(broken, {"report": "fsdp_1gpu.sqlite", "mode": "fsdp", "gpus": 1}),
                         summary_row(good, {"report": "ddp_1gpu.sqlite", "mode": "ddp", "gpus": 1})])
    assert any(line.startswith("- **fsdp**: no prediction:") for line in lines)
    assert "### ddp" in lines
