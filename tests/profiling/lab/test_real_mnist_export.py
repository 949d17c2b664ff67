"""A real export of a loop named as the kit names its ranges (issue 54, points 2-4): PyTorch's MNIST
training on an A100, its DataLoader's four unnamed worker processes, 11,066 scheduling events and the
phases `Data loading`, `Copy to device`, `Forward pass`, `Backward pass`, `Optimizer.step#Adadelta.step`
(the README row of ../shared/nsys/README.md). Each number is checked against SQL over the export."""
import gzip
import shutil
import sqlite3
from contextlib import closing

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.conventions import KIT, from_mapping
from handler.profiling.render import markdown
from handler.profiling.scaling.machine import machine_of
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REPO

PACKED = REPO.parent / "shared" / "nsys" / "aiprofiler_secondOptimization.sqlite.gz"
RANK, WORKERS = 761957, (762773, 762774, 762925, 762927)  # the training process, its DataLoader's workers


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    if not PACKED.is_file():
        pytest.skip(f"{PACKED} is not here (the shared exports sit beside the checkout)")
    target = tmp_path_factory.mktemp("mnist") / "aiprofiler_secondOptimization.sqlite"
    with gzip.open(PACKED, "rb") as packed, open(target, "wb") as out:
        shutil.copyfileobj(packed, out)
    return target


@pytest.fixture(scope="module")
def read(export):
    trace = load_trace(export)
    summary = summarize(trace)
    summary["machine"] = machine_of(export, summary["ranks"], None, trace.processes)
    return trace, summary


def _sql(export, query, *args):
    with closing(sqlite3.connect(f"file:{export}?mode=ro", uri=True)) as db:
        return db.execute(query, args).fetchall()


