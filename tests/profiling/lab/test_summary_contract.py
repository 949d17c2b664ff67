"""The summary's contract (docs/summary.schema.json): the report writes summaries that keep it for
every mode and a CPU run, with the run's own facts (`run`, machine.rank_cores) from the metrics,
the report, then the file name, saying which; a field a reader would misuse is one line naming its
path and the fix, exit 2; every field at the schema's edges gives a finite prediction or one line."""
import copy
import json
import math
import shutil
import subprocess
import sys

import pytest

from handler.profiling import report
from handler.profiling.record.parse import SUMMARY_FIX as FIX, parse_summary, schema
from handler.profiling.whatif import GRAD_MB, markdown, predictions
from handler.runtime.errors import UserError
from tests.nsys_helpers import REAL_EXPORTS, REPO, with_training_ranges
from tests.profiling.test_profile_pp_gpu import with_pp_ranges

DATA = REPO / "tests" / "data" / "nsys"
CPU_RUN = DATA / "ddp_dali_cpu_nsys2022.4.sqlite"  # one CPU process, one complete epoch


def written(tmp_path, export, name: str, metrics: dict | None = None) -> dict:
    """The .summary.json python -m handler.profiling.report writes for `export` copied in as `name`."""
    copied = shutil.copyfile(export, tmp_path / name)
    args = [str(copied), "--out", str(tmp_path / "out"), "--brief"]
    if metrics is not None:
        (tmp_path / "m.json").write_text(json.dumps(metrics))
        args += ["--metrics", str(tmp_path / "m.json")]
    report.main(args)
    return json.loads((tmp_path / "out" / f"{copied.stem}.summary.json").read_text())


@pytest.mark.parametrize("mode", ["dp", "ddp", "ddp_dali", "fsdp"])
def test_a_mode_only_the_file_name_says_is_read_from_it_and_the_summary_says_so(tmp_path, mode):
    summary = written(tmp_path, CPU_RUN, f"{mode}_gpu1.sqlite")
    assert parse_summary(summary, "s").ranks
    run = summary["run"]
    assert run["mode"] == mode and run["mode_from"].startswith(f"file name {mode}_gpu1.sqlite")
    assert (run["nodes"], run["gpus_per_node"], run["processes"]) == (1, 0, 1)  # a CPU run: no GPU
    assert run["grad_mb"] is None and run["grad_mb_from"].startswith("not recorded")
    assert summary["machine"]["rank_cores"] is None and summary["machine"]["rank_cores_from"].startswith("not recorded")
    page = (tmp_path / "out" / f"{mode}_gpu1.summary.md").read_text()
    assert f"Run: mode {mode} (file name {mode}_gpu1.sqlite" in page


def test_the_metrics_json_comes_before_the_name_for_mode_model_gradients_nodes_and_the_ranks_cores(tmp_path):
    metrics = {"config": {"mode": "fsdp", "model": "resnet20", "workers": 2}, "model": {"grad_mb": 1.2345},
               "env": {"cpu_cores": 3, "nodes": 1, "torch_threads": 1}, "epochs": []}
    summary = written(tmp_path, CPU_RUN, "ddp_gpu1.sqlite", metrics)
    parse_summary(summary, "s")
    run, machine = summary["run"], summary["machine"]
    assert (run["mode"], run["mode_from"]) == ("fsdp", "metrics config.mode")
    assert (run["model"], run["grad_mb"]) == ("resnet20", 1.2345) and run["grad_mb_from"].startswith("metrics model.grad_mb")
    assert machine["rank_cores"] == 3 and machine["rank_cores_from"] == "metrics env.cpu_cores: the ranks' CPU affinity"
    del metrics["model"]  # a run from before the metrics recorded its gradients: the table by model name
    again = written(tmp_path, CPU_RUN, "ddp_gpu1.sqlite", metrics)["run"]
    assert again["grad_mb"] == GRAD_MB["resnet20"] and again["grad_mb_from"].startswith("whatif.GRAD_MB of resnet20")


def test_a_two_process_cpu_run_is_valid_with_no_gpu_per_node(tmp_path):
    summary = written(tmp_path, DATA / "ddp_workers2_cpu2_nsys2022.4.sqlite", "run.sqlite")
    parse_summary(summary, "s")
    assert summary["run"]["processes"] == 2 and summary["run"]["gpus_per_node"] == 0
    assert summary["run"]["mode"] is None and summary["run"]["mode_from"].startswith("not recorded")


