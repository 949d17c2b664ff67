"""The report's and the what-if's edges, as a student meets them: an --out that cannot be a folder,
another program's SQLite, an export damaged inside, a bad metrics JSON beside a report or given with
--metrics, the wrong file given to the what-if, a --ranges mapping that names nothing. Each is one
line naming the problem and the fix (exit 2), or the lab page kept with the report left off.
Real exports from tests/data/nsys, damaged in copies; every entry point runs in-process through
its own one_line_errors, as `python -m` runs it."""
import importlib
import io
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.conventions import from_mapping
from handler.profiling.report import main as report_main
from handler.profiling.scaling.machine import machine_of
from handler.profiling.trace import load_trace
from handler.runtime.errors import UserError, one_line_errors
from tests.nsys_helpers import REPO

DATA = REPO / "tests" / "data" / "nsys"
GOOD = DATA / "ddp_dali_cpu_nsys2022.4.sqlite"  # our ranges: one complete epoch 0, 4 steps
REAL_GPU = DATA / "nsysai_mfu_2gpu_after.sqlite"  # a real 2-GPU capture: kernels and runtime calls
WORKERS = DATA / "ddp_workers2_cpu2_nsys2022.4.sqlite"  # our ranges, 2 ranks, and the machine's tables
KILLED = DATA / "killed_in_epoch1_nsys2022.4.sqlite"


