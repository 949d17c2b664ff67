"""The lab page tells the truth (issue 40): a bound of one epoch that never exceeds the measured
epoch, one cell per report, CPU processes called so, no bare table headers, the loop's setup apart
from the libraries', GPU-bound judged by the GPU's busy share, and the kit's layout read from .sqlite."""
import json

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.lab.cells import lab_reports
from handler.profiling.lab.page import verdict, write_lab
from handler.profiling.render import markdown
from handler.profiling.whatif import predictions
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS
from tests.profiling.lab.kit_exports import with_kit_ranges
from tests.profiling.scale_inputs import DALI_CPU, GOLDEN, build
from tests.profiling.test_profile_report import fake_export

MS = 1_000_000


def test_the_bound_counts_the_steps_of_one_epoch_when_two_were_profiled():
    """The TAs' DDP 1-GPU step (333 ms, 34 ms inside the step range, the GPU busy 97 ms), profiled
    for 2 epochs of 98 steps: the bound is 98 x 97 ms, not 196 x 97 ms."""
    steps, epochs = 196, 2
    summary = {"ranks": [{"loop": {"epochs_s": steps * 0.333, "epochs": epochs, "steps": steps, "step_mean_ms": 333.0,
                                   "inside_steps_ms": 34.0, "between_steps_ms": 299.0, "phase_ms": {}}}],
               "overall": {"epoch_mean_s": None},
               "gpus": [{"kernel_busy_s": 0.097 * steps, "kernel_busy_share": 97.0 / 333.0, "compute_busy_share": None,
                         "epochs_s": 0.0, "nccl_kernel_s": 0.0}]}
    result = verdict(summary)
    assert result["bound_s"] == pytest.approx(98 * 0.097)
    assert "at least 9.51 s (98 steps x 97.0 ms)" in result["line"]


def _every_export(folder):
    """Every summary the golden file holds (rebuilt from the exports it was made from: the file
    predates the loop numbers), and every real export of tests/data named as the kit names ranges."""
    exports = build(folder)
    assert sorted(exports) == sorted(json.loads(GOLDEN.read_text()))
    for version, source in REAL_EXPORTS.items():
        exports[f"kit_{version}"] = folder / f"kit_{version}.sqlite"
        with_kit_ranges(source, exports[f"kit_{version}"])
    return exports


def test_the_bound_never_exceeds_the_measured_epoch_on_every_summary_and_real_export(tmp_path):
    for name, path in _every_export(tmp_path).items():
        summary = summarize(load_trace(path))
        slowest = max(summary["ranks"], key=lambda r: r["loop"]["epochs_s"])
        measured = slowest["loop"]["epochs_s"] / len(slowest["epochs"])
        bound = verdict(summary)["bound_s"]
        assert bound is not None and 0 < bound <= measured * (1 + 1e-12), (name, bound, measured)


def _loader_bound_exports(folder, monkeypatch):
    """A real 2-GPU export shaped as a loader-bound run (70 % of each step waiting for data), in our
    convention (the wait is the `data` phase inside each step) and in the kit's (between the steps)."""
    from tests.profiling.lab import loader_bound
    source = REAL_EXPORTS["2026.2"]
    return {"loader_bound_ours": loader_bound.ours(source, folder / "lb_ours.sqlite", monkeypatch),
            "loader_bound_kit": loader_bound.kit(source, folder / "lb_kit.sqlite", monkeypatch)}


def test_the_verdict_and_the_what_if_agree_on_every_summary_and_real_export(tmp_path, monkeypatch):
    """At the report's own count the what-if's epoch is the measured one, its "loader keeps up"
    epoch is the verdict's bound (never above the measured), and both name the same bound."""
    exports = {**_every_export(tmp_path), **_loader_bound_exports(tmp_path, monkeypatch)}
    for name, path in exports.items():
        summary = summarize(load_trace(path))
        slowest = max(summary["ranks"], key=lambda r: r["loop"]["epochs_s"])
        measured = slowest["loop"]["epochs_s"] / slowest["loop"]["epochs"]
        found = predictions(summary, ())
        own, = found["cells"]
        said = verdict(summary)
        assert own["epoch_s"] == pytest.approx(measured, rel=1e-9), name
        assert said["bound_s"] == pytest.approx(own["keeps_up_epoch_s"], rel=1e-9), name
        assert 0 < said["bound_s"] <= measured * (1 + 1e-12), name
        assert said["bound"] == own["bound"] and said["line"].startswith(own["bound"] + ":"), (name, said, own)


