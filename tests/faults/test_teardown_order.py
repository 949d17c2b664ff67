"""A failing rank says its one line before its process group is taken down, and asks for an
abort, not a drain (handler/DDP/run.py `worker`). On NCCL, draining waits for a collective
that a dead peer never joins, so a line printed after it was lost (the launcher killed the
rank first). Here one real gloo rank fails in training; the teardown is the real one
(on gloo it drains: destroy_process), watched as it is called."""
import datetime

import pytest
import torch
import torch.distributed as tdist

from handler.DDP import flight_recorder, run, utils
from handler.modes import parse_config
from handler.runtime.errors import StopRequested, UserError
from tests.conftest import SMALL


@pytest.fixture
def one_rank(tmp_path, monkeypatch):
    """A held store and the config of a one-rank ddp run on it; torch's settings and the
    recorder's folder are put back afterwards."""
    for name in (flight_recorder.BUFFER_SIZE, flight_recorder.DUMP_FILE, "TORCH_NCCL_DUMP_ON_TIMEOUT"):
        monkeypatch.setenv(name, "2000" if name == flight_recorder.BUFFER_SIZE else str(tmp_path / "fr" / "rank_"))
    monkeypatch.setattr(flight_recorder, "_folder", None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep this test process's threads
    store = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,  # pyright: ignore[reportPrivateImportUsage]
                           timeout=datetime.timedelta(seconds=30))
    cfg = parse_config(["--mode", "ddp", "--num_gpu", "1", "--ckpt", str(tmp_path), "--port", str(store.port),
                        "--dist-timeout", "30", *SMALL], cuda_count=0)
    yield cfg
    del store


def teardown_seen(monkeypatch, capsys):
    """Calls of the real destroy_process, each with what stderr held by then and its abort flag."""
    calls = []

    def watched(**kwargs):
        calls.append((capsys.readouterr().err, kwargs.get("abort", False), tdist.is_initialized()))
        utils.destroy_process(**kwargs)
    monkeypatch.setattr(run, "destroy_process", watched)
    return calls


def test_a_failing_rank_prints_its_line_first_then_asks_for_its_group_to_be_aborted(one_rank, monkeypatch, capsys):
    def fails(cfg, strategy):
        raise UserError("the data loader gave no batch")
    monkeypatch.setattr(run, "fit", fails)
    calls = teardown_seen(monkeypatch, capsys)
    with pytest.raises(SystemExit) as ended:
        run.worker(0, one_rank, strategy=None)
    assert ended.value.code == 2
    [(err_by_then, abort, joined)] = calls
    assert "rank 0 (" in err_by_then and "the data loader gave no batch" in err_by_then
    assert abort and joined
    assert not tdist.is_initialized()


def test_a_graceful_stop_drains_its_group(one_rank, monkeypatch, capsys):
    def stops(cfg, strategy):
        raise StopRequested(15)
    monkeypatch.setattr(run, "fit", stops)
    calls = teardown_seen(monkeypatch, capsys)
    with pytest.raises(SystemExit) as ended:
        run.worker(0, one_rank, strategy=None)
    assert ended.value.code == 128 + 15
    assert [abort for _, abort, _ in calls] == [False]
    assert not tdist.is_initialized()
