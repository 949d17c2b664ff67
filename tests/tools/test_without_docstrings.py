"""Under `python -OO` every docstring is None. The command-line parsers that take their
description from it still build (they stopped with an AttributeError before reading an argument)."""
import importlib
import importlib.util

import pytest

from bench.common import parser
from tests.conftest import ROOT


def test_a_bench_parser_builds_without_its_docstring():
    args = parser(None).parse_args(["--quick"])
    assert args.quick and args.json is None


def gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name, entry", [("handler.profiling.report", "parse_args"),
                                         ("handler.compare.__main__", "parse_args"),
                                         ("bench.comm_worker", "main"), ("scripts/gpu_check.py", "main")])
def test_each_entry_point_prints_its_help_without_its_docstring(name, entry, monkeypatch, capsys):
    module = gpu_check_module() if name.endswith(".py") else importlib.import_module(name)
    monkeypatch.setattr(module, "__doc__", None)
    with pytest.raises(SystemExit) as stopped:
        getattr(module, entry)(["--help"])
    assert stopped.value.code == 0 and capsys.readouterr().out.startswith("usage:")
