"""Range and phase names are declared once (handler/runtime/names.py): the training side opens
them and the profile report reads them from the same constants, so a rename cannot break the
report silently, and no other module of the product spells one."""
import ast
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from handler.runtime import names, nvtx
from tests.conftest import ROOT

PRODUCT = ("handler", "bench", "models")
NAMES_MODULE = "handler/runtime/names.py"
DECLARED = {k: v for k, v in vars(names).items() if k.isupper()}
PLAIN = tuple(sorted({v for v in DECLARED.values() if isinstance(v, str)}))
NUMBERED = tuple(sorted(v.template for v in DECLARED.values() if isinstance(v, names.Numbered)))
# Literals that read like a name but name no range or mark: the report's own words, and the
# command line's "data" section (docs/CLI.md). Each entry must still be found (the list cannot
# outlive what it excuses).
EXCUSED = {("handler/profiling/render.py", "f'epoch {epochs[0]}'"),  # "epoch 3" of the capture window
           ("handler/profiling/render.py", "f'rank {who(r)}'"),  # a column header, "rank 0 (host)"
           ("handler/profiling/render.py", 'f"rank {s[\'most_often_last\']}"'),  # a straggler table cell
           ("handler/train/config.py", "'data'"),  # DataOptions.TITLE, the options section's name
           ("handler/data/cifar_images.py", "'test'")}  # the course kit's PNG tree's folder