@pytest.mark.parametrize("convention", ["ours", "kit"])
def test_a_loader_bound_run_of_either_convention_is_loader_bound_on_the_page_with_the_what_ifs_bound(
        tmp_path, monkeypatch, convention):
    """Our loop fetches its batch inside the step range (`data`), the kit's between the steps: the
    verdict counts both as the wait, so the page says loader-bound and its bound is the what-if's."""
    path = _loader_bound_exports(tmp_path, monkeypatch)[f"loader_bound_{convention}"]
    summary = summarize(load_trace(path))
    said = verdict(summary)
    assert said["line"].startswith("loader-bound: 7"), said["line"]  # 70 % and more of each step waits
    page = write_lab([{"report": path, "mode": "ddp", "gpus": 2}], tmp_path / "lab")
    row, = json.loads((tmp_path / "lab" / "lab.json").read_text())["reports"]
    assert row["verdict"]["line"] in page
    two = next(line for line in page.splitlines() if line.startswith("| 2 GPUs |"))
    assert two.endswith("| loader-bound |") and f"| {said['bound_s']:.2f} |" in two
    assert "| CPU cores | 18 | nsys TARGET_INFO_SYSTEM_ENV CpuCores |" in page  # read from the export, not assumed


def test_a_gpu_busy_almost_every_step_is_gpu_bound_and_one_that_idles_is_host_bound(tmp_path):
    """Real exports with our ranges (steps fill the epoch, as a loop that waits for its GPU by
    loss.item() has them): the 2-GPU PyTorch run's GPUs are busy 79 % and 84 % of the epoch; the
    saxpy's GPU 5.5 %. The step range covers both alike, so only the busy share tells them apart."""
    exports = build(tmp_path)
    busy = summarize(load_trace(exports["real_2026.2"]))
    assert max(g["kernel_busy_share"] for g in busy["gpus"]) == pytest.approx(0.840, abs=1e-3)
    assert verdict(busy)["line"].startswith("GPU-bound: the busiest GPU works")
    idle = summarize(load_trace(exports["real_2022.2"]))
    assert verdict(idle)["line"].startswith("host-bound: the busiest GPU idles 94 % of the host's work inside the step")


def _kit_folder(root, mode, stamp, count, report=DALI_CPU, metrics=None):
    folder = root / f"{mode}_20251001_17334{stamp}"
    folder.mkdir(parents=True)
    (folder / f"gpu_{count}.sqlite").write_bytes(report.read_bytes())
    if metrics:
        (folder / f"gpu_{count}.metrics.json").write_text(json.dumps({"config": metrics}))
    return folder / f"gpu_{count}.sqlite"


def test_the_kits_dp_run_on_two_cpu_processes_keeps_its_own_cell_and_says_one_process_ran(tmp_path):
    """On a CPU box the kit's dp run with NUM_GPUS=2 trains as one CPU process and its metrics say
    num_gpu 1; the layout's gpu_2 is still its cell, apart from the real gpu_1 report."""
    logs = tmp_path / "nsight_logs"
    _kit_folder(logs, "dp", 1, 1, metrics={"mode": "dp", "num_gpu": 1})
    _kit_folder(logs, "dp", 2, 2, metrics={"mode": "dp", "num_gpu": 1})
    page = write_lab(lab_reports([logs]), tmp_path / "lab")
    rows = json.loads((tmp_path / "lab" / "lab.json").read_text())["reports"]
    assert [(r["mode"], r["gpus"]) for r in rows] == [("dp", 1), ("dp", 2)]
    assert [r["ran"] for r in rows] == ["1 CPU process", "1 CPU process"]
    assert len({r["name"] for r in rows}) == 2 and all((tmp_path / "lab" / f"{r['name']}.png").is_file() for r in rows)
    assert "| mode | 1 CPU process | 2 CPU processes |" in page
    assert "- **dp, 2 CPU processes (ran 1 CPU process)**: " in page and "- **dp, 1 CPU process**: " in page


