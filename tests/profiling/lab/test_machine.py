"""The machine a report ran on, read and not assumed (handler/profiling/scaling/machine.py): the host's
cores from nsys' TARGET_INFO_SYSTEM_ENV in the real exports of tests/data, the loader's workers from
the processes and threads the export names, the metrics JSON where the report does not say."""
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from handler.profiling.scaling.machine import machine_of
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS, REPO
from tests.profiling.scale_inputs import DALI_CPU


def test_the_host_cores_come_from_the_export_where_nsys_recorded_them():
    two_gpu = machine_of(REAL_EXPORTS["2026.2"], [{"pid": 216}, {"pid": 316}])
    assert (two_gpu["cpu_cores"], two_gpu["cpu_cores_from"]) == (18, "nsys TARGET_INFO_SYSTEM_ENV CpuCores")
    assert machine_of(REAL_EXPORTS["2022.2"], [{"pid": 1230493}])["cpu_cores"] == 128
    # nsys 2022.4's CPU capture here kept no TARGET_INFO_SYSTEM_ENV: the metrics say, and the block says so
    dali = machine_of(DALI_CPU, [{"pid": 21455}], {"env": {"cpu_cores": 2, "torch_threads": 1}})
    assert (dali["cpu_cores"], dali["cpu_cores_from"]) == (2, "metrics env.cpu_cores")
    assert (dali["threads_per_rank"], dali["threads_per_rank_from"]) == (1, "metrics env.torch_threads")
    bare = machine_of(DALI_CPU, [{"pid": 21455}])
    assert bare["cpu_cores"] is None and bare["cpu_cores_from"] == "not recorded"


def test_the_loader_workers_are_read_from_the_report_or_the_metrics():
    # DALI's CPU pipeline of that run (--workers 2) ran its pool as [DALI][TP0] and [DALI][TP1]
    dali = machine_of(DALI_CPU, [{"pid": 21455}])
    assert dali["loader_workers"] == 2 and "DALI" in dali["loader_workers_from"]
    asked = machine_of(DALI_CPU, [{"pid": 21455}], {"config": {"workers": 4}})
    assert (asked["loader_workers"], asked["loader_workers_from"]) == (4, "metrics config.workers")
    # the 2-GPU run loaded in its ranks: no DataLoader worker process, no DALI thread
    assert machine_of(REAL_EXPORTS["2026.2"], [{"pid": 216}, {"pid": 316}])["loader_workers"] == 0


WORKERS_RUN = REPO / "tests" / "data" / "nsys" / "ddp_workers2_cpu2_nsys2022.4.sqlite"  # README.md there
RANKS = [{"pid": 31396}, {"pid": 31397}]


def read(export: Path, ranks: list[dict], metrics: dict | None = None) -> dict:
    """The machine block as the report reads it: with the trace's processes, whose epochs place the events."""
    return machine_of(export, ranks, metrics, load_trace(export).processes)


def test_dataloader_workers_are_read_from_their_bursts_of_forks_one_per_pass():
    """torch names a DataLoader worker's thread pt_data_worker and starts them anew for every pass:
    this 3-epoch run of --workers 2 on 2 ranks (validation each epoch, then test) holds 28. Before,
    their count over the capture was taken as the workers per process (14 for one rank)."""
    found = read(WORKERS_RUN, RANKS)
    assert found["loader_workers"] == 2
    assert found["loader_workers_from"] == ("report: the report holds 28 `pt_data_worker` processes over 2 ranks, "
                                            "started in 7 bursts of 4 (7 passes named in the report)")
    asked = read(WORKERS_RUN, RANKS, {"config": {"workers": 3}})
    assert (asked["loader_workers"], asked["loader_workers_from"]) == (3, "metrics config.workers")


def edited(tmp_path, sql: str, *args) -> Path:
    copy = tmp_path / "workers.sqlite"
    shutil.copyfile(WORKERS_RUN, copy)
    with closing(sqlite3.connect(copy)) as db:
        db.execute(sql, args)
        db.commit()
    return copy


WORKER_ROWS = ("DELETE FROM ThreadNames WHERE nameId = (SELECT id FROM StringIds WHERE value = 'pt_data_worker') "
               "AND (globalTid >> 24) & 16777215 ")


