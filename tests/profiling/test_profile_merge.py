"""One summary for a job profiled per node (handler/profiling/merge.py), from the real 2-GPU export
split into two reports, one per host, the second on a clock shifted by an hour (another machine's
boot time): merging must undo the shift through TARGET_INFO_SESSION_START_TIME."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from handler.profiling.analysis import host_named, summarize
from handler.profiling.merge import markdown_lines, merge
from handler.profiling.record.parse import parse_summary
from handler.profiling.trace import load_trace
from handler.runtime.errors import UserError
from tests.nsys_helpers import REAL_EXPORTS, REPO, with_training_ranges

SHIFT = 3_600_000_000_000  # ns: node2's clock reads an hour later than node1's for the same instant
TABLES = {"CUPTI_ACTIVITY_KIND_KERNEL": "globalPid", "CUPTI_ACTIVITY_KIND_MEMCPY": "globalPid",
          "CUPTI_ACTIVITY_KIND_MEMSET": "globalPid", "CUPTI_ACTIVITY_KIND_RUNTIME": "globalTid",
          "NVTX_EVENTS": "globalTid"}


def one_host(full, target, pid, tid, host, shift=0):
    """A copy of full with only pid's rows, a `host` mark, and its clock moved by shift."""
    shutil.copyfile(full, target)
    with sqlite3.connect(target) as db:
        for table, column in TABLES.items():
            db.execute(f"DELETE FROM {table} WHERE ({column} >> 24) & 16777215 != ?", (pid,))
            db.execute(f"UPDATE {table} SET start = start + ?, end = end + ?", (shift, shift))
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, NULL, 34, ?, ?, 0)",
                   (shift, f"host {host}", tid))
        db.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET systemClockNs = systemClockNs + ?", (shift,))
    return target


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    folder = tmp_path_factory.mktemp("job")
    full = folder / "full.sqlite"
    layout = with_training_ranges(REAL_EXPORTS["2026.2"], full, batches=6)
    (pid1, a), (pid2, b) = sorted(layout.items(), key=lambda kv: kv[1]["rank"])
    reports = folder / "reports"
    reports.mkdir()
    parts = [("77_node1.sqlite", one_host(full, reports / "77_node1.sqlite", pid1, a["tid"], "node1")),
             ("77_node2.sqlite", one_host(full, reports / "77_node2.sqlite", pid2, b["tid"], "node2", SHIFT))]
    return summarize(load_trace(full)), merge(parts), reports


def test_every_rank_is_named_with_its_host_and_its_report(job):
    _, merged, _ = job
    assert [(r["rank"], r["host"], r["report"]) for r in merged["ranks"]] == [
        (0, "node1", "77_node1.sqlite"), (1, "node2", "77_node2.sqlite")]
    assert merged["hosts"]["node1"]["ranks"] == [0] and merged["hosts"]["node2"]["ranks"] == [1]


def test_clocks_are_aligned_so_stragglers_equal_those_of_one_report_holding_both(job):
    single, merged, _ = job
    assert single["stragglers"] and single["stragglers"]["steps"] == 6
    for key in ("steps", "p50_ms", "p95_ms", "max_ms", "most_often_last", "last_rank_counts"):
        assert merged["stragglers"][key] == pytest.approx(single["stragglers"][key], abs=1e-6), key
    offsets = [r["clock_offset_ns"] for r in merged["reports"]]
    assert offsets[0] - offsets[1] == SHIFT
    host = merged["ranks"][single["stragglers"]["most_often_last"]]["host"]
    assert merged["stragglers"]["most_often_last_host"] == host


def test_the_job_reads_each_nodes_machine_and_keeps_the_fewest_where_they_differ(job, tmp_path):
    """Before, a merged summary had no machine block: the what-if of a job assumed every fact."""
    _, merged, reports = job
    assert [r["machine"]["cpu_cores"] for r in merged["reports"]] == [18, 18]  # nsys' CpuCores of each node
    assert merged["machine"]["cpu_cores"] == 18
    assert merged["machine"]["cpu_cores_from"] == "nsys TARGET_INFO_SYSTEM_ENV CpuCores"
    smaller = shutil.copyfile(reports / "77_node2.sqlite", tmp_path / "77_node2.sqlite")
    with sqlite3.connect(smaller) as db:
        db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = '8' WHERE name = 'CpuCores'")
    mixed = merge([("77_node1.sqlite", reports / "77_node1.sqlite"), ("77_node2.sqlite", smaller)])
    assert mixed["machine"]["cpu_cores"] == 8
    assert mixed["machine"]["cpu_cores_from"] == ("the fewest over the job's 2 reports (18, 8), "
                                                  "nsys TARGET_INFO_SYSTEM_ENV CpuCores")


