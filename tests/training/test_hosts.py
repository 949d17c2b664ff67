"""Where each rank ran: env.hosts and env.nodes in the metrics JSON, hosts in the profile report.

Runs across real hosts are in tests/tools/test_cluster.py; these cover one host and the report.
"""
import json
import socket

import pytest

from handler.profiling.whatif import GRAD_MB
from tests.conftest import read_metrics
from tests.profiling.test_profile_report import fake_export, one_epoch, run_report, summarize_export


def test_a_one_host_run_records_every_rank_on_this_host_and_one_node(two_epoch_run):
    _, folder = two_epoch_run("ddp")
    env = read_metrics(folder / "metrics.json")["env"]
    assert env["hosts"] == {"0": socket.gethostname(), "1": socket.gethostname()}
    assert env["nodes"] == 1


@pytest.mark.parametrize("mode", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])  # fsdp's two-epoch run: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_run_records_its_whole_models_gradient_mb_in_its_metrics(two_epoch_run, mode):
    """fsdp too: counted before wrapping, where its parameters are still whole, not shards."""
    from models import build_model
    _, folder = two_epoch_run(mode)
    m = read_metrics(folder / "metrics.json")
    model = build_model(m["config"]["model"], num_classes=10)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert m["model"] == {"trainable_params": params, "grad_mb": params * 4 / 1e6}
    assert GRAD_MB.get(m["config"]["model"], m["model"]["grad_mb"]) == pytest.approx(m["model"]["grad_mb"], abs=1e-3)


def two_ranks(host_marks: bool):
    marks = [(5, "rank 0", 0, None), (9, "rank 1", 0, None)]
    if host_marks:
        marks += [(5, "host node1", 0, None), (9, "host node2", 0, None)]
    return one_epoch(5) + one_epoch(9) + marks


def test_the_profile_report_names_each_ranks_host_in_its_tables(tmp_path):
    summary = summarize_export(fake_export(tmp_path / "hosts.sqlite", two_ranks(host_marks=True)))
    assert [(r["rank"], r["host"]) for r in summary["ranks"]] == [(0, "node1"), (1, "node2")]
    page = (tmp_path / "hosts.summary.md").read_text()
    assert "| epoch | rank 0 (node1) | rank 1 (node2) |" in page  # epoch times
    assert page.count("| 0 (node1) |") >= 2 and page.count("| 1 (node2) |") >= 2  # batches, outside training


def test_a_profile_without_host_marks_takes_the_hosts_from_the_metrics_json(tmp_path):
    export = fake_export(tmp_path / "old.sqlite", two_ranks(host_marks=False))
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"schema": 1, "env": {"hosts": {"0": "a1", "1": "b2"}}, "epochs": []}))
    result = run_report(export, "--metrics", metrics)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "old.summary.json").read_text())
    assert [r["host"] for r in summary["ranks"]] == ["a1", "b2"]
    assert [r["host"] for r in summarize_export(export)["ranks"]] == [None, None]  # nothing to know it from
