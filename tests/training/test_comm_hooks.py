"""--comm-hook and the DDP bucket options: validation, ranges, PowerSGD's resumable memory,
and every hook still learning (docs/COMM.md)."""
import copy
import gc
import threading
import time

import pytest
import torch
import torch.distributed as tdist

from handler.runtime import dist
import handler.runtime.nvtx as harness_nvtx
from handler.modes import parse_config
from handler.runtime.errors import UserError
from handler.DDP.checkpoint import HookedState
from handler.DDP.comm_hook import CommHook, check_backend_carries, in_ranges
from handler.DDP.model import model_to_DDP
from handler.DDP.options import CommOptions
from handler.DDP.powersgd import _settle
from models import build_model
from tests.conftest import read_metrics, run_cli, two_epoch_args
from tests.training.test_cli_errors import fails_with_one_line


@pytest.mark.parametrize("argv,expected", [
    (["--mode", "fsdp", "--comm-hook", "powersgd"], "--comm-hook tunes DDP's gradient all-reduce; use --mode ddp"),
    (["--mode", "pp", "--comm-hook", "bf16"], "drop it for --mode pp"),
    (["--mode", "dp", "--bucket-cap-mb", "5", "--static-graph"],
     "--bucket-cap-mb --static-graph tune DDP's gradient all-reduce"),
    (["--mode", "fsdp", "--grad-as-bucket-view"], "--grad-as-bucket-view tunes"),
    (["--powersgd-rank", "4"], "--powersgd-rank configures PowerSGD; add --comm-hook powersgd"),
    (["--comm-hook", "powersgd", "--powersgd-warmup", "1"], "use --powersgd-warmup 2 or more"),
    (["--comm-hook", "powersgd", "--powersgd-rank", "0"], "--powersgd-rank 0: use 1 or more"),
    (["--bucket-cap-mb", "0"], "--bucket-cap-mb 0: use a positive size"),
    (["--comm-hook", "int8"], "invalid choice: 'int8'"),
])
def test_comm_options_outside_their_use_are_refused_in_one_line(argv, expected, capsys):
    assert expected in fails_with_one_line(argv, capsys)


def test_comm_options_parse_for_the_ddp_modes():
    cfg = parse_config(["--mode", "ddp_dali", "--comm-hook", "powersgd", "--powersgd-rank", "4",
                        "--powersgd-warmup", "3", "--bucket-cap-mb", "1.5", "--static-graph",
                        "--grad-as-bucket-view"], cuda_count=0)
    comm = CommOptions.of(cfg)
    assert (comm.comm_hook, comm.powersgd_rank, comm.powersgd_warmup, comm.bucket_cap_mb) == ("powersgd", 4, 3, 1.5)
    assert comm.static_graph and comm.grad_as_bucket_view
    assert CommOptions.of(parse_config([], cuda_count=0)).comm_hook == "allreduce"
    with pytest.raises(UserError):
        parse_config(["--mode", "fsdp", "--bucket-cap-mb", "25.0001"], cuda_count=0)


# ---- one process group of one rank, in this process ----------------------------------------
@pytest.fixture
def group(tmp_path):
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    tdist.destroy_process_group()
    dist.forget_groups()  # the cached gloo side group belonged to this process group


class Recorder:
    """start/end ranges as a list of events, standing in for NVTX."""

    def __init__(self):
        self.events = []

    def start(self, name):
        self.events.append(("start", name))
        return name

    def end(self, handle):
        self.events.append(("end", handle))


def test_the_hooks_work_lies_inside_its_range():
    recorder, calls = Recorder(), []

    def hook(state, bucket):
        recorder.events.append(("hook", bucket.index()))
        future = torch.futures.Future()

        def compressed_and_sent():
            recorder.events.append(("done", bucket.index()))
            future.set_result(torch.zeros(1))
        calls.append(compressed_and_sent)
        return future

    class Bucket:
        def index(self):
            return 3
    future = in_ranges(hook, recorder)(None, Bucket())
    assert recorder.events == [("start", "allreduce b3"), ("hook", 3)]  # open while the exchange runs
    calls[0]()
    future.wait()
    assert recorder.events[2:] == [("done", 3), ("end", "allreduce b3")]


