"""Regression tests for the first GPU-path defects, each shown on CPU where the
defect can be shown there (the GPU-only ones are in tests/machine/test_gpu.py)."""
import copy
from contextlib import nullcontext
import random
import threading
import time

import numpy as np
import pytest
import torch

from handler.train.checkpoint import load_checkpoint, make_checkpoint, save_atomic, set_rng_state
from handler.modes import parse_config
from handler.train.divergence import DivergenceGuard
from handler.runtime.errors import UserError
from handler.train.loop import Step, train_epoch
from handler.train.model_options import checkpoint_stages
from handler.DP.precision import AutocastInside
from models import build_model


def _draws():
    return random.random(), torch.rand(3).tolist(), np.random.rand(3).tolist()


def _tiny_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    ckpt = make_checkpoint(state={"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                           scheduler=scheduler, scaler=torch.amp.GradScaler("cpu", enabled=False),
                           epoch=1, step=0, best_acc=0.5, history=[], config={"model": "x"})
    path = tmp_path / "last.pt"
    save_atomic(ckpt, str(path))
    return path


def test_rng_states_restore_from_a_checkpoint_loaded_onto_a_non_cpu_device(tmp_path):
    # Defect 1: map_location=cuda:N moved the RNG ByteTensors off the CPU and
    # torch.set_rng_state raised. `meta` is a non-CPU location that holds no data at all.
    random.seed(1), torch.manual_seed(1), np.random.seed(1)
    path = _tiny_checkpoint(tmp_path)
    expected = _draws()
    random.seed(2), torch.manual_seed(2), np.random.seed(2)
    ckpt = load_checkpoint(str(path), torch.device("meta"))
    assert ckpt["model"]["weight"].device.type == "meta"
    set_rng_state(ckpt["rng"])
    assert _draws() == expected


def test_rng_states_in_the_older_tensor_format_still_restore(tmp_path):
    torch.manual_seed(3)
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": dict(zip(("kind", "keys", "pos", "has_gauss", "gauss"), np.random.get_state()))}
    state["numpy"]["keys"] = torch.from_numpy(state["numpy"]["keys"].astype(np.int64))
    expected = _draws()
    torch.manual_seed(4)
    set_rng_state(state)
    assert _draws() == expected


def test_a_checkpointed_stage_copied_like_a_dataparallel_replica_runs_the_copys_weights():
    # Defect 3: DataParallel replicas copy __dict__; a forward closure put on the instance
    # kept calling the original (cuda:0) module's weights from every replica.
    model = build_model("resnet20", 10).eval()
    checkpoint_stages(model)
    stage = model.stages[0]
    replica = stage._replicate_for_data_parallel()
    replica._modules = {name: copy.deepcopy(child) for name, child in stage._modules.items()}
    with torch.no_grad():
        for p in replica.parameters():
            p.zero_()
    x = torch.randn(2, 16, 8, 8)
    with torch.enable_grad():  # the checkpointed path
        assert not torch.allclose(replica(x), stage(x))
        assert torch.allclose(replica(x), _forward_with_zero_weights(stage, x))


def _forward_with_zero_weights(stage, x):
    twin = copy.deepcopy(stage)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    return twin(x)


def _in_replica_thread(module, x):
    """What DataParallel's parallel_apply does per replica: a worker thread re-enters
    autocast without a dtype, so the thread's default applies (fp16 on CUDA)."""
    out = {}

    def work():
        with torch.autocast("cpu", dtype=torch.float16):
            out["y"] = module(x)
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return out["y"]


def test_dp_replicas_keep_the_requested_bf16_under_a_threads_fp16_default():
    # Defect 4: the loop's bf16 autocast did not reach DataParallel's worker threads.
    linear, x = torch.nn.Linear(8, 8), torch.randn(4, 8)
    assert _in_replica_thread(linear, x).dtype == torch.float16  # the defect's mechanism
    bf16 = AutocastInside(linear, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    assert _in_replica_thread(bf16, x).dtype == torch.bfloat16


class _Loader:
    def __init__(self, steps, setup_s=0.0):
        self.steps, self.setup_s = steps, setup_s
        self.batches = [(torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))) for _ in range(steps)]

    def __len__(self):
        return self.steps

    def __iter__(self):
        return iter(self.batches)

    def set_epoch(self, epoch):
        time.sleep(self.setup_s)