def run(module: str, argv: list, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `python -m handler.<module> ARGV`, in-process."""
    main = {"report": "handler.profiling.report", "whatif": "handler.profiling.whatif",
            "compare": "handler.compare.__main__"}[module]
    with _exits() as code, one_line_errors(module):
        importlib.import_module(main).main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code.value, out, err


class _exits:
    """Catches SystemExit, keeping its code; a run that returns has status 0."""
    value = 0

    def __enter__(self):
        return self

    def __exit__(self, kind, err, _):
        if kind is SystemExit:
            self.value = err.code
            return True
        return False


def one_line(status: int, err: str, prefix: str) -> str:
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith(f"{prefix}: "), err
    return err.strip()


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def page_damaged(source: Path, target: Path, table: str) -> Path:
    """A copy with the root page of one table overwritten by junk, the size unchanged: the header
    and the schema read, that table does not (`database disk image is malformed`)."""
    shutil.copyfile(source, target)
    target.chmod(0o644)
    with closing(sqlite3.connect(source)) as db:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    data = bytearray(target.read_bytes())
    size = int.from_bytes(data[16:18], "big")
    data[(root - 1) * size:root * size] = b"\xa5" * size
    target.write_bytes(bytes(data))
    assert target.stat().st_size == source.stat().st_size
    return target


def other_programs_database(path: Path) -> Path:
    with closing(sqlite3.connect(path)) as db:
        db.executescript("CREATE TABLE users (id INTEGER, name TEXT); CREATE TABLE orders (id INTEGER);")
    return path


@pytest.mark.parametrize("lab", [False, True], ids=["single report", "lab page"])
@pytest.mark.parametrize("where, says", [
    ("{file}/sub", " is under {file}, which is a file; name a folder"),
    ("{file}", " is a file; name a folder"),
    ("/proc/lab", ": cannot write in /proc (it takes no new files); name a folder you can write"),
    ("{dangling}/lab", " is under {dangling}, which is a link to nothing; name a folder"),
], ids=["under a file", "the input file itself", "under /proc", "under a broken link"])
def test_an_out_that_cannot_be_a_folder_is_one_line_and_nothing_is_written(tmp_path, capsys, lab, where, says):
    """Before: NotADirectoryError, FileExistsError or FileNotFoundError, a traceback (the single
    report wrote its export first)."""
    report = shutil.copyfile(GOOD, tmp_path / "ddp_1gpu.sqlite")
    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "removed")
    before = files_under(tmp_path)
    out = where.format(file=report, dangling=dangling)
    status, _, err = run("report", [report, "--out", out, *(["--lab"] if lab else [])], capsys)
    assert one_line(status, err, "report").startswith(f"report: --out {out}{says.format(file=report, dangling=dangling)}")
    assert files_under(tmp_path) == before


def test_compares_out_under_a_file_is_one_line_before_any_run(tmp_path, capsys):
    blocker = tmp_path / "results.txt"
    blocker.write_text("x")
    status, _, err = run("compare", ["--out", blocker / "cmp", "--modes", "ddp", "--counts", "1"], capsys)
    assert "--out " + str(blocker / "cmp") + f" is under {blocker}, which is a file" in one_line(status, err, "compare")
    assert files_under(tmp_path) == ["results.txt"]


def test_compare_lab_where_the_kits_nsight_logs_is_a_file_is_one_line_before_any_run(tmp_path, monkeypatch, capsys):
    """Before: every cell's launch.sh failed on it, one failed row after another."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nsight_logs").write_text("x")
    status, _, err = run("compare", ["--lab", "--out", tmp_path / "cmp"], capsys)
    assert one_line(status, err, "compare") == ("compare: --lab's kit folder nsight_logs is a file; move it away, "
                                                "or run compare --lab in another folder")
    assert files_under(tmp_path) == ["nsight_logs"]


def test_another_programs_sqlite_is_named_not_an_export_and_an_export_without_nvtx_keeps_the_trace_advice(
        tmp_path, capsys):
    """Before, both read "has no NVTX ranges; profile with --trace including nvtx": wrong advice for
    a database nsys never wrote."""
    foreign = other_programs_database(tmp_path / "app.sqlite")
    status, _, err = run("report", [foreign, "--out", tmp_path / "o"], capsys)
    line = one_line(status, err, "report")
    assert "is an SQLite database but not an nsys export" in line and "it holds orders, users" in line
    assert "NVTX" not in line
    no_nvtx = shutil.copyfile(KILLED, tmp_path / "osrt_only.sqlite")
    with closing(sqlite3.connect(no_nvtx)) as db:
        db.execute("DROP TABLE NVTX_EVENTS")
    status, _, err = run("report", [no_nvtx, "--out", tmp_path / "o"], capsys)
    assert "has no NVTX ranges; profile with --trace including nvtx" in one_line(status, err, "report")


@pytest.mark.parametrize("argv", [["{damaged}"], ["{damaged}", KILLED]], ids=["one report", "a job of two"])
def test_an_export_damaged_inside_is_one_line_naming_it(tmp_path, capsys, argv):
    """The machine's table's page overwritten: the trace and the analysis read, then the machine's
    read failed. Before: sqlite3.DatabaseError: database disk image is malformed, a traceback. Now
    SQLite's quick_check finds the page before anything is read."""
    damaged = page_damaged(WORKERS, tmp_path / "ddp_2gpu.sqlite", "TARGET_INFO_SYSTEM_ENV")
    status, _, err = run("report", [str(a).format(damaged=damaged) for a in argv] + ["--out", tmp_path / "o"], capsys)
    line = one_line(status, err, "report")
    assert line.startswith(f"report: {damaged} is truncated or damaged, not a readable nsys SQLite export (SQLite: ")
    assert "export the .nsys-rep again" in line
    assert not (tmp_path / "o").exists()


def test_a_damaged_page_any_read_meets_is_one_line_naming_the_export(tmp_path):
    """The machine's and the job clock's reads open the export through open_export too: SQLite's
    `database disk image is malformed` there is the same line, not a traceback."""
    damaged = page_damaged(WORKERS, tmp_path / "ddp_2gpu.sqlite", "TARGET_INFO_SYSTEM_ENV")
    with pytest.raises(UserError, match=r"is truncated or damaged, .*\(SQLite: database disk image is malformed\)"):
        machine_of(damaged, [])


def test_a_damaged_page_in_a_table_the_report_never_reads_is_found_too(tmp_path):
    """Before: OS runtime calls' page overwritten, the report read on and said nothing."""
    damaged = page_damaged(WORKERS, tmp_path / "ddp_2gpu.sqlite", "OSRT_API")
    with pytest.raises(UserError, match="is truncated or damaged, not a readable nsys SQLite export"):
        load_trace(damaged)


@pytest.mark.parametrize("table", ["NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"])
def test_a_damaged_page_in_a_table_the_reads_walk_is_found_by_the_read(tmp_path, table):
    """The whole-file quick_check doubled the reads' work; the tables the reads walk (sqlite3's NVTX
    read, connectorx's activity reads) now find their own damage, named in the same line."""
    source = WORKERS if table == "NVTX_EVENTS" else REAL_GPU
    damaged = page_damaged(source, tmp_path / "ddp_2gpu.sqlite", table)
    with pytest.raises(UserError, match=r"is truncated or damaged, not a readable nsys SQLite export \(SQLite: "
                                        r"database disk image is malformed\)"):
        load_trace(damaged)


@pytest.fixture(scope="module")
def bad_night(tmp_path_factory):
    """A folder with a good report, one damaged inside, another program's database, and a good
    report whose metrics JSON beside it is cut off: the lab page, once, in-process."""
    folder = tmp_path_factory.mktemp("logs")
    shutil.copyfile(GOOD, folder / "ddp_1gpu.sqlite")
    page_damaged(WORKERS, folder / "ddp_2gpu.sqlite", "TARGET_INFO_SYSTEM_ENV")
    other_programs_database(folder / "dp_1gpu.sqlite")
    shutil.copyfile(GOOD, folder / "fsdp_1gpu.sqlite")
    (folder / "fsdp_1gpu.metrics.json").write_text('{"schema": 1, "config": {"mode": "fsdp", "num_')
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), _exits() as code, one_line_errors("report"):
        report_main([str(folder), "--lab", "--out", str(folder / "lab")])
    return folder, code.value, err.getvalue()


