"""The DDP modes' checkpoint state: the plain model and optimizer, plus the comm hook's
memory (PowerSGD's error feedback and low-rank factors) when it has any."""
import sys

import torch.distributed as tdist

from ..train.checkpoint import PlainState


class HookedState(PlainState):
    def __init__(self, comm):
        self.comm = comm  # the run's CommHook (handler/DDP/comm_hook.py)

    def capture(self, cfg, model, optimizer, tag: str) -> dict:
        state = super().capture(cfg, model, optimizer, tag)
        hook_state = self.comm.state_dict()  # every rank takes part; rank 0 receives all
        if hook_state is not None:
            state["comm_hook"] = hook_state
        return state

    def restore(self, ckpt: dict, path: str, model, optimizer) -> None:
        super().restore(ckpt, path, model, optimizer)
        self.comm.load_state_dict(ckpt.get("comm_hook"), _say_once)


def _say_once(text: str) -> None:
    if not tdist.is_initialized() or tdist.get_rank() == 0:
        print(text, file=sys.stderr, flush=True)