def _epoch(export):
    return _sql(export, "SELECT n.start, n.end FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                        "WHERE COALESCE(n.text, s.value) = 'Epoch 2'")[0]


def test_its_four_unnamed_dataloader_workers_are_seen_two_a_pass(read):
    """No `pt_data_worker` thread (torch 1.12 named none): the four python3 children, started after the
    rank, scheduled inside its epoch, with no NVTX or CUDA of their own, are its workers; two bursts of
    two, for the two passes its loop names (`Train` and `Test` inside `Epoch 2`)."""
    _, summary = read
    machine = summary["machine"]
    assert machine["loader_workers"] == 2
    assert machine["loader_workers_from"].startswith("report: the report holds 4 DataLoader worker processes "
                                                     "(4 unnamed: `python3` processes started after the rank")
    assert machine["loader_workers_from"].endswith("over 1 rank, started in 2 bursts of 2 (2 passes named in the report)")


def _cpu_ns(export, pids, window):
    """Each thread's time on a core inside the window, walked event by event: the oracle."""
    spent, running = 0, {}
    for start, into, tid in _sql(export, "SELECT start, isSchedIn, globalTid FROM SCHED_EVENTS "
                                         "WHERE globalTid IS NOT NULL ORDER BY start, rowid"):
        if (tid >> 24) & 0xFFFFFF not in pids:
            continue
        if into:
            running[tid] = start
        elif tid in running:
            begun = running.pop(tid)
            spent += max(0, min(start, window[1]) - max(begun, window[0]))
    return spent


def test_its_cpu_time_is_read_from_its_scheduling_events_inside_the_kits_epoch(read, export):
    _, summary = read
    machine, steps, window = summary["machine"], summary["ranks"][0]["loop"]["steps"], _epoch(export)
    assert steps == 59
    assert machine["loader_cpu_ms"] == pytest.approx(_cpu_ns(export, set(WORKERS), window) / 1e6 / steps)
    assert machine["rank_cpu_ms"] == pytest.approx(_cpu_ns(export, {RANK}, window) / 1e6 / steps)
    assert machine["loader_cpu_ms"] > 100 and machine["rank_cpu_ms"] > 1
    assert machine["cpu_time_from"].startswith("report: nsys SCHED_EVENTS inside the ranks' epochs")


def test_its_scheduling_events_are_counted_inside_epoch_2_and_the_rest_said_in_one_line(read, export):
    _, summary = read
    start, end = _epoch(export)
    pids = ", ".join(map(str, (RANK, *WORKERS)))
    (inside,), = _sql(export, f"SELECT COUNT(*) FROM SCHED_EVENTS WHERE (globalTid >> 24) & 16777215 IN ({pids}) "
                              "AND start >= ? AND start < ?", start, end)
    counts = summary["machine"]["sched_events"]
    assert counts["in_epochs"] == inside and counts["total"] == 11066
    assert counts["in_epochs"] + counts["outside_epochs"] + counts["other_processes"] + counts["no_thread"] == 11066
    line = summary["machine"]["sched_line"]
    assert line == (f"scheduling events: {inside} of 11066 inside the epochs; left out: {counts['outside_epochs']} of "
                    "the ranks' and loaders' threads outside every epoch")
    assert line in markdown(summary, "mnist")


def test_its_phases_are_read_by_the_kits_names(read):
    trace, summary = read
    rank = summary["ranks"][0]
    assert trace.convention == KIT.name and summary["phases_unmatched"] is None
    for phase in ("h2d", "forward", "backward", "optimizer"):
        assert rank["phases"][phase]["count"] >= 59 and rank["phases"][phase]["share"] > 0.03, phase
    assert rank["outside_training"]["test"]["count"] == 1  # its `Test` pass
    assert rank["loop"]["between_steps_ms"] > 100  # `Data loading` sits between the steps: the wait for data


def test_one_epoch_range_without_a_number_is_epoch_0_and_unmatched_phases_are_one_line(export):
    trace = load_trace(export, from_mapping(["epoch=Train", "step=Batch *"]))
    summary = summarize(trace)
    assert [e["epoch"] for e in summary["ranks"][0]["epochs"]] == [0]
    assert summary["ranks"][0]["loop"]["steps"] == 59
    assert summary["phases_unmatched"].startswith("no range inside the steps bears a phase name of the user mapping")
    assert "--ranges" in summary["phases_unmatched"]
    assert f"**Phases not read**: {summary['phases_unmatched']}." in markdown(summary, "mnist")


def test_its_data_loading_between_the_steps_is_the_loops_wait_not_nothing(read, export):
    """Its `Data loading` ranges lie between its `Batch N` ranges, not inside them: the head line said
    data-stall 0 % and between steps 95 %, without a word of the loader. The share of the time between
    the steps its data ranges cover equals SQL's sum over them (the export's own, inside `Epoch 2`)."""
    _, summary = read
    loop = summary["ranks"][0]["loop"]
    start, end = _epoch(export)
    ranges = _sql(export, "SELECT n.start, n.end, COALESCE(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                          "ON s.id = n.textId WHERE n.start >= ? AND n.end <= ? AND (COALESCE(n.text, s.value) = "
                          "'Data loading' OR COALESCE(n.text, s.value) LIKE 'Batch %')", start, end)
    data = sorted((a, b) for a, b, name in ranges if name == "Data loading")
    batches = sorted((a, b) for a, b, name in ranges if name != "Data loading")
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(data, data[1:]))  # one after the other
    inside = sum(max(0, min(b, d) - max(a, c)) for a, b in data for c, d in batches)
    expected_ms = (sum(b - a for a, b in data) - inside) / 1e6 / loop["steps"]
    assert loop["between_steps_data_ms"] == pytest.approx(expected_ms, rel=1e-9)
    assert 0 < loop["between_steps_data_ms"] <= loop["between_steps_ms"]
    share = loop["between_steps_data_ms"] / loop["step_mean_ms"]
    assert f"between steps {loop['between_steps_ms'] / loop['step_mean_ms'] * 100:.1f} % (data ranges {share * 100:.1f} %)" \
        in markdown(summary, "aip.nsys-rep")