def test_the_lab_page_is_kept_and_lists_each_bad_report_as_what_it_is(bad_night):
    """Before: the damaged report's DatabaseError ended the page (none written); the foreign
    database read "has no NVTX ranges"; the cut-off metrics JSON was passed over in silence."""
    folder, status, err = bad_night
    assert status == 0 and "Traceback" not in err
    lab = json.loads((folder / "lab" / "lab.json").read_text())
    assert [Path(r["report"]).name for r in lab["reports"]] == ["ddp_1gpu.sqlite"]
    why = {Path(b["report"]).name: b["why"] for b in lab["left_off"]}
    assert "is truncated or damaged, not a readable nsys SQLite export (SQLite: " in why["ddp_2gpu.sqlite"]
    assert "is an SQLite database but not an nsys export" in why["dp_1gpu.sqlite"]
    assert why["fsdp_1gpu.sqlite"].startswith(f"metrics file {folder / 'fsdp_1gpu.metrics.json'} is not JSON (")
    assert "it lies beside fsdp_1gpu.sqlite as its run's metrics: fix it, or move it away" in why["fsdp_1gpu.sqlite"]
    section = (folder / "lab" / "lab.md").read_text().split("## Reports left off", 1)[1].split("\n## ", 1)[0]
    assert "3 of 4 reports could not be read" in section and all(f"- {w}" in section for w in why.values())
    assert [line for line in err.splitlines() if line.startswith("lab page: LEFT OFF: ")] == \
        [f"lab page: LEFT OFF: {w}" for w in why.values()]


@pytest.mark.parametrize("text, says", [
    ("[1, 2]", " is a JSON list, not the object train_cifar.py writes"),
    ('{"config": [1]}', ": config is [1], not an object"),
    ('{"config": {"workers": "two"}}', ": config.workers is 'two', not a number of workers"),
    ('{"epochs": [{"epoch": "a", "time_s": 1}]}', ": epochs[0].epoch is 'a', not a whole number"),
    ('{"epochs": 5}', ": epochs is 5, not a list"),
    ('{"env": {"hosts": "n1"}}', ": env.hosts is 'n1', not an object"),
    # issue 55, defect 5: fields the summary takes from the metrics, named as the metrics' own
    ('{"config": {}, "model": {"grad_mb": 1e12}}', ": model.grad_mb is 1000000000000.0, not a size in MB > 0"),
    ('{"env": {"hosts": {"0": "n1", "1": 7}}}', ": env.hosts.1 is 7, not a text"),
    ('{"epochs": [{"cpu_time": {"rank_ms_per_step": -3.0, "loader_ms_per_step": 1.0}}]}',
     ": epochs[0].cpu_time.rank_ms_per_step is -3.0, not a number >= 0"),
    ('{"epochs": [{"cpu_time": {"rank_ms_per_step": NaN, "loader_ms_per_step": 1.0}}]}',
     ": epochs[0].cpu_time.rank_ms_per_step is nan, not a finite number"),
    ('{"epochs": [{"cpu_time": {"loader_ms_per_step": 1.0}}]}',
     ": epochs[0].cpu_time.rank_ms_per_step is missing; it must be a number >= 0"),
    ('{"schema": 1, "config": {"mode": "ddp", "wor', " is not JSON ("),
    ("", " is empty"),
    ('{"a": 1}', " has none of the metrics JSON's `config`, `env` and `epochs`"),
    ('{"ranks": [], "overall": {}}', " is a profile summary (.summary.json), not the run's metrics JSON"),
    (b"SQLite format 3\x00\xff\xfe", " is not text (a binary file"),
    (None, " is a folder"),
], ids=["list", "config", "workers", "epoch", "epochs", "hosts", "grad_mb", "host", "cpu_time negative",
        "cpu_time nan", "cpu_time keys", "cut off", "empty", "foreign", "summary", "binary", "folder"])
