"""scripts/coverage_map.py: the GPU-only blocks it finds, and the docs' copy of their table."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import coverage_map  # noqa: E402

SOURCE = '''"""Docstring that mentions # gpu-only: not a mark."""
def step(x):
    if x.is_cuda:  # gpu-only: tests/machine/test_gpu.py::test_step
        x = x.half()
        x = x * 2
    return x


def cuda_only():  # gpu-only: gpu_check row `ddp`
    return 1
'''


def test_a_mark_spans_its_whole_statement_and_docstrings_are_not_marks(tmp_path, monkeypatch):
    monkeypatch.setattr(coverage_map, "ROOT", tmp_path)
    path = tmp_path / "mod.py"
    path.write_text(SOURCE)
    blocks = coverage_map.gpu_blocks([path])
    assert [(b.first, b.last, b.what, b.proof) for b in blocks] == [
        (3, 5, "step", "tests/machine/test_gpu.py::test_step"),
        (9, 10, "cuda_only", "gpu_check row `ddp`"),
    ]


def test_a_mark_that_is_not_on_a_statement_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(coverage_map, "ROOT", tmp_path)
    path = tmp_path / "mod.py"
    path.write_text("x = (1 +\n     2)  # gpu-only: nowhere\n")
    with pytest.raises(SystemExit, match="first line of a statement"):
        coverage_map.gpu_blocks([path])


def test_missing_lines_group_into_blocks_of_consecutive_statements():
    statements = [1, 2, 4, 5, 9, 10]
    assert coverage_map._runs([2, 4, 9], statements) == [(2, 4), (9, 9)]


def test_docs_gpu_check_carries_the_current_gpu_only_table():
    table = subprocess.run([sys.executable, str(ROOT / "scripts" / "coverage_map.py"), "--gpu-table"],
                           capture_output=True, text=True, check=True).stdout.strip()
    docs = (ROOT / "docs" / "GPU_CHECK.md").read_text()
    assert table in docs, "docs/GPU_CHECK.md's GPU-only table is stale: run `python scripts/coverage_map.py --write-gpu-table`"


def test_the_docs_table_is_rewritten_in_place_and_the_text_around_it_kept(tmp_path):
    docs = tmp_path / "GPU_CHECK.md"
    docs.write_text("# t\n\nbefore\n\n| file | lines | code | proved by |\n|---|---|---|---|\n| `a.py` | 1-2 | `f` | x |\n\nafter\n")
    coverage_map.write_gpu_table("| file | lines | code | proved by |\n|---|---|---|---|\n| `b.py` | 3-4 | `g` | y |", docs)
    assert docs.read_text() == "# t\n\nbefore\n\n| file | lines | code | proved by |\n|---|---|---|---|\n| `b.py` | 3-4 | `g` | y |\n\nafter\n"


PRODUCT = '''def f(x):
    if x:
        return 1
    return 2


def g():  # gpu-only: tests/machine/test_gpu.py::test_g
    return 3
'''


def test_the_map_counts_gpu_only_lines_apart_and_names_each_block_never_run(tmp_path, monkeypatch, capsys):
    import coverage  # requirements-test.txt
    monkeypatch.setattr(coverage_map, "ROOT", tmp_path)
    (tmp_path / ".coveragerc").write_text((ROOT / ".coveragerc").read_text())
    (tmp_path / "handler").mkdir()
    source = tmp_path / "handler" / "mod.py"
    source.write_text(PRODUCT)
    data_file = tmp_path / "cov"
    assert coverage_map.main(["--data", str(data_file)]) == 2
    assert "no coverage data" in capsys.readouterr().err
    (tmp_path / "main").mkdir()  # scripts/coverage.sh's record of the step measured
    (tmp_path / "main" / "step.txt").write_text("main 2026-11-25T04:29Z 900 s, exit 0\n")
    data = coverage.CoverageData(basename=str(data_file))  # as if f(1) ran: lines 1-3 and g's def
    data.add_lines({str(source): [1, 2, 3, 7]})
    data.write()
    assert coverage_map.main(["--data", str(data_file)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "CI steps measured: main 2026-11-25T04:29Z 900 s, exit 0",
        "line coverage (all lines | outside GPU-only blocks):",
        "  handler           66.7 % of     6 |  75.0 % of     4",
        "  all               66.7 % of     6 |  75.0 % of     4",
        "GPU-only blocks (docs/GPU_CHECK.md): 1, 2 lines",
        "blocks never executed outside them: 1",
        "  handler/mod.py:4-4  (f)"]


def test_the_map_names_the_ci_steps_its_data_holds(tmp_path):
    for step, line in (("main", "main 2026-11-25T04:29Z 900 s, exit 0"), ("rehearsal", "rehearsal 2026-11-25T04:45Z 300 s, exit 1")):
        (tmp_path / step).mkdir()
        (tmp_path / step / "step.txt").write_text(line + "\n")
    assert coverage_map.steps_measured(tmp_path) == "main 2026-11-25T04:29Z 900 s, exit 0; rehearsal 2026-11-25T04:45Z 300 s, exit 1"
    assert coverage_map.steps_measured(tmp_path / "main").startswith("unknown")


@pytest.mark.slow  # 8-24 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_map_drawn_inside_a_measured_process_keeps_that_process_s_own_data(tmp_path):
    """coverage.py turns off the saving of a process it started itself (as scripts/coverage.sh
    starts the suite's xdist workers) once any Coverage object is made there: the map's own
    test lost a whole worker's lines. Here a process started by coverage.py draws a map."""
    import coverage  # requirements-test.txt
    data = coverage.CoverageData(basename=str(tmp_path / "empty"))
    data.add_lines({str(ROOT / "train_cifar.py"): [1]})
    data.write()
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import coverage_map; "
            f"coverage_map.coverage_map(__import__('pathlib').Path({str(tmp_path / 'empty')!r}))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE_")}
    env.update(COVERAGE_PROCESS_START=str(ROOT / ".coveragerc"), COVERAGE_FILE=str(tmp_path / "own" / "cov"))
    (tmp_path / "own").mkdir()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, capture_output=True)
    assert [p.name for p in (tmp_path / "own").iterdir() if p.name.startswith("cov.")], \
        "the process's own coverage data was not saved"


def test_coverage_sh_refuses_an_unknown_step_in_one_line_before_running_anything():
    done = subprocess.run(["bash", str(ROOT / "scripts" / "coverage.sh"), "--steps", "main,nope"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["coverage: unknown step 'nope'; choose from main, rehearsal, slow, cluster"]
