"""Scheduling events and machine fields as found in exports no run of ours made (issue 57 point 1,
issue 54 point 6): each one line or `not recorded` with its reason, never a traceback, never 0 ms."""
import json
import shutil
import sqlite3
from contextlib import closing

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from handler.profiling.lab.cells import lab_reports
from handler.profiling.lab.page import build_lab
from handler.profiling.scaling.machine import machine_line, machine_of
from handler.profiling.scaling.sched import _covered, _inside, merged
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS
from tests.profiling.lab.kit_exports import with_kit_ranges
from tests.profiling.lab.test_machine import RANK_MAIN, RANKS, WORKERS_RUN

STEPS = [{**r, "loop": {"steps": 10}} for r in RANKS]
NSYS_SCHEMA = "start INTEGER NOT NULL, cpu INTEGER NOT NULL, isSchedIn INTEGER NOT NULL, globalTid INTEGER"


def with_sched(tmp_path, schema: str, rows: list[tuple]) -> dict:
    copy = tmp_path / "sched.sqlite"
    shutil.copyfile(WORKERS_RUN, copy)
    with closing(sqlite3.connect(copy)) as db:
        db.execute(f"CREATE TABLE SCHED_EVENTS ({schema})")
        if rows:
            db.executemany(f"INSERT INTO SCHED_EVENTS VALUES ({', '.join('?' * len(rows[0]))})", rows)
        db.commit()
    return machine_of(copy, STEPS, None, load_trace(copy).processes)


def test_rows_of_no_thread_are_left_out_and_counted_in_the_line(tmp_path):
    """globalTid is nullable in nsys' schema: such rows were a TypeError traceback."""
    found = with_sched(tmp_path, NSYS_SCHEMA, [(2_000_000_000, 0, 1, RANK_MAIN), (2_500_000_000, 0, 0, RANK_MAIN),
                                               (2_100_000_000, 0, 1, None), (2_200_000_000, 0, 0, None)])
    assert found["rank_cpu_ms"] == pytest.approx(500 / 20) and found["loader_cpu_ms"] == 0
    assert found["sched_events"]["no_thread"] == 2
    assert found["sched_line"] == "scheduling events: 2 of 4 inside the epochs; left out: 2 of no thread (globalTid NULL)"


def test_events_that_all_name_no_thread_are_not_recorded_saying_so(tmp_path):
    found = with_sched(tmp_path, NSYS_SCHEMA, [(2_000_000_000, 0, 1, None), (2_500_000_000, 0, 0, None)])
    assert found["loader_cpu_ms"] is None and found["rank_cpu_ms"] is None
    assert found["cpu_time_from"].endswith("and the report's 2 scheduling events name no thread (globalTid NULL)")


def test_a_table_of_other_column_names_is_not_recorded_naming_them(tmp_path):
    """Another export schema: an sqlite3.OperationalError traceback before."""
    found = with_sched(tmp_path, "timestamp INTEGER, cpu INTEGER, state INTEGER, tid INTEGER",
                       [(2_000_000_000, 0, 1, RANK_MAIN)])
    assert found["loader_cpu_ms"] is None
    assert ("the report's SCHED_EVENTS lacks start, isSchedIn, globalTid (it has cpu, state, tid, timestamp), not "
            "nsys' schema") in found["cpu_time_from"]
    assert found["sched_line"] is None and found["sched_events"] is None  # nothing counted: the reason is the line
    assert "SCHED_EVENTS lacks start" in machine_line(found)


def test_an_empty_table_is_not_recorded_not_ranks_of_no_cpu_time(tmp_path):
    """It read as 'loader 0 ms and rank 0 ms of CPU a step' before."""
    found = with_sched(tmp_path, NSYS_SCHEMA, [])
    assert (found["loader_cpu_ms"], found["rank_cpu_ms"]) == (None, None)
    assert found["cpu_time_from"].endswith("the report's SCHED_EVENTS table is empty (nsys recorded no scheduling event)")


def test_events_of_no_rank_thread_inside_the_epochs_are_not_recorded(tmp_path):
    found = with_sched(tmp_path, NSYS_SCHEMA, [(2_000_000_000, 0, 1, 99 << 24), (2_500_000_000, 0, 0, 99 << 24)])
    assert found["rank_cpu_ms"] is None
    assert "none of the report's 2 scheduling events is of a rank's or its loader's thread" in found["cpu_time_from"]