def test_a_metrics_json_the_report_cannot_use_is_one_line_before_anything_is_written(tmp_path, capsys, text, says):
    """Before: AttributeError, ValueError or IsADirectoryError tracebacks deep in the analysis."""
    metrics = tmp_path / "run.metrics.json"
    if text is None:
        metrics.mkdir()
    else:
        metrics.write_bytes(text if isinstance(text, bytes) else text.encode())
    status, _, err = run("report", [GOOD, "--out", tmp_path / "o", "--brief", "--metrics", metrics], capsys)
    line = one_line(status, err, "report")
    assert line.startswith(f"report: metrics file {metrics}{says}"), line
    assert line.endswith("pass the metrics JSON the run wrote (<name>.metrics.json) with --metrics")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("given, says", [
    ("{folder}", "is a folder; it holds no .summary.json: run python -m handler.profiling.report"),
    ("{summaries}", "is a folder; pass one of its summaries: a.summary.json"),
    ("{sqlite}", "is an nsys report, not its summary; run python -m handler.profiling.report"),
    ("{rep}", "is an nsys report, not its summary"),
    ("{empty}", "is empty; pass a .summary.json"),
    ("{list}", "is not a profile summary"),
    ("{metrics}", "is the run's metrics JSON (train_cifar.py --metrics), not a profile summary"),
    ("{binary}", "is not text (a binary file)"),
    ("{cut}", "is not JSON ("),
    ("{unreadable}", "cannot be read (Input/output error); check its permissions"),
    ("{markdown}", "is the summary for people (markdown); pass the .summary.json beside it"),
], ids=["folder", "folder of summaries", "sqlite", "nsys-rep", "empty", "list", "metrics", "binary", "cut off",
        "unreadable", "markdown"])
def test_the_whatif_given_the_wrong_file_says_what_it_is_in_one_line(tmp_path, capsys, given, says):
    """Before: "is not JSON ([Errno 21] Is a directory)", "is not JSON ('utf-8' codec can't decode ...)" for a
    report, "ranks is missing" for the metrics JSON."""
    files = {"folder": tmp_path / "empty_dir", "summaries": tmp_path / "with", "sqlite": GOOD,
             "rep": tmp_path / "gpu_1.nsys-rep", "empty": tmp_path / "e.summary.json",
             "list": tmp_path / "l.summary.json", "metrics": tmp_path / "run.metrics.json",
             "binary": tmp_path / "b.summary.json", "cut": tmp_path / "c.summary.json",
             "unreadable": tmp_path / "u.summary.json", "markdown": tmp_path / "m.summary.md"}
    files["folder"].mkdir()
    files["summaries"].mkdir()
    (files["summaries"] / "a.summary.json").write_text("{}")
    files["rep"].write_bytes(b"\x00" * 64)
    files["empty"].write_text("\n")
    files["list"].write_text("[1, 2]")
    files["metrics"].write_text(json.dumps({"schema": 1, "config": {"mode": "ddp"}, "env": {}, "epochs": []}))
    files["binary"].write_bytes(b"\xff\xfe\x00")
    files["cut"].write_text('{"schema": 1, "ranks": [')
    files["markdown"].write_text("# ddp_1gpu.sqlite\n")
    os.symlink("/proc/self/mem", files["unreadable"])  # open succeeds, read fails (EIO), even for root
    path = files[given.strip("{}")]
    status, _, err = run("whatif", [path], capsys)
    assert says in one_line(status, err, "whatif"), err