def test_two_reports_naming_one_cell_keep_two_cells_figures_and_names(tmp_path):
    reports = [_kit_folder(tmp_path / f"logs{k}", "ddp", k, 1) for k in (1, 2)]
    write_lab([{"report": r, "mode": "ddp", "gpus": 1} for r in reports], tmp_path / "lab")
    rows = json.loads((tmp_path / "lab" / "lab.json").read_text())["reports"]
    assert len({(r["mode"], r["gpus"]) for r in rows}) == 2 and len({r["name"] for r in rows}) == 2
    assert len({r["figure"]["file"] for r in rows}) == 2
    assert all((tmp_path / "lab" / f"{r['name']}.png").is_file() for r in rows)


def test_a_two_process_cpu_run_is_called_two_cpu_processes_and_its_gpu_tables_say_why_they_are_empty(tmp_path):
    nvtx = []
    for pid in (11, 12):
        nvtx += [(pid, "epoch 0", 0, 40 * MS)] + [(pid, f"batch {i}", i * 10 * MS, i * 10 * MS + 8 * MS) for i in range(4)]
    report = fake_export(tmp_path / "ddp_2gpu.sqlite", nvtx)
    page = write_lab(lab_reports([report]), tmp_path / "lab")
    row, = json.loads((tmp_path / "lab" / "lab.json").read_text())["reports"]
    assert "| mode | 2 CPU processes |" in page and "- **ddp, 2 CPU processes**: CPU-bound: no GPU ran" in page
    assert (row["cell"], row["ran"], row["name"]) == ("2 CPU processes", "2 CPU processes", "ddp_2cpu")
    assert row["figure"]["title"].startswith("ddp, 2 CPU processes")
    assert "GPU |" not in page  # no table names a GPU, and no table is a bare header
    for section in ("## Per GPU", "## Copies"):
        after = page.split(section, 1)[1].split("##", 1)[0]
        assert "No CUDA activity in these reports (CPU runs): no GPU to show." in after and "|" not in after


def test_the_setup_table_holds_the_loops_ranges_and_a_table_groups_the_libraries_by_domain_or_prefix(tmp_path):
    dali = summarize(load_trace(DALI_CPU))["ranks"][0]
    assert dali["setup"] == []  # our loop opens no range before its first epoch; DALI opens 337
    assert [(s["library"], s["by"], s["count"]) for s in dali["setup_libraries"]] == [("DALI", "domain", 337)]
    nvtx = [(7, "Set data loader", 0, 2 * MS), (7, "ncclCommInitRank", 2 * MS, 3 * MS),
            (7, "[DALI][Executor] Build", 5 * MS, 6 * MS), (7, "~TensorList<CPU>", 6 * MS, 7 * MS),
            (7, "Set Data Parallelism", 3 * MS, 4 * MS), (7, "Sync model parameters", 4 * MS, 5 * MS),
            (7, "Epoch 0", 10 * MS, 20 * MS), (7, "Batch 0", 10 * MS, 18 * MS)]
    summary = summarize(load_trace(fake_export(tmp_path / "kit.sqlite", nvtx)))
    rank, = summary["ranks"]
    assert [s["name"] for s in rank["setup"]] == ["Set data loader", "Set Data Parallelism", "Sync model parameters"]
    assert [(s["library"], s["by"], s["count"]) for s in rank["setup_libraries"]] == [("NCCL", "prefix", 1),
                                                                                       ("DALI", "prefix", 2)]
    text = markdown(summary, "kit")
    setup = text.split("## Setup (", 1)[1].split("##", 1)[0]
    assert "Sync model parameters" in setup and "DALI" not in setup and "nccl" not in setup
    assert "| 0 | DALI | name prefix | 2 | 0.002 |" in text


@pytest.mark.parametrize("suffix", [".sqlite", ".nsys-rep"])
def test_the_kits_layout_names_the_mode_of_a_report_named_by_its_path(tmp_path, suffix):
    """A student who exports in the GUI passes ddp_<time>/gpu_2.sqlite (or the folder itself)."""
    folder = tmp_path / "ddp_20251001_173345"
    folder.mkdir()
    (folder / f"gpu_2{suffix}").write_bytes(b"")
    for path in (folder / f"gpu_2{suffix}", folder):
        assert [(e["mode"], e["gpus"]) for e in lab_reports([path])] == [("ddp", 2)]
