"""Mixed precision inside DataParallel's replicas."""
from torch import nn


class AutocastInside(nn.Module):  # gpu-only: tests/machine/test_gpu.py::test_every_mode_trains_with_every_flag_validate_accepts_for_it_on_gpus[dp-1]
    """Enter autocast inside each replica's forward, with the run's dtype.

    DataParallel runs replicas in worker threads and re-enters autocast there without
    the dtype, so a thread's default (fp16 on CUDA) replaces the bf16 the loop asked
    for (pytorch#125186), and no GradScaler guards those fp16 gradients. Entering it
    here, in the thread that runs the replica, keeps the requested dtype.
    """

    def __init__(self, model: nn.Module, autocast):
        super().__init__()
        self.model = model
        self.autocast = autocast  # a context-manager factory, as in loop.Step

    def forward(self, *inputs):
        with self.autocast():
            return self.model(*inputs)