def product_files() -> list[Path]:
    files = [p for top in PRODUCT for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted(files + list((ROOT / "scripts").glob("*.py")) + [ROOT / "train_cifar.py"])


def _keys_and_paths(tree: ast.AST) -> set[int]:
    """ids of string constants that index a mapping (a dict key, a subscript, a get) or name a
    path segment (`folder / "data"`): other contracts (checkpoint and metrics keys, CIFAR's
    files) that share a word with a range name."""
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            skip.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            skip.add(id(node.slice))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            skip.add(id(node.right))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")).endswith("get"):
            skip.update(id(a) for a in node.args)
        elif isinstance(node, ast.JoinedStr):  # an f-string's pieces: the f-string is judged whole
            skip.update(id(v) for v in node.values)
    return skip


def spellings(path: Path) -> list[tuple[str, str]]:
    """(name or template, source) for each literal in the file that spells a range name: the
    name itself, a numbered name's text before its number ("batch "), a pattern for it, or an
    f-string that builds one (f"batch {i}")."""
    tree = ast.parse(path.read_text())
    skip, found = _keys_and_paths(tree), []
    prefixes = {t.split("{}")[0]: t for t in NUMBERED}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            if text in PLAIN or text in NUMBERED:
                found.append((text, repr(text)))
            for prefix, template in prefixes.items():
                rest = text[len(prefix):] if text.startswith(prefix) else None
                if rest is not None and (rest == "" or rest.isdigit() or rest[:1] in ("(", "\\")):
                    found.append((template, repr(text)))
        elif isinstance(node, ast.JoinedStr) and len(node.values) == 2:
            head, value = node.values
            if isinstance(head, ast.Constant) and head.value in prefixes and isinstance(value, ast.FormattedValue):
                found.append((prefixes[head.value], ast.unparse(node)))
    return found


def test_each_range_and_phase_name_is_spelled_in_exactly_one_module():
    where: dict[str, set[str]] = {name: set() for name in PLAIN + NUMBERED}
    excused = set()
    for path in product_files():
        module = str(path.relative_to(ROOT))
        for name, source in spellings(path):
            if (module, source) in EXCUSED:
                excused.add((module, source))
            else:
                where[name].add(module if module == NAMES_MODULE else f"{module}: {source}")
    assert {name for name, modules in where.items() if modules != {NAMES_MODULE}} == set(), \
        {name: sorted(modules) for name, modules in where.items() if modules != {NAMES_MODULE}}
    assert excused == EXCUSED, f"EXCUSED names text that is gone: {sorted(EXCUSED - excused)}"


def test_the_scan_finds_each_way_of_spelling_a_name(tmp_path):
    """Guards the test above against a scan that silently finds nothing."""
    source = tmp_path / "spelled.py"
    source.write_text('nvtx_range("forward")\nnvtx_range(f"batch {i}")\nre.compile(r"epoch (\\d+)")\n'
                      'name.startswith("allreduce b")\nckpt["optimizer"]\n{"test": 1}\nroot / "data"\n')
    assert sorted(name for name, _ in spellings(source)) == ["allreduce b{}", "batch {}", "epoch {}", "forward"]


def test_numbered_names_read_back_what_they_write():
    assert names.EPOCH(3) == "epoch 3" and names.EPOCH.match("epoch 3").group(1) == "3"
    assert names.ALLREDUCE(12) == "allreduce b12" and names.ALLREDUCE.match("allreduce b12").group(1) == "12"
    assert names.HOST.match(names.HOST("node-1.lan")).group(1) == "node-1.lan"
    assert names.BATCH.match("batch 3 ") is None and names.EPOCH.match("epochs 3") is None


class Recorder:
    """Stands in for torch.cuda.nvtx under nsys, which cannot run inside a test: records each
    push/pop range with the clock and thread it ran on, as an export's NVTX_EVENTS would."""

    def __init__(self):
        self.stack, self.ranges, self.marks = [], [], []

    def range_push(self, name):
        self.stack.append((name, time.perf_counter_ns()))

    def range_pop(self):
        name, start = self.stack.pop()
        self.ranges.append((name, start, time.perf_counter_ns(), threading.get_ident()))

    def mark(self, text):
        self.marks.append(text)


def test_the_report_reads_every_range_one_epoch_of_the_loop_opens(monkeypatch):
    """The training side's ranges, recorded from the real loop, go through the real analysis:
    it finds the epoch, every batch and every phase, and the copy nested in `data` counts
    as `h2d` only."""
    from handler.data.loaders import DeviceLoader
    from handler.profiling.analysis import summarize
    from handler.profiling.trace import Process, Range, Trace
    from handler.train.divergence import DivergenceGuard
    from bench.common import make_step
    from handler.train.loop import train_epoch
    recorder = Recorder()
    monkeypatch.setattr(nvtx, "ACTIVE", True)
    monkeypatch.setattr(nvtx, "_nvtx", recorder, raising=False)
    images, labels = torch.randn(12, 3, 32, 32), torch.randint(0, 10, (12,))
    loader = DeviceLoader(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(images, labels), batch_size=4),
                          torch.device("cpu"))
    loader.copies = True  # the copy to the device runs as on a GPU (to the CPU here), inside its h2d range
    step = make_step(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3072, 10)), len(loader))
    bar = type("Bar", (), {"update": lambda self, n: None})()
    stop = type("Stop", (), {"should_stop": lambda self: False})()
    result = train_epoch(step, loader, 0, torch.device("cpu"), bar, stop=stop, guard=DivergenceGuard(torch.device("cpu"), 1))

    ranges = tuple(Range(name, start, end, tid) for name, start, end, tid in recorder.ranges)
    summary = summarize(Trace((Process(pid=1, rank=0, ranges=ranges),), "nvtx mark", None))
    rank = summary["ranks"][0]
    assert [e["epoch"] for e in rank["epochs"]] == [0] and rank["batches"]["count"] == len(loader) == 3
    assert {name: p["count"] for name, p in rank["phases"].items()} == dict.fromkeys(names.PHASES, 3)
    assert all(p["total_s"] > 0 for p in rank["phases"].values())
    copies = sum(e - s for n, s, e, _ in recorder.ranges if n == names.H2D) / 1e9
    waits = sum(e - s for n, s, e, _ in recorder.ranges if n == names.DATA and any(
        b.start <= s < b.end for b in ranges if names.BATCH.match(b.name))) / 1e9
    assert rank["phases"][names.DATA]["total_s"] == pytest.approx(waits - copies, abs=1e-9)
    # The loop's own clock timed the same phases, the copy included in its data.
    assert set(result["phase_s"]) == set(names.LOOP_PHASES) and result["data_wait_s"] == result["phase_s"]["data"]


