"""Checkpoints: one plain dict with everything needed to resume, written atomically."""
import errno
import os
import random
import shutil
from typing import Protocol

import numpy as np
import torch

from ..runtime.errors import UserError

FORMAT = 1


def rng_state() -> dict:
    """Generator states as plain bytes: no tensor in them, so any map_location
    (cuda:N, meta) leaves them loadable; torch.set_rng_state wants a CPU ByteTensor."""
    legacy = np.random.get_state()
    assert isinstance(legacy, tuple), "the global RandomState is an MT19937: its legacy state is a tuple"
    kind, keys, pos, has_gauss, gauss = legacy
    state = {"python": random.getstate(), "torch": _bytes(torch.get_rng_state()),
             "numpy": {"kind": kind, "keys": keys.astype(np.uint32).tobytes(), "pos": pos,
                       "has_gauss": has_gauss, "gauss": gauss}}
    if torch.cuda.is_initialized():
        state["cuda"] = [_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict) -> str:
    """Restore every generator; returns a note when the checkpoint holds the states of more
    GPUs than are visible (a resume on fewer GPUs): those are dropped."""
    random.setstate(state["python"])
    torch.set_rng_state(_byte_tensor(state["torch"]))
    n = state["numpy"]
    keys = n["keys"]
    keys = np.frombuffer(keys, dtype=np.uint32) if isinstance(keys, bytes) else keys.cpu().numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" not in state or not torch.cuda.is_initialized():
        return ""
    saved, visible = state["cuda"], torch.cuda.device_count()
    for i, saved_state in enumerate(saved[:visible]):
        torch.cuda.set_rng_state(_byte_tensor(saved_state), i)
    if len(saved) <= visible:
        return ""
    return (f"the checkpoint holds random states for {len(saved)} GPUs but {visible} are visible: "
            f"the last {len(saved) - visible} are dropped")


def _bytes(t: torch.Tensor) -> bytes:
    return t.cpu().numpy().tobytes()


def _byte_tensor(saved) -> torch.Tensor:
    """bytes (this format) or a ByteTensor (checkpoints before it) -> CPU ByteTensor."""
    if isinstance(saved, (bytes, bytearray)):
        return torch.frombuffer(bytearray(saved), dtype=torch.uint8)
    return saved.cpu()


class ModelState(Protocol):
    """How a mode's model and optimizer state enter checkpoints (PlainState, or the mode's own)."""

    def capture(self, cfg, model, optimizer, tag: str) -> dict: ...

    def restore(self, ckpt: dict, path: str, model, optimizer) -> None: ...

    def keep(self, folder: str, last: dict, best) -> None: ...


class PlainState:
    """Model and optimizer state inside the checkpoint dict, written by rank 0 alone."""

    def capture(self, cfg, model, optimizer, tag: str) -> dict:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def restore(self, ckpt: dict, path: str, model, optimizer) -> None:
        if "model" not in ckpt:
            raise UserError(f"{path} holds sharded (fsdp) state; resume it with --mode fsdp")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])

    def keep(self, folder: str, last: dict, best) -> None:
        """Nothing lives outside the checkpoint files."""


def make_checkpoint(*, state, scheduler, scaler, epoch, step, best_acc, history, config) -> dict:
    """`state` holds the model/optimizer (or where their shards are); `epoch` finished
    epochs plus `step` finished steps of the next (0 at epoch ends)."""
    return {"format": FORMAT, **state, "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
            "epoch": epoch, "step": step, "best_acc": best_acc, "history": history, "rng": rng_state(),
            "config": config}


def save_atomic(obj: dict, path: str) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the old file,
    so a kill at any moment leaves either the old or the new checkpoint, never half.
    A full disk is a UserError naming the folder, the room needed and free (docs/FAILURES.md)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        # torch's zip writer reports a short write as a RuntimeError ("unexpected pos"), so a
        # full disk is also known by the room left once the temp file is gone.
        _remove(tmp)
        full = isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)
        if not (full or free_bytes(path) < tensor_bytes(obj)):
            raise
        raise UserError(disk_full(path, obj)) from None
    finally:
        _remove(tmp)


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)


def disk_full(path: str, obj: dict) -> str:
    """The one line for a save that found no room: the old file is untouched by then."""
    folder = os.path.dirname(os.path.abspath(path))
    kept = (f"the previous {os.path.basename(path)} there is kept" if os.path.isfile(path)
            else "nothing was saved")
    return (f"no room to save a checkpoint in {folder}: it needs about {_mib(tensor_bytes(obj))} and "
            f"{_mib(free_bytes(path))} are free; {kept}. Free space there (or choose another "
            "--ckpt) and continue with --resume")


def free_bytes(path: str) -> int:
    return shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free


def tensor_bytes(obj: object) -> int:
    """Bytes of the tensors in a (nested) checkpoint: what a save needs, within its small metadata."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def load_checkpoint(path: str, device) -> dict:
    if not os.path.isfile(path):
        raise UserError(f"no checkpoint at {path}; check --resume/--ckpt, or start without --resume")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:
        raise UserError(f"{path} is not a readable checkpoint ({type(err).__name__}); "
                        "pass another file to --resume") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT or not ({"model", "shards"} & set(ckpt)):
        raise UserError(f"{path} is not a checkpoint written by this harness; pass another file to --resume")
    return ckpt
