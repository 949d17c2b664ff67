"""--mode pp: a W-stage pipeline is the same optimisation as one process accumulating M
micro-batches, keeps the loop's contracts, and shares checkpoints with ddp."""
import itertools
import json
import random
import shutil
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as mp

from handler.modes import parse_config
from handler.runtime.errors import UserError
from handler.profiling.bubble import theoretical_bubble
from handler.PP.options import PipelineOptions
from handler.PP.stages import balanced_split, describe, stage_groups_to_blocks, unit_params
from handler.PP.timing import TimingCache, cache_key, device_name
from tests.conftest import ROOT, free_port, read_metrics, run_cli
from tests.nsys_helpers import profile, require_nsys
from models.resnet import resnet20
from tests.pp_workers import accumulation_result, pp_worker



RUNS = (("gpipe", "time"), ("1f1b", "time"), ("1f1b", "params"))


@pytest.mark.slow  # three pp runs and their references for one check: CI's slow step (pytest.ini)
def test_two_stages_with_m_microbatches_equal_one_process_accumulating_m_steps_in_both_schedules_and_splits(tmp_path):
    """BatchNorm sees the same micro-batches in both, so parameters, BN statistics, momentum
    and the reported loss/accuracy agree after 3 steps, for GPipe and 1F1B, whether the
    model is cut between its stages (params) or inside one (time)."""
    m = 4
    mp.start_processes(pp_worker, args=(2, free_port(), m, RUNS, str(tmp_path)), nprocs=2, start_method="spawn")
    ref, ref_optimizer, sums = accumulation_result(m)
    for schedule, split in RUNS:
        pp = torch.load(tmp_path / f"pp-{schedule}-{split}.pt", weights_only=True)
        assert pp["model"].keys() == ref.keys()
        # 1e-4 (2e-4 for momentum), not 1e-5: this 4-block model's one-process reference sums in another order than
        # the pipeline; every schedule and split gives the same 1.9e-5 (measured), so the cut
        # adds nothing, and a wrong schedule, cut or micro-batch order differs by 1e-2 or more.
        for name in ref:
            diff = (pp["model"][name].float() - ref[name].float()).abs().max().item()
            assert diff <= 1e-4, (schedule, split, name, diff)
        assert torch.allclose(pp["sums"], torch.stack(sums), atol=1e-4, rtol=0), schedule
        # The gathered optimizer state is indexed as for the whole model: ddp can load it.
        assert pp["optimizer"]["state"].keys() == ref_optimizer["state"].keys()
        for i, state in ref_optimizer["state"].items():
            assert torch.allclose(pp["optimizer"]["state"][i]["momentum_buffer"], state["momentum_buffer"], atol=2e-4)
        # Every schedule and split computes the same numbers: the cut changes where, not what.
        first = torch.load(tmp_path / f"pp-{RUNS[0][0]}-{RUNS[0][1]}.pt", weights_only=True)
        for name in ref:
            assert torch.allclose(pp["model"][name], first["model"][name], atol=1e-6, rtol=0), (schedule, split, name)
        # tiny_resnet: blocks 0-2 at 32x32 form model stage 0, block 3 (16x16) stage 1.
        assert pp["split"]["how"] == split
        assert pp["split"]["cuts"] in (([3],) if split == "params" else ([1], [2]))