def test_the_copy_counts_as_h2d_only_whether_nested_in_data_or_beside_it():
    """Reports from before the loop's `data` phase held the loader's copy put the two side by
    side; both layouts give the same shares."""
    from handler.profiling.analysis import summarize
    from handler.profiling.trace import Process, Range, Trace

    def summary(layout):
        ranges = (Range(names.EPOCH(0), 0, 100), Range(names.BATCH(0), 0, 100), *layout,
                  Range(names.FORWARD, 40, 100))
        return summarize(Trace((Process(1, 0, ranges),), "nvtx mark", None))["ranks"][0]["phases"]

    nested = summary([Range(names.DATA, 0, 40), Range(names.H2D, 30, 40)])
    beside = summary([Range(names.DATA, 0, 30), Range(names.H2D, 30, 40)])
    assert {n: p["count"] for n, p in nested.items()} == {n: p["count"] for n, p in beside.items()}
    assert {n: p["total_s"] for n, p in nested.items()} == pytest.approx({n: p["total_s"] for n, p in beside.items()})
    assert nested[names.DATA]["share"] == pytest.approx(0.3) and nested[names.H2D]["share"] == pytest.approx(0.1)


def test_data_stall_leaves_out_the_copy_nested_in_data():
    from handler.profiling.columns import from_rows
    from handler.profiling.gpu_view import gpu_stats
    from handler.profiling.trace import Range
    epoch, batch = Range(names.EPOCH(0), 0, 100), Range(names.BATCH(0), 0, 100)
    phases = [Range(names.DATA, 0, 40), Range(names.H2D, 30, 40), Range(names.FORWARD, 40, 100)]
    activity = from_rows([(1, 0, 60, 100, "gemm", 0, 45)])  # (pid, device, start, end, name, tid, launched)
    stats = gpu_stats(activity, phases, names.PHASES, [epoch], 0, [batch])
    assert stats["data_stall_s"] == pytest.approx(30 / 1e9)  # idle 0-60; waiting for data 0-30


def test_a_phase_opens_its_range_and_times_the_same_block(monkeypatch):
    from handler.runtime.phases import PhaseTimer
    recorder = Recorder()
    monkeypatch.setattr(nvtx, "ACTIVE", True)
    monkeypatch.setattr(nvtx, "_nvtx", recorder, raising=False)
    phase = PhaseTimer(torch.device("cpu"))
    with phase(names.FORWARD):
        time.sleep(0.01)
    (name, start, end, _), = recorder.ranges
    assert name == names.FORWARD and phase.seconds()[names.FORWARD] == pytest.approx((end - start) / 1e9, abs=1e-3)
    monkeypatch.setattr(nvtx, "ACTIVE", False)  # no profiler: timed, no range
    with phase(names.DATA):
        pass
    assert len(recorder.ranges) == 1 and phase.waited() == phase.seconds()[names.DATA] > 0


@pytest.mark.parametrize("variable", ["NSYS_PROFILING_SESSION_ID", "NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH"])
def test_ranges_are_on_exactly_when_a_profiler_is_attached(variable):
    """One test for "a profiler is attached" decides both how ranks start and whether ranges open."""
    env = {k: v for k, v in os.environ.items() if k not in nvtx.PROFILER_ENV and k != "HARNESS_NVTX"}
    code = "from handler.runtime import nvtx; print(nvtx.ACTIVE, nvtx.profiler_attached())"
    plain = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    profiled = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, variable: "1"},
                              capture_output=True, text=True, check=True)
    assert plain.stdout.split() == ["False", "False"] and profiled.stdout.split() == ["True", "True"]


def test_nsys_captures_the_range_the_trainer_opens():
    """scripts/nsys_options.sh is bash and cannot import the name; it must spell the same one."""
    assert f"--nvtx-capture={names.CAPTURE}" in (ROOT / "scripts" / "nsys_options.sh").read_text()


def test_only_the_nvtx_module_calls_torch_s_nvtx():
    """Every range opens through handler/runtime/nvtx.py, so its one switch (a profiler attached,
    the capture window still open) holds for all of them; the bench that times a range sets it."""
    callers = {str(p.relative_to(ROOT)) for p in product_files() if "cuda import nvtx" in p.read_text()
               or "torch.cuda.nvtx" in p.read_text()}
    assert callers == {"handler/runtime/nvtx.py", "bench/nvtx_overhead.py"}