def test_bursts_of_unequal_size_are_not_read_and_say_so(tmp_path):
    found = read(edited(tmp_path, WORKER_ROWS + "= 31461"), RANKS)  # one worker of the first pass gone
    assert found["loader_workers"] is None
    assert found["loader_workers_from"].startswith("not read: the report holds 27 `pt_data_worker` processes over "
                                                   "2 ranks, started in 7 bursts of 3, 4, so how many")
    assert "config.workers" in found["loader_workers_from"]


def test_bursts_that_do_not_number_the_named_passes_are_not_read(tmp_path):
    found = read(edited(tmp_path, WORKER_ROWS + "BETWEEN 31456 AND 31461"), RANKS)  # a pass's burst gone
    assert found["loader_workers"] is None
    assert "started in 6 bursts where the report names 7 passes per rank" in found["loader_workers_from"]


def test_without_named_passes_the_bursts_alone_give_the_workers(tmp_path):
    """The kit's reports name epochs only: the bursts, the ranks in step, say it."""
    bare = edited(tmp_path, "DELETE FROM NVTX_EVENTS WHERE COALESCE(text, (SELECT value FROM StringIds "
                            "WHERE id = textId)) IN ('validate', 'test')")
    found = read(bare, RANKS)
    assert found["loader_workers"] == 2 and found["loader_workers_from"].endswith("(one per pass, the ranks in step)")


RANK_MAIN, WORKER, NSYS, DALI = 282001714215862, 282006210509744, 282002553076441, 282001714216000  # 31396, 31664, 31446


def test_a_report_without_cpu_time_in_its_metrics_gives_it_from_the_schedulers_events(tmp_path):
    """nsys' SCHED_EVENTS (the kit's captures sample the CPU): each thread's time on a core inside the ranks'
    epoch ranges (epoch 0 of the two ranks spans 1.53-10.44 s here), split into the loader's and the rank's."""
    copy = tmp_path / "sched.sqlite"
    shutil.copyfile(WORKERS_RUN, copy)
    events = [(2.0e9, 1, RANK_MAIN), (3.0e9, 0, RANK_MAIN),  # 1 s of the rank's main thread, inside epoch 0
              (10.4e9, 1, RANK_MAIN), (11.0e9, 0, RANK_MAIN),  # 35.47 ms of it before epoch 0's range ends
              (5.0e9, 1, WORKER), (5.5e9, 0, WORKER),  # a DataLoader worker: the loader's
              (6.0e9, 1, DALI), (6.2e9, 0, DALI),  # a DALI thread of the rank: the loader's
              (2.0e9, 1, NSYS), (9.0e9, 0, NSYS)]  # nsys' own thread: neither
    with closing(sqlite3.connect(copy)) as db:
        db.execute("CREATE TABLE SCHED_EVENTS (start INTEGER NOT NULL, cpu INTEGER NOT NULL, isSchedIn INTEGER NOT "
                   "NULL, globalTid INTEGER)")
        db.executemany("INSERT INTO SCHED_EVENTS VALUES (?, 0, ?, ?)", [(int(t), i, g) for t, i, g in events])
        db.execute("INSERT INTO StringIds (id, value) VALUES (100000, '[DALI][TP0]')")
        db.execute("INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (100000, 0, ?)", (DALI,))
        db.commit()
    ranks = [{**r, "loop": {"steps": 10}} for r in RANKS]
    found = read(copy, ranks)
    assert found["rank_cpu_ms"] == pytest.approx((1000 + 35.469784) / 20)
    assert found["loader_cpu_ms"] == pytest.approx((500 + 200) / 20)
    assert found["cpu_time_from"].startswith("report: nsys SCHED_EVENTS")
    recorded = read(copy, ranks, {"epochs": [{"cpu_time": {"loader_ms_per_step": 3.0, "rank_ms_per_step": 9.0}}]})
    assert (recorded["loader_cpu_ms"], recorded["rank_cpu_ms"]) == (3.0, 9.0)  # the run's own, where it wrote them
    bare = read(WORKERS_RUN, ranks)
    assert bare["loader_cpu_ms"] is None and "no nsys scheduling events in the report" in bare["cpu_time_from"]
