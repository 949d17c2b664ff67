"""Any lab profile explained: the kit's, torch.profiler's and a user's range names, ranks without
our marks, the per-GPU table checked against SQL, both GPU-metric schemas, a too-new report,
the figures and the lab page."""
import json
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing

import pytest

from handler.profiling import nsys
from handler.profiling.analysis import summarize
from handler.profiling.conventions import KIT, TORCH_PROFILER, from_mapping
from handler.profiling.trace import load_trace
from handler.runtime.errors import UserError
from tests.nsys_helpers import REAL_EXPORTS, REPO, profile, require_nsys
from tests.profiling.lab.kit_exports import INSIDE, SETUP, with_kit_ranges
from tests.profiling.test_profile_report import fake_export, run_report

MS = 1_000_000


@pytest.fixture(scope="module", params=sorted(REAL_EXPORTS))
def kit_export(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("kit") / f"kit_{request.param}.sqlite"
    return path, with_kit_ranges(REAL_EXPORTS[request.param], path)


def test_a_real_gpu_export_named_as_the_kit_names_ranges_reads_as_the_kit_convention(kit_export):
    path, layout = kit_export
    summary = summarize(load_trace(path))
    assert summary["convention"] == KIT.name
    assert summary["rank_source"] == "processes that launched kernels, in pid order"
    assert [r["pid"] for r in summary["ranks"]] == sorted(layout)
    for rank in summary["ranks"]:
        own = layout[rank["pid"]]
        loop = rank["loop"]
        epoch_ms = (own["epoch"][1] - own["epoch"][0]) / 1e6
        assert loop["steps"] == len(own["steps"]) and loop["step_mean_ms"] == pytest.approx(epoch_ms / len(own["steps"]))
        assert loop["inside_steps_ms"] == pytest.approx(INSIDE * epoch_ms / len(own["steps"]), rel=1e-6)
        assert loop["between_steps_ms"] == pytest.approx((1 - INSIDE) * epoch_ms / len(own["steps"]), rel=1e-5)
        forward_and_loss = sum(e - s for n, s, e in own["phases"] if n in ("forward", "loss")) / 1e6
        assert loop["phase_ms"]["forward"] == pytest.approx(forward_and_loss / len(own["steps"]))
        uploads = sum(e - s for n, s, e in own["phases"] if n == "upload data to GPU") / 1e6
        assert loop["phase_ms"]["h2d"] == pytest.approx(uploads / len(own["steps"]))
        setup = {s["name"]: s["total_s"] for s in rank["setup"]}
        assert all(setup[n] == pytest.approx((e - s) / 1e9) for n, s, e in own["setup"])
        assert [s["name"] for s in rank["setup"] if s["name"] in SETUP] == list(SETUP)
        assert rank["gpu"]["devices"] and rank["gpu"]["kernels"] > 0  # each rank's GPU: the device of its kernels


def _sql_busy(db, device: int, start: int, end: int, where: str = "") -> int:
    """The union of the device's kernels clipped to [start, end), in SQL: in start order, each kernel
    adds what reaches past the furthest end before it."""
    return db.execute(f"""
        WITH k AS (SELECT MAX(start, :s) AS a, MIN(end, :e) AS b FROM CUPTI_ACTIVITY_KIND_KERNEL
                   WHERE deviceId = :d AND end > :s AND start < :e {where}),
             o AS (SELECT a, b, MAX(b) OVER (ORDER BY a, b ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
                   FROM k)
        SELECT COALESCE(SUM(MAX(0, b - MAX(a, COALESCE(reach, a)))), 0) FROM o""",
                      {"s": start, "e": end, "d": device}).fetchone()[0]


def test_busy_shares_nccl_time_and_copies_per_gpu_equal_an_sql_computation(kit_export):
    path, layout = kit_export
    summary = summarize(load_trace(path))
    with closing(sqlite3.connect(path)) as db:
        nccl = "AND shortName IN (SELECT id FROM StringIds WHERE value LIKE '%nccl%')"
        for gpu in summary["gpus"]:
            pids = [p for p in layout if db.execute(
                "SELECT 1 FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ? AND (globalPid >> 24) & 16777215 = ?",
                (gpu["device"], p)).fetchone()]
            (start, end), = {layout[p]["epoch"] for p in pids} if len(pids) == 1 else [(
                min(layout[p]["epoch"][0] for p in pids), max(layout[p]["epoch"][1] for p in pids))]
            span = end - start
            assert gpu["kernel_busy_share"] == pytest.approx(_sql_busy(db, gpu["device"], start, end) / span, rel=1e-12)
            assert gpu["compute_busy_share"] == pytest.approx(
                _sql_busy(db, gpu["device"], start, end, "AND NOT (1 " + nccl + ")") / span, rel=1e-12)
            nccl_ns = db.execute(f"SELECT COALESCE(SUM(end - start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ? "
                                 f"AND start >= ? AND start < ? {nccl}", (gpu["device"], start, end)).fetchone()[0]
            assert gpu["nccl_kernel_s"] == pytest.approx(nccl_ns / 1e9, rel=1e-12)
            kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}
            expected = {kinds.get(k, "other"): {"count": n, "mb": b / 1e6, "seconds": t / 1e9} for k, n, b, t in db.execute(
                "SELECT copyKind, COUNT(*), SUM(bytes), SUM(end - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                "WHERE deviceId = ? AND start >= ? AND start < ? GROUP BY copyKind", (gpu["device"], start, end))}
            assert gpu["memcpy"] == expected
            assert gpu["memcpy"]  # the exports copy on every GPU: a sum of nothing cannot pass


# A small CPU loop that names its ranges as the kit's loop does; no rank mark, no data range (the
# wait between steps is the loader's). torch.cuda.nvtx records them: this machine's nsys 2022.4
# records no range of the `nvtx` package 0.2.17's annotate, whose ranges the real-export test
# above puts in a second domain instead.
KIT_LOOP = textwrap.dedent("""
    import time
    from torch.cuda import nvtx

    def timed(name, ms):
        nvtx.range_push(name)
        time.sleep(ms / 1000)
        nvtx.range_pop()

    timed("Set data loader", 5)
    timed("Set Data Parallelism", 3)
    nvtx.range_push("Epoch 0")
    for i in range(5):
        time.sleep(0.008)  # the loader: no range
        nvtx.range_push(f"Batch {i}")
        for name, ms in (("upload data to GPU", 1), ("forward", 4), ("loss", 1), ("backward", 6)):
            timed(name, ms)
        nvtx.range_pop()
    nvtx.range_pop()
""")


@pytest.fixture(scope="module")
def kit_cpu_report(tmp_path_factory):
    require_nsys()
    folder = tmp_path_factory.mktemp("kitcpu")
    (folder / "loop.py").write_text(KIT_LOOP)
    return profile([sys.executable, str(folder / "loop.py")], folder / "kitloop")


def test_a_cpu_profile_of_a_loop_named_as_the_kit_gets_the_full_report(kit_cpu_report):
    result = run_report(kit_cpu_report)
    assert result.returncode == 0, result.stderr
    summary = json.loads(kit_cpu_report.with_name("kitloop.summary.json").read_text())
    assert summary["convention"] == KIT.name and summary["rank_source"].startswith("processes that opened epochs")
    rank, = summary["ranks"]
    assert rank["batches"]["count"] == rank["loop"]["steps"] == 5
    assert rank["loop"]["between_steps_ms"] >= 7.5 and rank["loop"]["inside_steps_ms"] >= 11.5
    assert rank["loop"]["phase_ms"]["forward"] >= 4.9 and rank["loop"]["phase_ms"]["h2d"] >= 0.9
    assert [s["name"] for s in rank["setup"]][:2] == ["Set data loader", "Set Data Parallelism"]
    assert summary["recorded_by_nsys"] == nsys.nsys_version().split("-")[0].rsplit(".", 1)[0]
    assert "Nsight Systems 2022.4 or newer" in result.stdout or summary["open_with"] in result.stdout


def test_the_lab_page_over_a_kit_layout_folder_of_three_modes_and_two_counts(tmp_path, kit_export):
    path, _ = kit_export
    logs = tmp_path / "nsight_logs"
    for mode in ("dp", "ddp", "ddp_dali"):
        for gpus in (1, 2):
            folder = logs / f"{mode}_20251001_17334{gpus}"
            folder.mkdir(parents=True)
            (folder / f"gpu_{gpus}.sqlite").write_bytes(path.read_bytes())
    # a run's metrics beside its report know its mode and GPU count better than a name
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "ddp_gpu2.sqlite").write_bytes(path.read_bytes())
    (flat / "run7.sqlite").write_bytes(path.read_bytes())
    (flat / "run7.metrics.json").write_text(json.dumps({"config": {"mode": "ddp_dali", "num_gpu": 4}}))
    from handler.profiling.lab.cells import lab_reports
    assert [(e["mode"], e["gpus"]) for e in lab_reports([flat])] == [("ddp", 2), ("ddp_dali", 4)]
    result = run_report(logs, "--out", tmp_path / "lab")
    assert result.returncode == 0, result.stderr
    lab = json.loads((tmp_path / "lab" / "lab.json").read_text())
    assert sorted((r["mode"], r["gpus"]) for r in lab["reports"]) == [(m, n) for m in ("ddp", "ddp_dali", "dp")
                                                                      for n in (1, 2)]
    page = (tmp_path / "lab" / "lab.md").read_text()
    for r in lab["reports"]:
        assert (tmp_path / "lab" / f"{r['name']}.png").stat().st_size > 1000
        assert r["verdict"]["line"] in page and "the epoch takes at least" in r["verdict"]["line"]
        assert r["figure"]["bands"] and all(b["steps"] > 0 for b in r["figure"]["bands"])
        assert r["speedup"] == pytest.approx(1.0)  # the same export in every cell
    assert "| mode | 1 GPU | 2 GPUs |" in page and "## Copies" in page and "## Per GPU" in page


def test_the_bound_takes_the_larger_of_the_step_range_and_the_gpu_busy_time():
    """The TAs' DDP 1-GPU numbers: a 333 ms step, 34 ms inside the step range, the GPU busy 97 ms
    a step, 98 steps: loader-bound, at least 98 x 97 ms = 9.5 s."""
    from handler.profiling.lab.page import verdict
    steps = 98
    summary = {"ranks": [{"loop": {"epochs_s": steps * 0.333, "epochs": 1, "steps": steps, "step_mean_ms": 333.0,
                                   "inside_steps_ms": 34.0, "between_steps_ms": 299.0, "phase_ms": {}}}],
               "overall": {"epoch_mean_s": None},
               "gpus": [{"kernel_busy_s": 0.097 * steps, "kernel_busy_share": 97.0 / 333.0, "compute_busy_share": None,
                         "epochs_s": 0.0, "nccl_kernel_s": 0.0}]}
    result = verdict(summary)
    assert result["bound_s"] == pytest.approx(9.506) and result["line"].startswith("loader-bound: 90 % of each step")


def test_torch_profiler_steps_make_one_epoch_and_a_user_mapping_names_any_ranges(tmp_path):
    steps = [(4, f"ProfilerStep#{i}", i * 100 * MS, i * 100 * MS + 80 * MS) for i in range(3)]
    summary = summarize(load_trace(fake_export(tmp_path / "tp.sqlite", steps)))
    assert summary["convention"] == TORCH_PROFILER.name
    assert summary["ranks"][0]["epochs"] == [{"epoch": 0, "time_s": pytest.approx(0.28)}]
    assert summary["ranks"][0]["loop"]["between_steps_ms"] == pytest.approx(40 / 3)
    mine = [(4, "train round 2", 0, 100 * MS), (4, "it 1", 0, 50 * MS), (4, "fwd pass", 10 * MS, 30 * MS)]
    mapping = from_mapping(["epoch=Train round *", "step=IT *", "forward=fwd*"])
    summary = summarize(load_trace(fake_export(tmp_path / "mine.sqlite", mine), mapping))
    assert summary["convention"].startswith("user mapping") and summary["ranks"][0]["epochs"][0]["epoch"] == 2
    assert summary["ranks"][0]["phases"]["forward"]["total_s"] == pytest.approx(0.02)


@pytest.mark.parametrize("items, fragment", [(["epoch=Epoch"], "needs step="), (["step=Batch"], "exactly one `*`"),
                                             (["speed=fast"], "KEY=PATTERN")])
def test_a_bad_range_mapping_is_one_line_naming_the_fix(items, fragment):
    with pytest.raises(UserError, match=fragment.replace("*", r"\*")):
        from_mapping(items)


# GPU metrics as nsys 2022.4 and 2024 on name them (TARGET_INFO_GPU_METRICS.metricName).
SCHEMAS = {"2022.4": ("GR Active [Throughput %]", "SM Active [Throughput %]", "Tensor Active [Throughput %]",
                      "DRAM Read Bandwidth [Throughput %]", "PCIe TX Throughput [Throughput %]"),
           "2024+": ("GPU Active [Throughput %]", "SMs Active [Throughput %]", "Tensor Active [Throughput %]",
                     "DRAM Read Bandwidth [Throughput %]", "PCIe TX Throughput [Throughput %]")}


@pytest.mark.parametrize("schema", sorted(SCHEMAS))
def test_gpu_metric_means_per_gpu_read_both_nsys_metric_schemas(tmp_path, schema):
    path = fake_export(tmp_path / "m.sqlite", [(7, "Epoch 0", 0, 100 * MS), (7, "Batch 0", 0, 100 * MS)],
                       kernels=[(7, "sgemm", 10 * MS, 60 * MS)])
    with closing(sqlite3.connect(path)) as db:
        db.executescript("""CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT,
                                metricId INTEGER, metricName TEXT);
                            CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER);""")
        for metric, name in enumerate(SCHEMAS[schema]):
            db.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (256, 0, 'GA102', ?, ?)", (metric, name))
            db.executemany("INSERT INTO GPU_METRICS VALUES (?, 256, ?, ?)",
                           [(t * MS, metric, 10 * (metric + 1) + t // 10 % 2) for t in range(0, 120, 10)])
        db.commit()
    gpu, = summarize(load_trace(path))["gpus"]
    # samples at 0..90 ms lie in the epoch: five of value v and five of v + 1
    assert gpu["metrics"] == pytest.approx({"gpu_active_pct": 10.5, "sm_active_pct": 20.5, "tensor_active_pct": 30.5,
                                            "dram_read_pct": 40.5, "pcie_tx_pct": 50.5, "dram_bw_pct": 40.5})
    assert gpu["kernel_busy_share"] == pytest.approx(0.5)


def test_a_report_newer_than_the_local_nsys_names_the_version_and_how_to_export_it(tmp_path, monkeypatch):
    """The header is built to the layout nsys 2024+ writes and quotes in its own error
    ("Report 2025@5@1@..."); no real 2025.5 report could be fetched here."""
    report = tmp_path / "gpu_1.nsys-rep"
    report.write_bytes(b"\x00\x10NVIDIA Nsight Systems Report 2025@5@1@3b0f72a\x00" + bytes(64))
    monkeypatch.setattr(nsys, "nsys_version", lambda: "2022.4.2.1-df9881f")
    line = nsys.too_new(report, "")
    assert line == (f"{report} was recorded by nsys 2025.5.1, newer than this machine's nsys 2022.4.2.1-df9881f; "
                    f"export it with nsys 2025.5 or newer (`nsys export --type sqlite {report}`, also on a laptop), "
                    "then pass the .sqlite")
    assert nsys.open_with(nsys.recorded_version(report)) == "open it with Nsight Systems 2025.5 or newer"
    monkeypatch.setattr(nsys, "nsys_version", lambda: "2026.1.1.1")
    assert nsys.too_new(report, "") is None


def test_the_report_command_prints_the_version_line_for_a_too_new_report(tmp_path):
    require_nsys()
    report = tmp_path / "gpu_1.nsys-rep"
    report.write_bytes(b"NVIDIA Nsight Systems Report 2099@5@1@3b0f72a\x00" + bytes(64))
    result = run_report(report)
    assert result.returncode != 0 and "recorded by nsys 2099.5.1, newer than this machine's nsys" in result.stderr
    assert "crashed" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_the_real_gpu_exports_state_the_nsys_that_exported_them():
    assert nsys.recorded_version(REAL_EXPORTS["2026.2"]) == "2026.2.1.210"
    assert nsys.recorded_version(REAL_EXPORTS["2022.2"]) == "2022.2.1.31"


def test_the_report_module_help_runs():
    result = subprocess.run([sys.executable, "-m", "handler.profiling.report", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--ranges" in result.stdout and "--lab" in result.stdout


def test_a_comparisons_profiled_cells_get_the_lab_page(tmp_path, kit_export):
    """handler.compare hands its cells (label, count, report, metrics) to the page writer; only the
    .sqlite export of a cell is left here, and a cell without any report is left out. Each cell's
    what-if takes its own model's gradients from its metrics (resnet20's 1.08 MB, not ResNet-18's)."""
    from handler.profiling.lab.page import write_cells_lab
    from handler.profiling.record.metrics import Metrics
    path, _ = kit_export
    cells = []
    for label, count in (("ddp", 1), ("ddp", 2), ("fast", 2)):
        folder = tmp_path / "cells" / f"{label}-n{count}"
        folder.mkdir(parents=True)
        (folder / f"{label}-n{count}.sqlite").write_bytes(path.read_bytes())
        cells.append((label, count, folder / f"{label}-n{count}.nsys-rep",
                      Metrics.model_validate({"config": {"model": "resnet20"}})))
    cells.append(("gone", 4, tmp_path / "cells" / "gone-n4" / "gone-n4.nsys-rep", None))
    page = write_cells_lab(cells, tmp_path / "lab")
    assert page == tmp_path / "lab" / "lab.md" and page.is_file()
    lab = json.loads((tmp_path / "lab" / "lab.json").read_text())
    assert [(r["mode"], r["gpus"]) for r in lab["reports"]] == [("ddp", 1), ("ddp", 2), ("fast", 2)]
    assert {r["model"] for r in lab["reports"]} == {"resnet20"}
    text = page.read_text()
    assert "| sent a step | 1.08 MB (fp32) | resnet20's gradients |" in text and "44.7 MB" not in text
    assert write_cells_lab(cells[-1:], tmp_path / "none") is None


def test_the_consoles_epoch_line_names_the_nvtx_range_the_profile_holds(capsys):
    """The console counts from 1, NVTX and the report from 0: each epoch line names its range."""
    from types import SimpleNamespace

    from handler.train.trainer import _report_epoch
    record = {"epoch": 0, "train_loss": 1.0, "train_acc": 0.5, "val_acc": None, "time_s": 2.0, "images_per_s": 10.0,
              "data_wait_s": 0.5}
    _report_epoch(SimpleNamespace(is_main=True, epochs=2), record)
    assert capsys.readouterr().out.startswith("epoch 1/2 [nvtx: epoch 0]  loss 1.0000")


def test_the_figure_plots_per_gpu_the_metric_series_the_json_lists_over_steady_steps(tmp_path):
    from handler.profiling.lab.figures import STEADY_STEPS, draw
    nvtx = [(7, "Epoch 0", 0, 80 * MS)] + [(7, f"Batch {i}", i * 10 * MS, i * 10 * MS + 6 * MS) for i in range(8)]
    nvtx += [(7, "forward", i * 10 * MS + 1 * MS, i * 10 * MS + 4 * MS) for i in range(8)]
    path = fake_export(tmp_path / "fig.sqlite", nvtx, kernels=[(7, "sgemm", 1 * MS, 70 * MS)])
    names = ("SMs Active [Throughput %]", "PCIe TX Throughput [Throughput %]", "PCIe RX Throughput [Throughput %]")
    with closing(sqlite3.connect(path)) as db:
        db.executescript("""CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT,
                                metricId INTEGER, metricName TEXT);
                            CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER, metricId INTEGER, value INTEGER);""")
        for gpu in (0, 1):
            for metric, name in enumerate(names[:3 - gpu]):  # GPU 1 samples no PCIe RX
                db.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GA102', ?, ?)", (256 + gpu, metric, name))
                db.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?)",
                               [(t * MS, 256 + gpu, metric, t % 7) for t in range(0, 80)])
        db.commit()
    trace = load_trace(path)
    figure = draw(trace, tmp_path / "fig.png", "test")
    assert (tmp_path / "fig.png").stat().st_size > 1000
    assert figure["window_ns"] == [20 * MS, 60 * MS]  # STEADY_STEPS steps from the middle of eight
    assert STEADY_STEPS == 4
    assert figure["panels"] == [{"gpu": 0, "series": ["sm_active_pct", "pcie_tx_pct", "pcie_rx_pct"]},
                                {"gpu": 1, "series": ["sm_active_pct", "pcie_tx_pct"]}]
    assert figure["bands"] == [{"rank": 0, "steps": 4, "phases": ["forward"]}]
    bare = draw(load_trace(fake_export(tmp_path / "bare.sqlite", nvtx)), tmp_path / "bare.png", "no metrics")
    assert bare["panels"] == [] and bare["bands"] == figure["bands"] and (tmp_path / "bare.png").is_file()


def test_peak_memory_follows_allocations_less_frees_and_ncclS_own_ranges_are_counted(tmp_path):
    nvtx = [(7, "Epoch 0", 0, 100 * MS), (7, "Batch 0", 0, 100 * MS),
            (7, "ncclAllReduce", 10 * MS, 11 * MS), (7, "ncclAllReduce", 20 * MS, 22 * MS),
            (7, "ncclBroadcast", 30 * MS, 31 * MS)]
    path = fake_export(tmp_path / "mem.sqlite", nvtx, kernels=[(7, "sgemm", 1 * MS, 50 * MS)])
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS (start INTEGER, globalPid INTEGER, deviceId INTEGER, "
                   "bytes INTEGER, memKind INTEGER, memoryOperationType INTEGER)")
        # device memory: +100, +50, -100, +80 MB (peak 150); pinned host memory (memKind 1) is not the GPU's
        db.executemany("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES (?, 117440512, 0, ?, ?, ?)",
                       [(1, 100_000_000, 2, 0), (2, 50_000_000, 2, 0), (3, 100_000_000, 2, 1), (4, 80_000_000, 2, 0),
                        (5, 900_000_000, 1, 0)])
        db.commit()
    summary = summarize(load_trace(path))
    assert summary["gpus"][0]["peak_memory_mb"] == pytest.approx(150.0)
    assert summary["ranks"][0]["nccl_ranges"] == {"ncclAllReduce": {"count": 2, "total_s": pytest.approx(0.003)},
                                                  "ncclBroadcast": {"count": 1, "total_s": pytest.approx(0.001)}}


def test_the_ranges_option_maps_a_users_names_from_the_command_line(tmp_path):
    export = fake_export(tmp_path / "user.sqlite", [(4, "round 1", 0, 100 * MS), (4, "it 0", 0, 60 * MS),
                                                     (4, "fwd", 10 * MS, 30 * MS)])
    result = run_report(export, "--ranges", "epoch=Round *", "step=It *", "forward=fwd")
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "user.summary.json").read_text())
    assert summary["convention"].startswith("user mapping") and summary["ranks"][0]["loop"]["steps"] == 1
    bad = run_report(export, "--ranges", "step=It")
    assert bad.returncode != 0 and "exactly one `*`" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
