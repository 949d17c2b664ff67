"""handler/DDP/comm_hook.py: `allreduce b{k}` start/end ranges around DDP's own all-reduce."""
import torch
import torch.distributed as tdist
from torch.cuda import nvtx as cuda_nvtx

import handler.runtime.nvtx as harness_nvtx
from handler.DDP.model import model_to_DDP


def test_profiled_ddp_marks_each_bucket_and_keeps_ddps_gradients(tmp_path, monkeypatch):
    opened, closed = [], []
    monkeypatch.setattr(cuda_nvtx, "range_start", lambda name: opened.append(name) or len(opened))
    monkeypatch.setattr(cuda_nvtx, "range_end", closed.append)
    tdist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        traced = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        traced.load_state_dict(plain.state_dict())
        batch = torch.randn(4, 8)
        unprofiled = model_to_DDP(plain)  # no profiler: DDP's built-in all-reduce, no ranges
        unprofiled(batch).sum().backward()
        assert opened == []
        monkeypatch.setattr(harness_nvtx, "ACTIVE", True)
        profiled = model_to_DDP(traced)
        for _ in range(2):  # the second step runs with DDP's rebuilt buckets
            traced.zero_grad()
            profiled(batch).sum().backward()
    finally:
        tdist.destroy_process_group()
    assert opened and set(opened) == {f"allreduce b{k}" for k in range(len(set(opened)))}
    assert sorted(closed) == list(range(1, len(opened) + 1))  # every range ended, by its own handle
    for a, b in zip(plain.parameters(), traced.parameters()):
        assert torch.allclose(a.grad, b.grad)
