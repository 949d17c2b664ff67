"""pp checkpoints in the plain format: rank 0 gathers every stage's part into one
state_dict of the whole model, and one optimizer state indexed as for the whole model,
so a pp last.pt resumes in ddp and a ddp last.pt resumes in pp (each stage takes its part).
"""
import torch
import torch.distributed as tdist

from models import build_model
from ..runtime import dist
from ..runtime.errors import UserError


def _full_index(model_name: str) -> dict:
    """Parameter name -> its index in the whole model's optimizer (parameters() order)."""
    with torch.device("meta"):
        full = build_model(model_name, 10)
    return {name: i for i, (name, _) in enumerate(full.named_parameters())}


def _cpu(value):
    return value.detach().cpu() if torch.is_tensor(value) else value


class PipelineState:
    def capture(self, cfg, model, optimizer, tag: str) -> dict:
        index = _full_index(cfg.model)
        ids = [index[name] for name, _ in model.named_parameters()]
        optim = optimizer.state_dict()
        part = {"model": {k: _cpu(v) for k, v in model.state_dict().items()},
                "state": {ids[i]: {k: _cpu(v) for k, v in s.items()} for i, s in optim["state"].items()},
                "groups": optim["param_groups"]}
        parts = [None] * cfg.world_size if cfg.is_main else None
        tdist.gather_object(part, parts, dst=0, group=dist.cpu_group())
        if parts is None:  # not rank 0
            return {}
        state = {k: v for p in parts for k, v in p["state"].items()}
        groups = [{**g, "params": list(range(len(index)))} for g in parts[0]["groups"]]
        return {"model": {k: v for p in parts for k, v in p["model"].items()},
                "optimizer": {"state": dict(sorted(state.items())), "param_groups": groups}}

    def restore(self, ckpt: dict, path: str, model, optimizer) -> None:
        if "model" not in ckpt:
            raise UserError(f"{path} holds sharded (fsdp) state; resume it with --mode fsdp")
        mine = model.state_dict()
        model.load_state_dict({k: ckpt["model"][k] for k in mine})
        index = _full_index(ckpt["config"]["model"])
        ids = [index[name] for name, _ in model.named_parameters()]
        saved = ckpt["optimizer"]
        optimizer.load_state_dict({
            "state": {i: saved["state"][g] for i, g in enumerate(ids) if g in saved["state"]},
            "param_groups": [{**g, "params": list(range(len(ids)))} for g in saved["param_groups"]]})

    def keep(self, folder: str, last: dict, best) -> None:
        """Nothing lives outside the checkpoint files."""
