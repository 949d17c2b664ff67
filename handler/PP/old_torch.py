"""What torch.distributed.pipelining on CPU (gloo) needs before torch 2.8.

Up to 2.7 the schedules wait on only the last Work of each batched send/recv
(`_batch_p2p` pops one, pytorch#132644): NCCL coalesces a batch into one Work, gloo
returns one per operation. 1F1B batches a send with a receive, so on gloo a stage went
on before its send had finished and both stages waited for each other for ever. 2.8
(pytorch#152938) waits on them all; this does the same where that fix is missing.
"""
import torch.distributed as tdist
from torch.distributed.pipelining import schedules


class _AllWorks:
    def __init__(self, works):
        self.works = works

    def wait(self):
        for work in self.works:
            work.wait()
        return True


def _batch_p2p_waiting_for_all(p2p_ops, desc=None):
    if not p2p_ops:
        return None
    return _AllWorks(tdist.batch_isend_irecv(p2p_ops))


def patch_batch_p2p() -> None:
    if hasattr(schedules, "_wait_batch_p2p"):  # 2.8+: fixed upstream
        return
    schedules._batch_p2p = _batch_p2p_waiting_for_all
