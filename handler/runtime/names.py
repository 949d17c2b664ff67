"""Every NVTX range and mark name, declared once (docs/PROFILING.md, "NVTX ranges").

The training side opens these ranges (through handler/runtime/nvtx.py and phases.py) and
handler/profiling/ reads them back from the report, both from the constants below, so a
rename reaches both sides at once; tests/training/test_names.py checks that no other module
spells a name. `grep -rn "names import" handler bench` lists every module that
opens or reads one. The names themselves are a contract: old reports and scripts use them.
"""
import re


class Numbered:
    """A name with one value in it, e.g. `epoch 3`: `EPOCH(3)` writes it, `EPOCH.match(text)`
    reads it back (group 1 is the value)."""

    __slots__ = ("template", "pattern")

    def __init__(self, template: str, value: str = r"\d+"):
        self.template = template  # "epoch {}"
        before, after = template.split("{}")
        self.pattern = re.compile(re.escape(before) + f"({value})" + re.escape(after))

    def __call__(self, value: object) -> str:
        return self.template.format(value)

    def match(self, text: str) -> re.Match | None:
        return self.pattern.fullmatch(text)


# The loop's ranges: `epoch {e}` holds `batch {i}`, which holds the phases.
EPOCH = Numbered("epoch {}")
BATCH = Numbered("batch {}")
DATA = "data"  # waiting for the next batch (the loop's phase; the copy to the GPU nests inside)
H2D = "h2d"  # the copy to the GPU (handler/data/loaders.py)
FORWARD = "forward"
BACKWARD = "backward"  # DDP's all-reduce overlaps it
OPTIMIZER = "optimizer"
LOOP_PHASES = (DATA, FORWARD, BACKWARD, OPTIMIZER)  # the loop's own timers (metrics' phase_s)
PHASES = (DATA, H2D, FORWARD, BACKWARD, OPTIMIZER)  # what the profile report splits a batch into
DATA_GPU = "data_gpu"  # the report's name for the input pipeline's own GPU work (no range of ours)

# Outside the training batches.
VALIDATE = "validate"
TEST = "test"
CHECKPOINT = "checkpoint"
OUTSIDE_TRAINING = (VALIDATE, TEST, CHECKPOINT)

# DDP: one start/end range per gradient bucket (handler/DDP/comm_hook.py).
ALLREDUCE = Numbered("allreduce b{}")

# pp (handler/PP/schedule.py): a stage's work per micro-batch, and its waits for a neighbour.
FWD_MB = Numbered("fwd mb{}")
BWD_MB = Numbered("bwd mb{}")
PP_WORK = (FWD_MB, BWD_MB)
SEND = "send"
RECV = "recv"
PP_WAIT = (SEND, RECV)

# Marks (instants), emitted by every rank at start-up and again inside the capture window.
RANK = Numbered("rank {}")
HOST = Numbered("host {}", r"\S+")

# The range nsys' capture window follows (scripts/nsys_options.sh --nvtx-capture), opened and
# closed by handler/train/capture.py.
CAPTURE = "harness_capture"
