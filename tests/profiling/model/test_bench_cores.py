"""bench.cores_matrix's table (docs/RESULTS.md) from a constructed matrix, no training: the cells'
errors, the median and the worst against the goal, and the folder read with --from."""
import json
import subprocess
import sys

import pytest

from bench.cores_matrix import main, markdown
from handler.profiling.scaling.cores import cpu_time_of
from tests.nsys_helpers import REPO

BOX = {"cpu": "AMD EPYC", "cores": 2, "isa": "AVX2", "date": "2026-11-29T08:00:00+00:00", "load_before": 0.2,
       "load_after": 0.4}


def cell(name, measured, predicted=None, status="ok"):
    mode, count = name.split(" x")
    error = None if predicted is None else (predicted - measured) / measured
    return {"name": name, "mode": mode, "count": int(count), "status": status, "measured_epoch_s": measured,
            "predicted_epoch_s": predicted, "prediction_error": error,
            "predicted_from": f"{mode} x1" if predicted else ""}


CELLS = [cell("dp x1", 10.0), cell("dp x2", None, status="skipped"), cell("ddp x1", 8.0), cell("ddp x2", 6.0, 6.6),
         cell("ddp_dali x1", 7.0), cell("ddp_dali x2", 7.0, 6.3)]


def test_the_table_names_the_box_each_cells_ratio_and_the_median_and_worst_error():
    times = {"ddp x2": {"loader_cpu_ms": 25.0, "rank_cpu_ms": 550.0}, "ddp x1": cpu_time_of(None)}
    text, found = markdown(CELLS, times, BOX)
    assert "AMD EPYC, 2 cores, AVX2" in text and "2026-11-29" in text and "0.2 before" in text
    assert "| ddp x2 | 6.00 | 6.60 | 1.10 | +10.0 % | 25 | 550 | ddp x1 |" in text
    assert "| ddp_dali x2 | 7.00 | 6.30 | 0.90 | -10.0 % |" in text
    assert "| ddp x1 | 8.00 | its own | | | not recorded | not recorded | |" in text
    assert "| dp x2 | skipped |" in text
    assert found["median_abs_error"] == pytest.approx(0.1) and found["worst_abs_error"] == pytest.approx(0.1)
    assert found["met"]
    _, worse = markdown([*CELLS[:3], cell("ddp x2", 6.0, 7.5), *CELLS[4:]], times, BOX)
    assert worse["worst_abs_error"] == pytest.approx(0.25) and not worse["met"]  # one cell past 20 % misses the goal
    assert markdown(CELLS[:1], {}, BOX)[1]["met"] is False


def test_the_bench_reads_an_earlier_matrix_folder_and_says_so_in_one_line_when_there_is_none(tmp_path, capsys):
    (tmp_path / "compare").mkdir()
    (tmp_path / "compare" / "results.json").write_text(json.dumps({"cells": CELLS}))
    main(["--from", str(tmp_path)])
    assert "Median absolute error 10.0 %, worst 10.0 %, over 2 predicted cells" in capsys.readouterr().out
    missing = subprocess.run([sys.executable, "-m", "bench.cores_matrix", "--from", str(tmp_path / "none")], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "no compare/results.json there" in missing.stderr
