"""PyTorch's Flight Recorder for the DDP-family modes (docs/FAILURES.md).

Every collective of the run's groups goes into a ring buffer in memory (NCCL; gloo too on
torch that records it, 2.14 does). When a collective fails or a peer is lost, the rank that
says so dumps its buffer into the run's folder, and its one line says where and how to read
it: `torchfrtrace <folder>` (also `python -m torch.distributed.flight_recorder.fr_trace`)
names the collective each rank last entered. NCCL's own watchdog dumps there too on its
timeout (TORCH_NCCL_DUMP_ON_TIMEOUT), which the heartbeat normally forestalls.
"""
import os
from typing import Callable, Optional

import torch
import torch.distributed as tdist

BUFFER_ENTRIES = "2000"  # collectives kept: a few steps of a ResNet's buckets and the loop's own
PREFIX = "rank_"  # fr_trace reads <folder>/<prefix><rank>
# torch reads the recorder's settings under new names (TORCH_FR_*, taken here from 2.8 on) and
# warns at each old one it sees;
# before, only the old ones (TORCH_NCCL_*). A user's own value wins.
NEW_NAMES = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 8)
BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE" if NEW_NAMES else "TORCH_NCCL_TRACE_BUFFER_SIZE"
DUMP_FILE = "TORCH_FR_DUMP_TEMP_FILE" if NEW_NAMES else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"

_folder: Optional[str] = None


def folder_for(ckpt: str) -> str:
    return os.path.join(os.path.abspath(ckpt), "flight_recorder")


def enable(ckpt: str, *, use_cuda: bool) -> None:
    """Turn the recorder on for groups made from now on, dumping into the run's folder.
    NCCL's watchdog writes there by itself, so on GPU the folder is made now."""
    global _folder
    os.environ.setdefault(BUFFER_SIZE, BUFFER_ENTRIES)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault(DUMP_FILE, os.path.join(folder_for(ckpt), PREFIX))
    _folder = os.path.dirname(os.environ[DUMP_FILE])
    if use_cuda:
        os.makedirs(_folder, exist_ok=True)


def _dumper(backend: str) -> Optional[Callable[[], bytes]]:
    """torch's dump of this process's record: NCCL's own recorder on NCCL, the general one
    (gloo) otherwise; None where this torch has neither (torch 2.6 records only NCCL)."""
    from torch._C import _distributed_c10d as c10d
    names = ("_dump_nccl_trace", "_dump_fr_trace") if backend == "nccl" else ("_dump_fr_trace",)
    return next((getattr(c10d, n) for n in names if hasattr(c10d, n)), None)


def dump(rank: int) -> str:
    """Write this rank's record to the run's folder; the clause the failure line carries
    ("" when the recorder was not enabled in this process)."""
    if _folder is None:
        return ""
    backend = str(tdist.get_backend()) if tdist.is_initialized() else "gloo"
    fn = _dumper(backend)
    if fn is None:
        return (f"no Flight Recorder dump: this torch cannot dump a {backend} group's record "
                "(torch._C._distributed_c10d._dump_fr_trace is missing)")
    path = os.path.join(_folder, f"{PREFIX}{rank}")
    try:
        data = fn()
        os.makedirs(_folder, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    except Exception as err:  # noqa: BLE001 - the failure line must still come out
        return f"the Flight Recorder dump to {path} failed ({type(err).__name__}: {err})"
    return f"flight recorder: {path}, read every rank's with `torchfrtrace {_folder}`"