def test_split_chooser_minimises_the_slowest_stage_over_contiguous_cuts():
    assert balanced_split([1, 1, 10, 1], 2) == [range(0, 2), range(2, 4)]  # 2 | 11, not 12 | 1
    assert balanced_split([5, 5, 5, 5], 2) == [range(0, 2), range(2, 4)]
    assert balanced_split([5, 5, 5, 5], 3) == [range(0, 1), range(1, 2), range(2, 4)]  # ties: earliest cuts
    assert balanced_split([1, 2, 8, 32], 4) == [range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    assert balanced_split([12, 16, 21, 12, 15, 12, 2, 10, 3], 2) == [range(0, 3), range(3, 9)]  # 49 | 54
    assert balanced_split([7.0], 1) == [range(0, 1)]
    with pytest.raises(ValueError):
        balanced_split([1, 2], 3)
    rng = random.Random(0)
    for _ in range(200):  # against every possible cut
        costs = [rng.uniform(0, 10) for _ in range(rng.randint(1, 9))]
        parts = rng.randint(1, len(costs))
        best = min(max(sum(costs[a:b]) for a, b in zip((0, *cuts), (*cuts, len(costs))))
                   for cuts in itertools.combinations(range(1, len(costs)), parts - 1))
        groups = balanced_split(costs, parts)
        assert [i for g in groups for i in g] == list(range(len(costs))) and all(groups)
        assert max(sum(costs[i] for i in g) for g in groups) == pytest.approx(best)


def test_params_split_cuts_between_model_stages_and_names_blocks_when_time_cuts_inside_one():
    model = resnet20()
    groups = stage_groups_to_blocks(balanced_split(unit_params(model), 2), model)
    assert groups == [range(0, 6), range(6, 9)]
    assert describe(model, groups, [0.07, 0.20], "{:.2f}M params") == (
        "pp stage 0 = stem + stages 0-1 (0.07M params); pp stage 1 = stage 2 + head (0.20M params)")
    assert describe(model, [range(0, 4), range(4, 5), range(5, 9)], [1, 2, 3], "{} ms") == (
        "pp stage 0 = stem + blocks 0.0-1.0 (1 ms); pp stage 1 = block 1.1 (2 ms); "
        "pp stage 2 = blocks 1.2-2.2 + head (3 ms)")


def test_timing_cache_hits_only_on_the_same_key_and_survives_a_broken_file(tmp_path):
    path = str(tmp_path / "pp_timing.json")
    cpu = torch.device("cpu")
    key = cache_key("resnet20", 8, cpu, "off", False, False)
    others = [cache_key("resnet18", 8, cpu, "off", False, False), cache_key("resnet20", 16, cpu, "off", False, False),
              cache_key("resnet20", 8, cpu, "bf16", False, False), cache_key("resnet20", 8, cpu, "off", True, False),
              cache_key("resnet20", 8, cpu, "off", False, True)]
    assert len({key, *others}) == 6
    assert torch.__version__ in key and device_name(cpu) in key
    cache = TimingCache(path)
    assert cache.get(key) is None
    cache.put(key, {"fwd_ms": [1.0], "bwd_ms": [2.0]})
    assert TimingCache(path).get(key) == {"fwd_ms": [1.0], "bwd_ms": [2.0]}
    assert all(TimingCache(path).get(k) is None for k in others)
    (tmp_path / "pp_timing.json").write_text("{not json")
    broken = TimingCache(path)
    assert broken.get(key) is None and "unreadable timing cache" in broken.problem


def test_time_split_measures_once_then_reads_the_cache(tmp_path):
    """The second decision reads the first one's numbers (a second timing would differ)."""
    from contextlib import nullcontext
    from handler.PP.split import _decide
    options = dict(model_name="resnet20", micro_batch=2, autocast=nullcontext, amp="off", channels_last=False,
                   cache_path=str(tmp_path / "pp_timing.json"))
    model = resnet20()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = _decide(model, "time", 2, **options)
    second = _decide(model, "time", 2, **options)
    assert (first["cache_hit"], second["cache_hit"]) == (False, True)
    assert second["block_fwd_ms"] == first["block_fwd_ms"] and second["stage_blocks"] == first["stage_blocks"]
    assert len(first["block_fwd_ms"]) == 9 and all(t > 0 for t in first["block_bwd_ms"])
    assert sum(first["stage_ms"]) == pytest.approx(sum(first["block_fwd_ms"]) + sum(first["block_bwd_ms"]), rel=1e-3)
    # Timing ran on a copy: the model's weights and BatchNorm statistics are untouched.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.gpu
def test_time_split_times_blocks_on_the_gpu_with_bf16_and_channels_last(tmp_path):
    """On CUDA the clock is wall time after a synchronise; the key names the GPU."""
    from handler.PP.schedule import autocast_factory
    from handler.PP.split import _decide
    device = torch.device("cuda")
    model = resnet20().to(device).to(memory_format=torch.channels_last)
    record = _decide(model, "time", 2, model_name="resnet20", micro_batch=64, autocast=autocast_factory("bf16", device),
                     amp="bf16", channels_last=True, cache_path=str(tmp_path / "pp_timing.json"))
    assert len(record["block_fwd_ms"]) == 9 and all(t > 0 for t in record["block_bwd_ms"])
    assert torch.cuda.get_device_name(device) in next(iter(json.loads((tmp_path / "pp_timing.json").read_text())))


@pytest.mark.parametrize("argv,expected", [
    (["--batch-size", "30", "--microbatches", "4"], "does not split into --microbatches 4"),
    (["--num_gpu", "4", "--model", "resnet20", "--pp-split", "params"], "--num_gpu 4 pipeline stages but resnet20 has 3 stages"),
    (["--num_gpu", "10", "--model", "resnet20"], "--num_gpu 10 pipeline stages but resnet20 has 9 blocks"),
    (["--num_gpu", "3", "--model", "resnet20", "--microbatches", "2"], "--pp-schedule 1f1b needs at least"),
    (["--accum-steps", "2"], "--accum-steps with --mode pp"),
    (["--dp-balanced"], "--dp-balanced changes DataParallel; use it with --mode dp"),
    (["--sync-bn"], "not pp"),
    (["--dali-source", "jpeg"], "--dali-source picks ddp_dali's input files; use it with --mode ddp_dali, or drop it"),
    (["--amp", "fp16"], "--amp fp16"),
])
def test_conflicting_pp_options_give_one_line(argv, expected):
    with pytest.raises(UserError, match=None) as err:
        parse_config(["--mode", "pp", "--num_gpu", "2", *argv], cuda_count=0)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_pp_split_outside_pp_gives_one_line():
    with pytest.raises(UserError) as err:
        parse_config(["--mode", "ddp", "--pp-split", "params"], cuda_count=0)
    assert str(err.value) == "--pp-split shapes the pipeline of --mode pp; use --mode pp, or drop it for --mode ddp"


def test_pp_batch_is_global_per_stage():
    cfg = parse_config(["--mode", "pp", "--num_gpu", "2", "--batch-size", "64"], cuda_count=0)
    pp = PipelineOptions.of(cfg)
    assert cfg.local_batch == 64 and cfg.world_size == 2 and pp.pp_schedule == "1f1b" and pp.microbatches == 4
    assert pp.pp_split == "time"


# 128 training images (4 batches of 32), 40 test images: every number divides, so pp
# trains exactly the batches one ddp process does.
DATA = ["--dataset", "synthetic", "--synthetic-train", 128 + 32, "--synthetic-test", 40, "--valid-size", 32,
        "--model", "resnet20", "--workers", 0, "--no-progress", "--batch-size", 32, "--lr", 0.05]
PP = ["--mode", "pp", "--num_gpu", 2, "--microbatches", 4]
DDP_ACCUM = ["--mode", "ddp", "--num_gpu", 1, "--accum-steps", 4]


ONE_THREAD = {"OMP_NUM_THREADS": "1"}  # the same CPU kernels in every run: results comparable bit for bit


def train(tmp_path, name, *args):
    proc = run_cli(["--data", tmp_path / "data", "--ckpt", tmp_path / name, *DATA, *args], env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def states(path):
    return torch.load(path, weights_only=True)["model"]


@pytest.fixture(scope="module")
def first_epoch(tmp_path_factory):
    """pp, cut by parameters, trains epoch 1 of 2 and stops (--stop-after 1); profiled by
    nsys when it is there, so the bubble test needs no run of its own. Returns (folder,
    report or None)."""
    folder = tmp_path_factory.mktemp("pp")
    args = [*PP, "--pp-split", "params", "--epochs", 2, "--stop-after", 1, "--data", folder / "data", "--ckpt", folder / "pp", *DATA]
    if shutil.which("nsys") is None:
        train(folder, "pp", *PP, "--pp-split", "params", "--epochs", 2, "--stop-after", 1)
        return folder, None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        report = profile([sys.executable, str(ROOT / "train_cifar.py"), *map(str, args)], folder / "profile")
    return folder, report


@pytest.mark.slow  # three runs of its own after first_epoch: CI's slow step (pytest.ini)
def test_pp_stops_and_resumes_bit_exact_across_splits_and_shares_checkpoints_with_ddp_both_ways(
        first_epoch, tmp_path):
    """From pp's epoch-1 checkpoint (cut by parameters), epoch 2 runs twice: resumed in pp
    cut by time, and in one ddp process accumulating the same 4 micro-batches. Both continue the same optimisation,
    so they end bit for bit equal; the ddp checkpoint then resumes in pp and evaluates
    exactly as ddp did."""
    folder, _ = first_epoch
    m = read_metrics(folder / "pp" / "metrics.json")
    assert m["env"]["mode"] == "pp" and m["config"]["pp_schedule"] == "1f1b"
    assert m["env"]["pp_split"]["how"] == "params" and m["env"]["pp_split"]["cuts"] == [6]  # stem+stages 0-1 | 2
    assert [e["train_samples"] for e in m["epochs"]] == [128]  # each image counted once, not per stage
    assert m["test"]["samples"] == 40 and m["epochs"][0]["val_samples"] == 32
    shutil.copytree(folder / "data", tmp_path / "data")
    shutil.copytree(folder / "pp", tmp_path / "pp")
    half = folder / "pp" / "last.pt"

    resumed = train(tmp_path, "pp", *PP, "--epochs", 2, "--resume")
    split = read_metrics(tmp_path / "pp" / "metrics.json")["env"]["pp_split"]
    assert split["how"] == "time" and len(split["stage_ms"]) == 2 and split["cache_hit"] is False
    assert f"pp: split by time (measured, micro-batch 8, {tmp_path / 'pp' / 'pp_timing.json'})" in resumed.stdout
    assert (tmp_path / "pp" / "pp_timing.json").exists()
    train(tmp_path, "ddp", *DDP_ACCUM, "--epochs", 2, "--resume", half)
    a, b = states(tmp_path / "pp" / "last.pt"), states(tmp_path / "ddp" / "last.pt")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs between pp and ddp after resuming"
    epochs = [read_metrics(tmp_path / n / "metrics.json")["epochs"] for n in ("pp", "ddp")]
    assert [e["train_loss"] for e in epochs[0]] == pytest.approx([e["train_loss"] for e in epochs[1]], rel=1e-6)

    back = train(tmp_path, "ddp", *PP, "--epochs", 2, "--resume", "--metrics", tmp_path / "back.json")
    assert "resumed from" in back.stdout
    test_pp, test_ddp = read_metrics(tmp_path / "back.json")["test"], read_metrics(tmp_path / "ddp" / "metrics.json")["test"]
    assert test_pp["samples"] == test_ddp["samples"] == 40 and test_pp["acc"] == test_ddp["acc"]
    assert test_pp["loss"] == pytest.approx(test_ddp["loss"], abs=1e-6)


@pytest.mark.slow  # first_epoch, shared there with the bit-exact resume: CI's slow step (pytest.ini)
def test_profiled_two_stage_run_reports_measured_and_theoretical_bubble(first_epoch):
    folder, report = first_epoch
    if report is None:
        require_nsys()  # skips (or fails under CI=true) without nsys
    subprocess.run([sys.executable, "-m", "handler.profiling.report", str(report), "--brief"], cwd=ROOT,
                   check=True, capture_output=True)
    summary = json.loads((folder / "profile.summary.json").read_text())
    stages = [r["pipeline"] for r in summary["ranks"]]
    assert [s["stage"] for s in stages] == [0, 1]
    for s in stages:
        assert s["theoretical_bubble_share"] == pytest.approx(1 / 5)  # W=2, M=4
        assert 0 < s["busy_share"] < 1 and s["bubble_share"] == pytest.approx(1 - s["busy_share"])
    # The last stage waits for the first micro-batch's activations before it can start.
    assert stages[1]["bubble_share"] > 0.05
    assert "## Pipeline (pp)" in (folder / "profile.summary.md").read_text()
