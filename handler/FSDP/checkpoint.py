"""Sharded checkpoints for fsdp: every rank writes its own shard with
torch.distributed.checkpoint; last.pt only names the shard folder.

A save writes a new folder, then last.pt (atomically) points at it, then older folders
go: a kill at any moment leaves last.pt naming a complete folder. A save that finds no
room ends in the same one line as an unsharded one (docs/FAILURES.md): every rank learns of
the failure from torch's save, the half-written folder goes, the previous one is kept.
"""
import errno
import os
import shutil

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from ..runtime import dist
from ..runtime.errors import UserError
from ..train.checkpoint import disk_full, free_bytes, tensor_bytes

PREFIX = "shards-"


class ShardedState:
    def capture(self, cfg, model, optimizer, tag: str) -> dict:
        folder = os.path.join(cfg.ckpt, PREFIX + tag)
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        try:
            dcp_save(state, checkpoint_id=folder)
        except CheckpointException as err:  # raised on every rank alike: torch gathers the failures
            raise _failed_save(cfg, folder, state, err) from None
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


def _failed_save(cfg, folder: str, state: dict, err: CheckpointException) -> BaseException:
    """A full disk: rank 0's one line (the folder, the room needed and free, the previous
    checkpoint kept), a quiet exit elsewhere. Anything else: torch's own error. The ranks
    agree on which before rank 0 removes the half-written folder (last.pt never named it)."""
    last = os.path.join(cfg.ckpt, "last.pt")
    failures = [exc for exc, _ in err.failures.values()]
    # torch's writer may report a short write as a RuntimeError: then the room left decides
    full = any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in failures) \
        or free_bytes(last) < tensor_bytes(state)  # DTensors count their global size: the whole folder
    full = bool(dist.all_reduce_max(int(full)))
    if cfg.is_main and os.path.basename(folder) != _named(last):
        shutil.rmtree(folder, ignore_errors=True)
    if not full:
        return err
    return UserError(disk_full(last, state)) if cfg.is_main else SystemExit(2)


def _named(last: str):
    """The shard folder last.pt names (a save at the step it holds writes into that folder)."""
    try:
        return torch.load(last, weights_only=True).get("shards")
    except (OSError, RuntimeError):
        return None
