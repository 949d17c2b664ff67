"""Sharded checkpoints for fsdp: every rank writes its own shard with
torch.distributed.checkpoint; last.pt only names the shard folder.

A save writes a new folder, then last.pt (atomically) points at it, then older folders
go: a kill at any moment leaves last.pt naming a complete folder.
"""
import os
import shutil

import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..runtime.errors import UserError

PREFIX = "shards-"


class ShardedState:
    def capture(self, cfg, model, optimizer, tag: str) -> dict:
        folder = os.path.join(cfg.ckpt, PREFIX + tag)
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp_save({"model": model_state, "optimizer": optim_state}, checkpoint_id=folder)
        return {"shards": os.path.basename(folder)}

    def restore(self, ckpt: dict, path: str, model, optimizer) -> None:
        if "shards" not in ckpt:
            raise UserError(f"{path} holds unsharded state from another mode; resume it with "
                            f"--mode {ckpt.get('config', {}).get('mode', 'ddp')}")
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp_load(state, checkpoint_id=os.path.join(os.path.dirname(os.path.abspath(path)), ckpt["shards"]))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def keep(self, folder: str, last: dict, best) -> None:
        """Rank 0, after last.pt/best.pt are written: drop shard folders neither names."""
        wanted = {last["shards"]}
        best_file = os.path.join(folder, "best.pt")
        if best is not None:
            wanted.add(best["shards"])
        elif os.path.exists(best_file):
            wanted.add(torch.load(best_file, weights_only=True).get("shards"))
        for name in os.listdir(folder):
            if name.startswith(PREFIX) and name not in wanted:
                shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