class _Bar:
    def update(self, n):
        pass


class _NoStop:
    def should_stop(self):
        return False


def _epoch(loader):
    torch.manual_seed(0)
    model = build_model("resnet20", 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = Step(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                scaler=torch.amp.GradScaler("cpu", enabled=False), autocast=nullcontext)
    return train_epoch(step, loader, 0, torch.device("cpu"), _Bar(), stop=_NoStop(),
                       guard=DivergenceGuard(torch.device("cpu"), 1))


def test_training_steps_create_no_tensors_from_host_values_and_read_nothing_back(monkeypatch):
    # Defect 7: torch.tensor(float(n), device=cuda) in every step was a blocking copy.
    calls = {"tensor": 0, "item": 0, "tolist": 0}
    real_tensor, real_item, real_tolist = torch.tensor, torch.Tensor.item, torch.Tensor.tolist

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper
    monkeypatch.setattr(torch, "tensor", counting("tensor", real_tensor))
    monkeypatch.setattr(torch.Tensor, "item", counting("item", real_item))
    monkeypatch.setattr(torch.Tensor, "tolist", counting("tolist", real_tolist))
    counts = []
    for steps in (2, 6):
        calls.update(dict.fromkeys(calls, 0))
        result = _epoch(_Loader(steps))
        assert result["samples"] == 4 * steps
        counts.append(dict(calls))
    assert counts[0] == counts[1], f"per-step host<->device traffic: {counts}"


def test_the_epoch_clock_includes_the_loaders_per_epoch_setup():
    # Defect 11: DALI rebuilt its pipeline in set_epoch before the clock started, while
    # DataLoader's worker start-up fell inside it; now both count, as data wait.
    result = _epoch(_Loader(2, setup_s=0.3))
    assert result["time_s"] >= 0.3 and result["data_wait_s"] >= 0.3
    assert result["phase_s"]["data"] >= 0.3


def test_sync_bn_with_fsdp_is_a_one_line_error():
    # Defect 8: accepted and silently ignored.
    with pytest.raises(UserError, match="--sync-bn.*ddp or ddp_dali.*fsdp"):
        parse_config(["--mode", "fsdp", "--sync-bn"], cuda_count=1)


def test_dali_crop_window_is_no_constant_node_of_the_pipeline():
    # Defect 9: a positional numpy shape became a Constant operator, on the GPU for a GPU
    # slice, which DALI copies back to the host and syncs on every batch.
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is not installed")
    from nvidia.dali import Pipeline, fn
    from handler.DALI.pipeline import _augment_read
    pipe = Pipeline(batch_size=2, num_threads=1, device_id=None)
    with pipe:
        images = fn.external_source(source=lambda: [np.zeros((32, 32, 3), np.uint8)] * 2, layout="HWC")
        pipe.set_outputs(_augment_read(images))
    pipe.build()
    ops = [str(op.spec).split(":")[0].removeprefix("OpSpec for ") for op in pipe._ops]
    assert "Slice" in ops and "Constant" not in ops, ops


def test_ddp_buffer_sync_is_switched_off_in_the_spelling_of_the_installed_torch():
    # Defect 2: forward_sync_buffers exists from torch 2.13; older DDP raised on it.
    import inspect
    from torch.nn.parallel import DistributedDataParallel
    from handler.DDP.model import no_buffer_sync

    class OldDDP:  # torch 2.6-2.12's signature
        def __init__(self, module, device_ids=None, broadcast_buffers=True):
            pass
    assert no_buffer_sync(OldDDP) == {"broadcast_buffers": False}
    (keyword, value), = no_buffer_sync().items()
    assert value is False and keyword in inspect.signature(DistributedDataParallel).parameters