def test_per_host_numbers_are_those_of_its_ranks(job):
    single, merged, _ = job
    for rank in single["ranks"]:
        host = merged["hosts"][f"node{rank['rank'] + 1}"]
        assert host["comm_s"] == pytest.approx(rank["comm"]["seconds"])
        assert host["comm_exposed_s"] == pytest.approx(rank["comm"]["exposed_s"])
        assert host["epochs"] == [{"epoch": 0, "time_s": pytest.approx(rank["epochs"][0]["time_s"])}]
        assert host["step_mean_ms"] == pytest.approx(rank["batches"]["mean_ms"])
        assert rank["gpu"]["kernel_time_s"] == pytest.approx(
            next(r for r in merged["ranks"] if r["rank"] == rank["rank"])["gpu"]["kernel_time_s"])


def test_the_same_rank_in_two_reports_is_one_line_error(job):
    _, _, reports = job
    with pytest.raises(UserError, match="rank 0 appears in b.sqlite"):
        merge([("a.sqlite", reports / "77_node1.sqlite"), ("b.sqlite", reports / "77_node1.sqlite")])


def test_report_of_a_folder_writes_one_job_summary_naming_both_hosts(job, tmp_path):
    _, _, reports = job
    run = subprocess.run([sys.executable, "-m", "handler.profiling.report", str(reports), "--out", str(tmp_path)],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert run.returncode == 0, run.stderr
    page = (tmp_path / "77.summary.md").read_text()
    assert "## Hosts" in page and "| node1 | 0 |" in page and "| node2 | 1 |" in page
    assert "rank 0 (node1)" in page and "rank 1 (node2)" in page
    summary = json.loads((tmp_path / "77.summary.json").read_text())
    assert sorted(summary["hosts"]) == ["node1", "node2"] and summary["stragglers"]["most_often_last_host"]
    from handler.profiling.record.parse import parse_summary
    assert parse_summary(summary, "77.summary.json").run.nodes == 2  # the job's summary keeps the contract
    assert [g["host"] for g in summary["gpus"]] == ["node1", "node2"]


def test_profiled_slurm_job_without_nsys_fails_in_one_line_before_starting(tmp_path):
    """train.sbatch outside Slurm (the Slurm variables set by hand): it must stop at the profiler
    check, before it asks Slurm anything."""
    from tests.nsys_helpers import path_without_nsys
    env = {**os.environ, "PATH": path_without_nsys(tmp_path), "PROFILE": "1", "SLURM_SUBMIT_DIR": str(REPO),
           "SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "node1", "CKPT": str(tmp_path / "ckpt"), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(REPO / "scripts" / "slurm" / "train.sbatch"), "--epochs", "1"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip() == ("train.sbatch: PROFILE=1 but nsys is not on PATH; install it on every node "
                                  "(scripts/install_nsys.sh) or run with PROFILE=0")


def test_a_two_node_job_keeps_every_nodes_gpus_with_its_host_its_model_and_run_and_is_a_valid_summary(job, tmp_path):
    """Before, a merged job's summary had no `gpus` and no model: its what-if predicted a CPU run."""
    from handler.profiling.record.parse import parse_summary
    from handler.profiling.whatif import markdown, predictions
    _, _, reports = job
    metrics = {"config": {"mode": "ddp", "model": "resnet18", "comm_hook": "fp16"}, "model": {"grad_mb": 44.696},
               "env": {"nodes": 2, "cpu_cores": 6, "hosts": {"0": "node1", "1": "node2"}}}
    merged = merge([("77_node1.sqlite", reports / "77_node1.sqlite"), ("77_node2.sqlite", reports / "77_node2.sqlite")],
                   metrics)
    assert [(g["host"], g["device"]) for g in merged["gpus"]] == [("node1", 0), ("node2", 1)]
    assert merged["model"] == "resnet18" and merged["comm_config"]["hook"] == "fp16"
    run = merged["run"]
    assert (run["mode"], run["nodes"], run["gpus_per_node"], run["processes"], run["grad_mb"]) == ("ddp", 2, 1, 2, 44.696)
    assert merged["machine"]["cpu_cores"] == 18 and merged["machine"]["rank_cores"] == 6
    found = predictions(parse_summary(json.loads(json.dumps(merged)), "77.summary.json"), (2, 4))
    assert found["split"].gpu and found["split"].devices == 2
    # the what-if reads the job as the user ran it: GPUs, two nodes, its ring across them on the link between
    assert found["harness_mode"] == "ddp" and found["nodes"].nodes == 2 and found["between"] is not None
    page = "\n".join(markdown(found, "77.summary.json"))
    assert "2 GPUs" in page and "CPU process" not in page and "between nodes" in page


def test_reports_without_host_marks_or_node_names_are_told_apart_by_the_exports_hostname(tmp_path):
    """Two node reports with no `host` mark and names train.sbatch does not write merged into one node
    of GPUs 0, 1, 0, 1; each export names its host (TARGET_INFO_SYSTEM_ENV Hostname)."""
    full = tmp_path / "full.sqlite"
    layout = with_training_ranges(REAL_EXPORTS["2026.2"], full, batches=4)
    parts = []
    for (pid, entry), name, hostname in zip(sorted(layout.items(), key=lambda kv: kv[1]["rank"]),
                                            ("first.sqlite", "second.sqlite"), ("gpu-a", "gpu-b")):
        target = one_host(full, tmp_path / name, pid, entry["tid"], "unused")
        with sqlite3.connect(target) as db:
            db.execute("DELETE FROM NVTX_EVENTS WHERE text LIKE 'host %'")
            db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (hostname,))
        parts.append((name, target))
    merged = merge(parts)
    assert [(r["rank"], r["host"], r["host_from"]) for r in merged["ranks"]] == [
        (0, "gpu-a", "export Hostname"), (1, "gpu-b", "export Hostname")]
    assert sorted(merged["hosts"]) == ["gpu-a", "gpu-b"]
    assert [g["host"] for g in merged["gpus"]] == ["gpu-a", "gpu-b"]
    assert [r["host_from"] for r in merged["reports"]] == ["export Hostname", "export Hostname"]
    assert "| first.sqlite | gpu-a | 0 |" in "\n".join(markdown_lines(merged))
    assert "| export Hostname |" in "\n".join(markdown_lines(merged))