@pytest.mark.parametrize("hook", ["allreduce", "fp16", "bf16", "powersgd"])
def test_profiled_run_marks_every_bucket_with_each_hook(hook, group, monkeypatch):
    from torch.cuda import nvtx as cuda_nvtx
    opened, closed = [], []
    monkeypatch.setattr(cuda_nvtx, "range_start", lambda name: opened.append(name) or len(opened))
    monkeypatch.setattr(cuda_nvtx, "range_end", closed.append)
    monkeypatch.setattr(harness_nvtx, "ACTIVE", True)
    torch.manual_seed(0)
    raw = build_model("resnet20", 10)
    exact = copy.deepcopy(raw)
    ddp = model_to_DDP(raw, comm=CommHook(CommOptions(comm_hook=hook, powersgd_warmup=2, bucket_cap_mb=0.1)))
    x, y = _batches(1, seed=1)[0]
    for _ in range(3):  # the third step is PowerSGD's first compressed one
        raw.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    torch.nn.functional.cross_entropy(exact(x), y).backward()
    assert opened and set(opened) == {f"allreduce b{k}" for k in range(len(set(opened)))}
    assert len(set(opened)) > 1, "bucket_cap_mb reached DDP: several buckets"
    assert sorted(closed) == list(range(1, len(opened) + 1))
    grads = [(a.grad, b.grad) for a, b in zip(raw.parameters(), exact.parameters())]
    if hook == "allreduce":
        assert all(torch.equal(a, b) for a, b in grads)
    else:  # compressed, yet close: the cast rounds, PowerSGD approximates at low rank
        assert not all(torch.equal(a, b) for a, b in grads)
        assert all(torch.isfinite(a).all() for a, _ in grads)


def _train(ddp, raw, batches):
    """SGD steps on the batches; returns the parameters after each step."""
    opt = torch.optim.SGD(raw.parameters(), lr=0.05, momentum=0.9)
    after = []
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        after.append([p.detach().clone() for p in raw.parameters()])
    return after


def _batches(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(n)]


def _powersgd_model(seed_model, cap_mb):
    raw = copy.deepcopy(seed_model)
    comm = CommHook(CommOptions(comm_hook="powersgd", powersgd_warmup=2, bucket_cap_mb=cap_mb))
    return model_to_DDP(raw, comm=comm), raw, comm


@pytest.mark.parametrize("cap_mb", [0.05, 1e-6])  # 1e-6: a bucket per parameter, some with nothing to compress
def test_powersgd_memory_follows_parameters_whatever_the_bucket_layout(group, cap_mb):
    torch.manual_seed(0)
    seed_model = build_model("resnet20", 10)
    batches = _batches(6, seed=1)
    many, raw_many, _ = _powersgd_model(seed_model, cap_mb=cap_mb)
    one, raw_one, _ = _powersgd_model(seed_model, cap_mb=1000)
    for step, (a, b) in enumerate(zip(_train(many, raw_many, batches), _train(one, raw_one, batches))):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {step} differs between bucket layouts"


def _compressing():
    """A PowerSGD model after two plain steps and two compressed ones; the batches that follow."""
    torch.manual_seed(0)
    ddp, raw, comm = _powersgd_model(build_model("resnet20", 10), cap_mb=0.1)
    _train(ddp, raw, _batches(4, seed=1))
    return ddp, raw, comm, _batches(3, seed=2)


def test_powersgd_state_from_a_checkpoint_continues_bit_for_bit(group):
    ddp, raw, comm, rest = _compressing()
    saved = comm.state_dict()
    assert saved["iter"] == 4 and saved["world_size"] == 1
    assert any(piece["q"] is not None for piece in saved["ranks"][0].values())
    assert any(piece["error"].abs().sum() > 0 for piece in saved["ranks"][0].values())
    weights = copy.deepcopy(raw)  # SGD momentum is reset below, so compare from equal footing
    straight = _train(ddp, raw, rest)

    def resumed(state):
        again, raw_again, comm_again = _powersgd_model(weights, cap_mb=0.1)  # a new DDP: one bucket first
        comm_again.load_state_dict(state, say=lambda text: None)
        return _train(again, raw_again, rest)
    assert all(torch.equal(x, y) for x, y in zip(straight[-1], resumed(copy.deepcopy(saved))[-1]))
    lost = resumed(None)  # control: without the saved memory the run takes another path
    assert not all(torch.equal(x, y) for x, y in zip(straight[-1], lost[-1]))