def test_pp_is_read_from_its_ranges_with_its_stages_and_micro_batches(tmp_path):
    with_pp_ranges(REAL_EXPORTS["2026.2"], tmp_path / "pp.sqlite")
    summary = written(tmp_path, tmp_path / "pp.sqlite", "run.sqlite")
    parse_summary(summary, "s")
    run = summary["run"]
    assert (run["mode"], run["pp_stages"], run["pp_microbatches"], run["gpus_per_node"]) == ("pp", 2, 2, 2)
    assert run["mode_from"].startswith("report: pp's") and run["pp_from"].startswith("report:")


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory) -> dict:
    """The summary the report writes of the real 2-GPU export with our ranges (one process per GPU)."""
    folder = tmp_path_factory.mktemp("two")
    with_training_ranges(REAL_EXPORTS["2026.2"], folder / "src.sqlite", batches=6)
    summary = written(folder, folder / "src.sqlite", "ddp_gpu2.sqlite")
    parse_summary(summary, "s")
    return summary


def whatif(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "handler.profiling.whatif", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def without(summary: dict, *keys) -> dict:
    bad = copy.deepcopy(summary)
    for gpu in bad["gpus"]:
        for key in keys:
            del gpu[key]
    return bad


def with_value(summary: dict, path: tuple, value) -> dict:
    bad = copy.deepcopy(summary)
    holder = bad
    for key in path[:-1]:
        holder = holder[key]
    if value is DELETE:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return bad


class Deleted:
    def __repr__(self) -> str:
        return "deleted"


DELETE = Deleted()
# Each: what a reader misused before (a traceback, "-4 CPU cores", "link unbounded", a CPU prediction
# of a 2-GPU run, "a run stopped inside its first epoch"), now one line naming the field.
BAD = [
    (("machine", "cpu_cores"), "16", "machine.cpu_cores is '16', not a whole number from 1 to 1e6"),
    (("machine", "cpu_cores"), -4, "machine.cpu_cores is -4, not a whole number from 1 to 1e6"),
    (("machine", "loader_workers"), -2, "machine.loader_workers is -2, not a number of workers from 0"),
    (("gpus", 0, "nccl_kernel_s"), -0.5, "gpus[0].nccl_kernel_s is -0.5, not a time >= 0"),
    (("gpus", 0, "nccl_kernel_s"), "x", "gpus[0].nccl_kernel_s is 'x', not a time >= 0"),
    (("ranks", 0, "loop", "epochs"), DELETE, "ranks[0].loop.epochs is missing; it must be a whole number >= 0"),
]


@pytest.mark.parametrize("path, value, says", BAD, ids=[c[2].split(" is")[0] + f" {c[1]!r}"[:12] for c in BAD])
def test_a_field_the_whatif_would_misuse_is_one_line_naming_it_and_exit_2(two_gpus, tmp_path, path, value, says):
    (tmp_path / "s.json").write_text(json.dumps(with_value(two_gpus, path, value)))
    done = whatif(tmp_path / "s.json")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert says in done.stderr and done.stderr.strip().endswith(FIX) and not done.stdout


def test_a_two_gpu_summary_whose_gpus_lack_their_busy_shares_is_one_line_not_a_cpu_prediction(two_gpus, tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(without(two_gpus, "kernel_busy_share", "compute_busy_share")))
    done = whatif(tmp_path / "s.json")
    assert done.returncode == 2 and "gpus[0].kernel_busy_share is missing" in done.stderr, done.stderr
    assert "CPU process" not in done.stdout + done.stderr


# Every field a prediction reads at the edges the schema allows: its least, its most, and absent
# where optional. Each must give finite epochs or one UserError line, never a traceback or inf.
EDGES = [
    *[(("machine", k), v) for k in ("cpu_cores", "rank_cores", "threads_per_rank") for v in (1, 10**6, None)],
    *[(("machine", "loader_workers"), v) for v in (0, 4096, None)],
    *[(("machine", k), v) for k in ("loader_cpu_ms", "rank_cpu_ms") for v in (0, 1e10, None)],
    (("machine",), DELETE), (("comm_config",), DELETE), (("model",), DELETE), (("run",), DELETE),
    (("model",), "no-such-model"), (("gpus",), None),
    *[(("gpus", 0, k), v) for k in ("kernel_busy_share", "compute_busy_share") for v in (0, 1, None)],
    *[(("gpus", 0, k), v) for k in ("epochs_s", "nccl_kernel_s") for v in (0, 1e7)],
    *[(("ranks", 0, "loop", k), v) for k in ("epochs_s",) for v in (0, 1e7)],
    *[(("ranks", 0, "loop", k), v) for k in ("steps", "epochs") for v in (0, 1, 10**12)],
    *[(("ranks", 0, "loop", k), v) for k in ("inside_steps_ms", "between_steps_ms", "step_mean_ms")
      for v in (0, 1e10, None)],
    *[(("ranks", 0, "loop", "phase_ms", p), v) for p in ("data", "forward", "backward") for v in (0, 1e10, None)],
    *[(("ranks", 0, "comm", k), v) for k in ("seconds", "exposed_s") for v in (0, 1e7, None)],
    *[(("ranks", 0, "comm", "buckets"), v) for v in (0, 10**12, None)], (("ranks", 0, "comm"), None),
]


def test_every_field_at_the_schemas_edges_gives_finite_epochs_or_one_line(two_gpus):
    outcomes = {"finite": 0, "one line": 0}
    for path, value in EDGES:
        summary = with_value(two_gpus, path, value)
        try:
            found = predictions(parse_summary(json.loads(json.dumps(summary)), "s"), (1, 2, 8))
            text = "\n".join(markdown(found, "s"))
        except UserError as err:
            assert "\n" not in str(err), (path, value)
            outcomes["one line"] += 1
            continue
        numbers = [c[k] for cells in (found["cells"], found["through_host"] or []) for c in cells
                   for k in ("epoch_s", "keeps_up_epoch_s", "step_ms")]
        assert all(math.isfinite(n) and n >= 0 for n in numbers), (path, value, numbers)
        assert " inf" not in text and " nan" not in text, (path, value)
        outcomes["finite"] += 1
    assert sum(outcomes.values()) == len(EDGES) > 60, outcomes


def test_the_schema_is_named_in_the_profiling_docs_and_describes_every_field():
    made = schema()
    docs = (REPO / "docs" / "PROFILING.md").read_text()
    assert "docs/summary.schema.json" in docs and "python -m handler.profiling.record --schema" in docs

    def described(node) -> bool:
        ref = node.get("$ref") or next((o["$ref"] for o in node.get("anyOf", ()) if "$ref" in o), None)
        return bool(node.get("description") or ref and made["$defs"][ref.rsplit("/", 1)[-1]].get("description"))

    def undescribed(node, at) -> list:
        if not isinstance(node, dict):
            return []
        missing = [at] if ("properties" in node or "type" in node or "$ref" in node or "anyOf" in node) \
            and not described(node) and not at.endswith("[]") else []
        for key, sub in (node.get("properties") or {}).items():
            missing += undescribed(sub, f"{at}.{key}")
        for key in ("items", "additionalProperties"):
            missing += undescribed(node.get(key), f"{at}[]")
        return missing
    assert not undescribed(made, "summary") + [d for name, d in made["$defs"].items()
                                                for d in undescribed(d, f"$defs.{name}")]


@pytest.mark.parametrize("report, mode", [("nsight_logs/ddp_dali_20251001_173345/gpu_2.nsys-rep", "ddp_dali"),
                                          ("out/cells/fsdp-n2/fsdp-n2.nsys-rep", "fsdp"),
                                          ("nsight_logs/ddp_gpu2.nsys-rep", "ddp"), ("a/b/run7.sqlite", None)])
def test_the_mode_is_read_from_ours_the_kits_and_compares_names_last(report, mode):
    from handler.profiling.scaling.run_facts import run_block
    two = {"ranks": [{"host": None}, {"host": None}], "gpus": [{"device": 0}, {"device": 1}]}
    assert run_block(two, None, report)["mode"] == mode
    assert run_block(two, {"config": {"mode": "pp"}}, report)["mode_from"] == "metrics config.mode"
    one = {"ranks": [{"host": None}], "gpus": [{"device": 0}, {"device": 1}]}  # one process drove both: dp
    assert run_block(one, None, report)["mode_from"] == "report: 1 process drove 2 GPUs"
