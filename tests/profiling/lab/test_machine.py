"""The machine a report ran on, read and not assumed (handler/profiling/scaling/machine.py): the host's
cores from nsys' TARGET_INFO_SYSTEM_ENV in the real exports of tests/data, the loader's workers from
the processes and threads the export names, the metrics JSON where the report does not say."""
import shutil
import sqlite3

from handler.profiling.scaling.machine import machine_of
from tests.nsys_helpers import REAL_EXPORTS
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


def test_dataloader_worker_processes_over_a_capture_are_not_taken_as_the_workers_per_loader(tmp_path):
    """torch names a DataLoader worker's thread pt_data_worker, and starts them anew for every pass:
    a 3-epoch CPU run of --workers 2 held 14 of them. The export keeps no process lifetimes, so the
    count per loader is not read (before: 14 read as 14 workers per process); the metrics JSON gives it."""
    copy = tmp_path / "workers.sqlite"
    shutil.copyfile(REAL_EXPORTS["2026.2"], copy)
    db = sqlite3.connect(copy)
    name_id = db.execute("SELECT MAX(id) FROM StringIds").fetchone()[0] + 1
    db.execute("INSERT INTO StringIds (id, value) VALUES (?, 'pt_data_worker')", (name_id,))
    for pid in (901, 902, 903, 904):
        db.execute("INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, 0, ?)",
                   (name_id, (pid << 24) | pid))
    db.commit()
    db.close()
    found = machine_of(copy, [{"pid": 216}, {"pid": 316}])
    assert found["loader_workers"] is None
    assert found["loader_workers_from"].startswith("not read: the report holds 4 `pt_data_worker` processes over 2")
    asked = machine_of(copy, [{"pid": 216}, {"pid": 316}], {"config": {"workers": 2}})
    assert (asked["loader_workers"], asked["loader_workers_from"]) == (2, "metrics config.workers")