def test_powersgd_moved_to_a_new_ddp_on_another_group_continues_bit_for_bit(group):
    # bench.comm wraps the same module in a new DDP on each (rate, delay) cell's own group
    ddp, raw, _, rest = _compressing()
    straight = _train(ddp, raw, rest)[-1]
    ddp, raw, comm, _ = _compressing()
    del ddp  # its reducer's gradient hooks go with it
    gc.collect()
    powersgd, other = comm.powersgd, tdist.new_group(backend="gloo")
    moved = comm.register(torch.nn.parallel.DistributedDataParallel(raw, process_group=other, bucket_cap_mb=0.1,
                                                                  init_sync=False),
                          group=other)
    assert comm.powersgd is powersgd and powersgd.state.process_group is other and powersgd.state.iter == 4
    assert all(torch.equal(x, y) for x, y in zip(straight, _train(moved, raw, rest)[-1]))
    assert powersgd.state.iter == 7


def test_powersgd_state_from_another_world_size_and_rank_continues_from_the_mean_error(group):
    torch.manual_seed(0)
    seed_model = build_model("resnet20", 10)
    ddp, raw, comm = _powersgd_model(seed_model, cap_mb=0.1)
    _train(ddp, raw, _batches(4, seed=1))
    saved = comm.state_dict()
    doubled = {name: {**piece, "error": piece["error"] * 3} for name, piece in saved["ranks"][0].items()}
    two_ranks = {**saved, "world_size": 2, "rank": saved["rank"] + 1, "ranks": [saved["ranks"][0], doubled]}
    said = []
    again, raw_again, comm_again = _powersgd_model(seed_model, cap_mb=0.1)
    comm_again.load_state_dict(two_ranks, say=said.append)
    assert "saved on 2 ranks continues on 1" in said[0] and "P and Q start afresh" in said[1]
    name, piece = next(iter(comm_again.powersgd.pool.items()))
    assert torch.allclose(piece["error"], saved["ranks"][0][name]["error"] * 2) and piece["q"] is None
    assert all(torch.isfinite(p).all() for p in _train(again, raw_again, _batches(3, seed=2))[-1])


def test_a_compressed_bucket_waits_for_the_previous_one_to_finish(group):
    # The previous bucket's future is held open by a timer thread for 0.3 s: the next bucket's
    # all-reduces must start only after it (docs/COMM.md: both ranks launch in one order).
    torch.manual_seed(0)
    ddp, raw, comm = _powersgd_model(build_model("resnet20", 10), cap_mb=1000)
    batches = _batches(4, seed=1)
    _train(ddp, raw, batches[:3])  # past the warm-up: compressing
    pending = torch.futures.Future()
    comm.powersgd.previous = pending
    threading.Timer(0.3, pending.set_result, [None]).start()
    started = time.monotonic()
    after = _train(ddp, raw, batches[3:])
    assert time.monotonic() - started >= 0.3 and pending.done()
    assert all(torch.isfinite(p).all() for p in after[-1])


def test_a_backend_that_cannot_carry_the_hooks_dtype_is_one_line_before_training(group):
    # gloo on torch 2.14 carries fp16 and bf16; uint16 stands for a dtype an older gloo refused.
    with pytest.raises(UserError, match="the gloo backend cannot all-reduce torch.uint16 .*--comm-hook powersgd"):
        check_backend_carries(torch.uint16, "fp16")


def test_a_failed_all_reduce_reaches_the_future_ddp_waits_on():
    failed, done = torch.futures.Future(), torch.futures.Future()
    failed.set_exception(RuntimeError("Connection closed by peer"))
    _settle(done, failed)
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        done.wait()


def test_a_powersgd_checkpoint_resumed_with_another_hook_says_its_state_is_unused(group, capsys):
    torch.manual_seed(0)
    ddp, raw, comm = _powersgd_model(build_model("resnet20", 10), cap_mb=0.1)
    _train(ddp, raw, _batches(3, seed=1))
    opt = torch.optim.SGD(raw.parameters(), lr=0.05)
    ckpt = {"model": raw.state_dict(), "optimizer": opt.state_dict(), "comm_hook": comm.state_dict()}
    HookedState(CommHook(CommOptions(comm_hook="allreduce"))).restore(ckpt, "last.pt", raw, opt)
    assert capsys.readouterr().err == ("note: the checkpoint's powersgd state is not used with "
                                       "--comm-hook allreduce\n")