def _with_cores(source, target, value: str):
    if source != target:
        shutil.copyfile(source, target)
    with closing(sqlite3.connect(target)) as db:
        db.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'CpuCores'", (value,))
        db.commit()
    return target


@pytest.mark.parametrize("value", ["1" + "0" * 26, "-4", "0", "many", "2.5"])
def test_a_cpu_cores_that_is_no_count_of_cores_is_not_recorded_with_the_reason(tmp_path, value):
    export = _with_cores(REAL_EXPORTS["2026.2"], tmp_path / "cores.sqlite", value)
    found = machine_of(export, [{"pid": 216}, {"pid": 316}])
    assert found["cpu_cores"] is None
    assert found["cpu_cores_from"] == (f"not recorded (nsys TARGET_INFO_SYSTEM_ENV CpuCores reads {value!r}, no count "
                                       "of cores: not a whole number from 1 to 1,000,000)")
    asked = machine_of(export, [{"pid": 216}, {"pid": 316}], {"env": {"cpu_cores": 8}})
    assert asked["cpu_cores"] == 8 and asked["cpu_cores_from"].startswith("metrics env.cpu_cores (nsys")


def test_a_report_whose_cpu_cores_reads_1e26_keeps_its_lab_page_cell(tmp_path):
    """The summary check refused machine.cpu_cores 1e26 and the lab page left the whole report off."""
    folder = tmp_path / "nsight_logs" / "ddp_20251001_173341"
    folder.mkdir(parents=True)
    with_kit_ranges(REAL_EXPORTS["2026.2"], folder / "gpu_2.sqlite")
    _with_cores(folder / "gpu_2.sqlite", folder / "gpu_2.sqlite", "1" + "0" * 26)
    page, left_off = build_lab(lab_reports([tmp_path / "nsight_logs"]), tmp_path / "lab")
    rows = json.loads((tmp_path / "lab" / "lab.json").read_text())["reports"]
    assert left_off == [] and [(r["mode"], r["gpus"]) for r in rows] == [("ddp", 2)]
    assert "| ddp | 0.30 (1.00x" in page
    assert "| CPU cores | not recorded | not recorded (nsys TARGET_INFO_SYSTEM_ENV CpuCores reads " \
           "'100000000000000000000000000'" in page and "assumed: every loader gets cores of its own |" in page


def test_the_bench_reads_the_same_cpu_time_as_columns_as_the_reader_by_rows(tmp_path):
    """bench.sched_scale --quick: its generated events give the columns and the per-row reader one answer."""
    from bench.sched_scale import main
    main(["--quick", "--rounds", "1", "--json", str(tmp_path / "sched.json")])
    data = json.loads((tmp_path / "sched.json").read_text())
    assert data["bench"] == "sched_scale" and data["quick"] is True
    assert [s["same_cpu_time"] for s in data["sizes"]] == [True]


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 300)), min_size=1, max_size=6),
       st.lists(st.tuples(st.integers(-100, 1400), st.integers(0, 400)), min_size=1, max_size=20))
@settings(max_examples=200, deadline=None)
def test_the_time_inside_the_epochs_equals_a_sum_over_every_epoch(spans, intervals):
    """Each thread's interval on a core, clipped to the epochs as columns (sched._covered over merged
    windows), is the plain sum of its overlap with each epoch, the epochs overlapping or not."""
    windows = merged((a, a + n) for a, n in spans)
    starts = np.array([a for a, _ in intervals], dtype=np.int64)
    ends = starts + np.array([n for _, n in intervals], dtype=np.int64)
    columns = _covered(ends, windows) - _covered(starts, windows)
    by_hand = [sum(max(0, min(b, e) - max(a, s)) for s, e in windows) for a, b in zip(starts, ends)]
    assert columns.tolist() == by_hand
    assert _inside(starts, windows).tolist() == [any(s <= a < e for s, e in windows) for a in starts]
    union = {t for a, n in spans for t in range(a, a + n)}
    assert sum(e - s for s, e in windows) == len(union)