def test_a_ranges_mapping_over_our_own_names_reads_one_epoch_not_two_and_one_naming_nothing_is_one_line(
        tmp_path, capsys):
    """--ranges step='Batch *' on a report of ours: the mapping's epoch 0 and the report's own
    `epoch 0` clashed (TypeError: '<' not supported between 'Range' and 'Range'). A mapping that
    names no step said "name yours with --ranges", to a user who had."""
    summary = summarize(load_trace(GOOD, from_mapping(["step=Batch *"])))
    assert [e["epoch"] for e in summary["ranks"][0]["epochs"]] == [0] and summary["ranks"][0]["loop"]["steps"] == 4
    status, _, err = run("report", [GOOD, "--out", tmp_path, "--ranges", "step=Step *"], capsys)
    line = one_line(status, err, "report")
    assert "the --ranges mapping (user mapping (step='Step *')) names no step in its NVTX ranges" in line
    assert "'batch *'" in line and "[DALI]" not in line and "name yours with --ranges" not in line


@pytest.mark.parametrize("given, lab, says", [
    ("crashed/r.qdstrm", False, "{p} is nsys's unfinished capture (.qdstrm): nsys stopped before writing the .nsys-rep"),
    ("crashed", False, "{p} holds no .nsys-rep or .sqlite report, only nsys's unfinished capture (.qdstrm)"),
    ("crashed", True, "{p} holds no .nsys-rep or .sqlite report, only nsys's unfinished capture (.qdstrm)"),
    ("notes", False, "{p} holds no .nsys-rep or .sqlite report (it holds a.json, b.txt); pass a folder of nsys reports"),
    ("empty", True, "{p} holds no .nsys-rep or .sqlite report (it is empty); pass the kit's nsight_logs folder"),
    ("missing.nsys-rep", False, "{p} does not exist; record one with scripts/launch.sh"),
], ids=["qdstrm", "folder of a crashed run", "the same, lab page", "folder of other files", "empty folder, lab page",
        "missing"])
def test_a_report_path_without_a_report_says_what_it_holds(tmp_path, capsys, given, lab, says):
    """Before: a .qdstrm "is not an Nsight Systems report; pass the .nsys-rep", and a folder without
    reports never said what it held."""
    (tmp_path / "empty").mkdir()
    for name in ("crashed/r.qdstrm", "notes/a.json", "notes/b.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    path = tmp_path / given
    status, _, err = run("report", [path, *(["--lab"] if lab else [])], capsys)
    assert one_line(status, err, "report").startswith(f"report: {says.format(p=path)}"), err


def test_metrics_given_to_the_lab_page_is_one_line_not_ignored(tmp_path, capsys):
    """Before: --metrics with --lab (or a kit folder) was dropped without a word."""
    report = shutil.copyfile(GOOD, tmp_path / "ddp_1gpu.sqlite")
    (tmp_path / "run.metrics.json").write_text('{"config": {}}')
    status, _, err = run("report", [report, "--lab", "--metrics", tmp_path / "run.metrics.json"], capsys)
    assert "--metrics is for one report or one job; the lab page reads each report's metrics JSON beside it" in \
        one_line(status, err, "report")
    assert not (tmp_path / "lab.md").exists()


def test_another_programs_sqlite_taken_as_a_reports_export_says_to_move_it_away(tmp_path, capsys):
    """X.sqlite beside X.nsys-rep, newer, is reused as its export. Before: "pass the .nsys-rep, or
    the .sqlite that nsys export wrote from it", to a user who had passed the .nsys-rep."""
    report = tmp_path / "ddp_1gpu.nsys-rep"
    report.write_bytes(b"\x00" * 64)
    os.utime(report, (1_000_000_000, 1_000_000_000))
    other_programs_database(tmp_path / "ddp_1gpu.sqlite")
    status, _, err = run("report", [report], capsys)
    line = one_line(status, err, "report")
    assert line.startswith(f"report: {tmp_path / 'ddp_1gpu.sqlite'} is an SQLite database but not an nsys export (")
    assert line.endswith("it is taken as that report's export; move it away, and the report exports ddp_1gpu.nsys-rep "
                         "afresh") and "pass the .nsys-rep" not in line


# compare (15 s: it starts a whole compare): CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
@pytest.mark.parametrize("module", ["handler.profiling.report", "handler.profiling.whatif",
                                    pytest.param("handler.compare", marks=pytest.mark.slow), "bench.cores_matrix"])
def test_an_unknown_flag_or_a_missing_argument_is_one_line_naming_it_not_the_usage_block(module):
    for argv in (["--bogus"], []) if module.startswith("handler.profiling") else (["--bogus"],):  # the others run bare
        done = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True, text=True,
                              timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert ("--bogus" in lines[0] or "required" in lines[0]) and lines[0].endswith("(see --help)")