def test_a_host_mark_comes_first_then_the_hostname_then_the_metrics():
    assert host_named("node1", "gpu-a", "m") == ("node1", "host mark")
    assert host_named(None, "gpu-a", "m") == ("gpu-a", "export Hostname")
    assert host_named(None, None, "m") == ("m", "metrics env.hosts")
    assert host_named(None, None, None) == (None, "not recorded: no host mark, Hostname or metrics env.hosts")


def test_a_single_report_without_host_marks_takes_its_host_from_the_exports_hostname(tmp_path):
    """One report, no `host` mark (the kit's runs have none): its ranks' host is the host nsys recorded on."""
    export = tmp_path / "one.sqlite"
    with_training_ranges(REAL_EXPORTS["2026.2"], export, batches=4)
    with sqlite3.connect(export) as db:
        db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = 'gpu-node-7' WHERE name = 'Hostname'")
    summary = summarize(load_trace(export), {"env": {"hosts": {"0": "from-metrics"}}})
    assert [(r["host"], r["host_from"]) for r in summary["ranks"]] == [
        ("gpu-node-7", "export Hostname"), ("gpu-node-7", "export Hostname")]
    parse_summary(summary, "one.summary.json", "report it as a bug")  # host_from is declared


def test_a_merge_names_a_node_from_its_file_name_only_where_its_report_names_none(tmp_path):
    full = tmp_path / "full.sqlite"
    layout = with_training_ranges(REAL_EXPORTS["2026.2"], full, batches=4)
    parts = []
    for (pid, entry), name in zip(sorted(layout.items(), key=lambda kv: kv[1]["rank"]), ("77_n1.sqlite", "77_n2.sqlite")):
        target = one_host(full, tmp_path / name, pid, entry["tid"], "unused")
        with sqlite3.connect(target) as db:
            db.execute("DELETE FROM NVTX_EVENTS WHERE text LIKE 'host %'")
            db.execute("DELETE FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
        parts.append((name, target))
    merged = merge(parts)
    assert [(r["host"], r["host_from"]) for r in merged["ranks"]] == [("n1", "file name"), ("n2", "file name")]
