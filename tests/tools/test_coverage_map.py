"""scripts/coverage_map.py: the GPU-only blocks it finds, and the docs' copy of their table."""
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
    assert table in docs, "docs/GPU_CHECK.md's GPU-only table is stale: paste `python scripts/coverage_map.py --gpu-table`"
