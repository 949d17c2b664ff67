"""`python -m handler.compare --lab`: the course kit's matrix, its files laid out as the kit's run
scripts lay them out, summarised in one report. One real cell (ddp on 1 CPU process) runs
through scripts/launch.sh; the rest of the matrix is what the command line chose."""
import json
import time
from pathlib import Path

import pytest

from handler.compare.__main__ import main, parse_args
from tests.profiling.test_compare import TINY

SAVING = TINY[:TINY.index("--save")]  # the kit's runs keep their checkpoints


def test_the_lab_matrix_is_dp_ddp_and_ddp_dali_at_1_and_2_gpus_by_default():
    args = parse_args(["--lab"])
    assert args.lab and args.counts is None and args.modes is None  # filled in by main
    assert parse_args(["--lab", "--gpus", "1,2,4"]).counts == "1,2,4"


@pytest.mark.slow  # an end-to-end run of 13-17 s: CI's slow step (the main run's 10 minutes)
def test_a_lab_cell_writes_the_kits_layout_and_the_summary_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    stamp = time.strftime("%Y%m%d_%H%M")
    code = main(["--lab", "--modes", "ddp", "--gpus", "1", "--profile", "0", "--out", "out", "--", *SAVING])
    assert code == 0, (tmp_path / "out" / "cells" / "ddp-n1" / "stderr.log").read_text()[-2000:]
    [run] = list((tmp_path / "nsight_logs").iterdir())
    assert run.name.startswith(f"ddp_{stamp}")
    assert json.loads((run / "gpu_1.metrics.json").read_text())["epochs"]
    assert (tmp_path / "runs" / run.name / "gpu_1" / "last.pt").is_file()
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [cell["status"] for cell in results["cells"]] == ["ok"]


def test_the_lab_page_reads_each_cells_report_where_the_kits_layout_put_it(tmp_path):
    # handler.compare hands the lab page the path Layout.report gives; it must be the file that
    # launch.sh writes from the NSIGHT_LOG_DIR / NSIGHT_FILE_NAME that Layout.place sets.
    from handler.compare.cells import Cell, build_variants
    from handler.compare.runner import Layout
    from handler.modes import MODES
    [variant] = build_variants("ddp_dali", [], MODES)
    cell, layout = Cell(variant, 2), Layout("20251001_173345")
    assert layout.report(cell, tmp_path) == Path("nsight_logs/ddp_dali_20251001_173345/gpu_2.nsys-rep")
    assert Layout().report(cell, tmp_path) == tmp_path / f"{cell.slug}.nsys-rep"
