"""A summary JSON given to the what-if is parsed into the Summary record on read (handler/profiling/record/):
NaN, infinity, a negative time or a string where a number belongs is one line naming the field's path and
the fix, exit 2; --grad-mb takes finite sizes only. Summaries the report writes pass. docs/summary.schema.json
is what the records generate, to the byte."""
import copy
import json
import subprocess
import sys

import pytest

from handler.profiling.analysis import summarize
from handler.profiling.record.parse import SUMMARY_FIX as FIX, parse_summary as check_summary, schema
from handler.profiling.trace import load_trace
from handler.runtime.errors import UserError
from tests.nsys_helpers import REPO

DATA = REPO / "tests" / "data" / "nsys"


@pytest.fixture(scope="module")
def written():
    """The summaries of a complete run and of one killed inside epoch 1, as the report builds them."""
    return [summarize(load_trace(DATA / name)) for name in ("ddp_dali_cpu_nsys2022.4.sqlite",
                                                            "killed_in_epoch1_nsys2022.4.sqlite")]


@pytest.mark.xdist_group("summary_check")
def test_the_summaries_the_report_writes_pass_the_check(written):
    for summary in written:
        assert check_summary(json.loads(json.dumps(summary)), "s.json").ranks


def set_at(summary: dict, path: tuple, value) -> dict:
    bad = copy.deepcopy(summary)
    holder = bad
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return bad


GPU = {"kernel_busy_share": 0.6, "compute_busy_share": 0.5, "epochs_s": 1.0, "nccl_kernel_s": 0.1}
CASES = [
    (("ranks", 0, "loop", "steps"), "ten", "ranks[0].loop.steps is 'ten', not a whole number >= 0"),
    (("ranks", 0, "loop", "epochs_s"), float("nan"), "ranks[0].loop.epochs_s is nan, not a finite number"),
    (("overall", "epoch_mean_s"), float("inf"), "overall.epoch_mean_s is inf, not a finite number"),
    (("ranks", 0, "loop", "between_steps_ms"), -120.0, "ranks[0].loop.between_steps_ms is -120.0, not a time >= 0"),
    (("ranks", 0, "epochs", 0, "time_s"), "7.6", "ranks[0].epochs[0].time_s is '7.6', not a time >= 0"),
    (("ranks", 0, "loop", "phase_ms", "data"), -1.0, "ranks[0].loop.phase_ms.data is -1.0, not a number >= 0"),
    (("ranks", 0, "pipeline"), {"microbatches": "four"}, "ranks[0].pipeline.microbatches is 'four', not a whole number"),
    (("ranks", 0, "pipeline"), {"microbatches": -1}, "ranks[0].pipeline.microbatches is -1, not a whole number"),
    (("machine",), {"cpu_cores": True}, "machine.cpu_cores is True, not a whole number"),
    (("gpus",), [{**GPU, "compute_busy_share": "busy"}], "gpus[0].compute_busy_share is 'busy'"),
    (("gpus",), [{k: v for k, v in GPU.items() if k != "epochs_s"}], "gpus[0].epochs_s is missing"),
    (("ranks", 0, "loop"), [], "ranks[0].loop is [], not an object"),
]


@pytest.mark.xdist_group("summary_check")
@pytest.mark.parametrize("path, value, says", CASES, ids=[c[2].split(" is")[0] + " " + c[2].split(" ")[-1] for c in CASES])
def test_a_bad_field_is_one_line_naming_it(written, path, value, says):
    with pytest.raises(UserError) as raised:
        check_summary(json.loads(json.dumps(set_at(written[0], path, value))), "s.json")
    assert str(raised.value).startswith(f"s.json: {says}") and str(raised.value).endswith(FIX)


def whatif(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handler.profiling.whatif", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.xdist_group("summary_check")
@pytest.mark.parametrize("path, value, says", [CASES[0], CASES[1], CASES[3]], ids=["string", "nan", "negative"])
def test_the_whatif_reads_a_bad_summary_as_one_line_and_exit_2(written, tmp_path, path, value, says):
    """Before: NaN printed `nan` epochs and exited 0, a negative wait was used as given, a string
    ended in a traceback."""
    (tmp_path / "s.json").write_text(json.dumps(set_at(written[0], path, value)))
    done = whatif(tmp_path / "s.json")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr and not done.stdout


@pytest.mark.xdist_group("summary_check")
@pytest.mark.parametrize("size", ["inf", "nan", "0"])
def test_grad_mb_takes_a_finite_size_only(written, tmp_path, size):
    (tmp_path / "s.json").write_text(json.dumps(written[0]))
    done = whatif(tmp_path / "s.json", "--grad-mb", size)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"--grad-mb {size} is not a size" in done.stderr and "--grad-mb 44.7" in done.stderr


def test_the_committed_schema_is_what_the_records_generate():
    """docs/summary.schema.json is made by `python -m handler.profiling.record --schema`; an edit of either
    alone fails here."""
    committed = (REPO / "docs" / "summary.schema.json").read_text()
    assert committed == json.dumps(schema(), indent=2) + "\n", (
        "docs/summary.schema.json differs from the records: run python -m handler.profiling.record --schema "
        "> docs/summary.schema.json")
    done = subprocess.run([sys.executable, "-m", "handler.profiling.record", "--schema"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == committed