# ---- end to end: train_cifar.py on the tests' learnable synthetic set ------------------------
@pytest.fixture(scope="module")
def hook_run(data_root, tmp_path_factory):
    """run(hook, *extra) -> folder: one finished two-epoch ddp run per hook, shared."""
    runs = {}

    def run(hook, *extra):
        key = (hook, *extra)
        if key not in runs:
            folder = tmp_path_factory.mktemp(f"ddp_{hook}")
            proc = run_cli(["--data", data_root, *two_epoch_args("ddp", folder), "--comm-hook", hook, *extra],
                           budget=35)
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[key] = folder
        return runs[key]
    return run


@pytest.mark.slow  # a two-epoch run per hook for one check each: CI's slow step (pytest.ini)
@pytest.mark.parametrize("hook", ["powersgd", "bf16"])
def test_compressed_hooks_learn_as_well_as_plain_allreduce(hook, hook_run, two_epoch_run):
    _, plain = two_epoch_run("ddp")
    base, m = read_metrics(plain / "metrics.json"), read_metrics(hook_run(hook) / "metrics.json")
    assert m["config"]["comm_hook"] == hook
    assert m["epochs"][1]["train_loss"] < m["epochs"][0]["train_loss"]
    # Measured: allreduce 0.57, bf16 0.61, fp16 0.56, powersgd 0.55 on this set (chance 0.1).
    assert m["test"]["acc"] > 0.3
    assert abs(m["test"]["acc"] - base["test"]["acc"]) <= 0.12


@pytest.mark.slow  # two runs of its own beside the hook's straight run: CI's slow step (pytest.ini)
def test_powersgd_two_epochs_equal_one_epoch_then_resume_bit_for_bit(hook_run, data_root, tmp_path):
    straight = hook_run("powersgd")  # warm-up 10 steps of 17: compression runs across the resume
    split = tmp_path / "split"
    args = ["--data", data_root, *two_epoch_args("ddp", split), "--comm-hook", "powersgd"]
    for extra in (["--stop-after", 1], ["--resume"]):
        proc = run_cli([*args, *extra], budget=35)
        assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = torch.load(straight / "last.pt", weights_only=True), torch.load(split / "last.pt", weights_only=True)
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), f"{name} differs after resume"
    saved = a["comm_hook"]
    assert saved["name"] == "powersgd" and saved["iter"] == b["comm_hook"]["iter"] > 10
    assert len(saved["ranks"]) == 2  # each rank's own error feedback
    ma, mb = read_metrics(straight / "metrics.json"), read_metrics(split / "metrics.json")
    assert [e["train_loss"] for e in ma["epochs"]] == [e["train_loss"] for e in mb["epochs"]]
    assert ma["test"] == mb["test"]
    cfg = ma["config"]
    assert (cfg["comm_hook"], cfg["powersgd_rank"], cfg["powersgd_warmup"], cfg["bucket_cap_mb"]) == \
        ("powersgd", 2, 10, 25.0)


def test_profile_report_names_the_hook_and_bucket_size_from_the_metrics():
    from handler.profiling.analysis import comm_config
    from handler.profiling.render import _comm_sections
    comm = {"source": "allreduce ranges", "buckets": 3, "seconds": 1.5, "share": 0.4, "overlap_share": 0.5,
            "exposed_s": 0.75}
    metrics = {"config": {"mode": "ddp", "comm_hook": "powersgd", "powersgd_rank": 4, "bucket_cap_mb": 5.0,
                          "static_graph": True}}
    summary = {"ranks": [{"rank": 0, "comm": comm}], "stragglers": None, "comm_config": comm_config(metrics)}
    page = "\n".join(_comm_sections(summary))
    assert "| 0 | powersgd rank 4 (static graph) | 5 MB | allreduce ranges | 3 |" in page
    older = comm_config({"config": {"mode": "ddp"}})  # a run from before --comm-hook
    assert (older["hook"], older["bucket_cap_mb"]) == ("allreduce", 25.0)
    summary["comm_config"] = comm_config(None)
    assert "| 0 | n/a (no --metrics) | n/a |" in "\n".join(_comm_sections(summary))
