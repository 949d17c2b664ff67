"""Worker functions for the pp tests (importable by spawn): real gloo groups, tiny models."""
import os

import torch
import torch.distributed

from handler.train.loop import Step, _optimise
from handler.DDP.utils import destroy_process, initialize_group
from handler.PP.checkpoint import PipelineState
from handler.PP.schedule import model_to_pipeline
from handler.PP.step import pipeline_step
from models import MODELS
from models.resnet import ResNet
from tests.dist_workers import fixed_batches

STEPS, BATCH = 3, 16


def tiny_resnet(num_classes=10):
    """Two ResNet stages with BatchNorm, small enough for a test: three equal blocks at
    32x32 then one at 16x16, so the time split cuts inside the first model stage (after
    block 1 or 2) and the parameter split between the two."""
    torch.manual_seed(0)
    return ResNet((16, 16), (3, 1), num_classes, shortcut="A")


MODELS.setdefault("pp_tiny", tiny_resnet)  # PipelineState finds the whole model's layout by name


def run_steps(model, params, batches, accum_steps=1, optimise=None):
    """The harness's own step (the loop's, or pp's) over the given (images, labels) batches."""
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True)
    step = Step(model=model, optimizer=optimizer,
                scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0),
                scaler=torch.amp.GradScaler("cpu", enabled=False),
                autocast=lambda: torch.autocast("cpu", enabled=False), accum_steps=accum_steps,
                optimise=optimise)
    sums = [(optimise or _optimise)(step, x, y) for x, y in batches]
    return optimizer, sums


def accumulation_result(microbatches):
    """One process with --accum-steps M on the same batches: (state_dict, optimizer state, per-step sums)."""
    model = tiny_resnet()
    optimizer, sums = run_steps(model, model.parameters(), fixed_batches(STEPS, BATCH), accum_steps=microbatches)
    return model.state_dict(), optimizer.state_dict(), sums


class _Config:
    """The fields PipelineState reads."""

    def __init__(self, rank, world):
        self.model, self.rank, self.world_size, self.is_main = "pp_tiny", rank, world, rank == 0


def pp_worker(proc_id, world, port, microbatches, runs, out_dir):
    """For each (schedule, split), train the tiny model from the same start as a W-stage
    pipeline with the pp step; rank 0 saves the gathered whole-model state, the
    all-reduced per-step sums and the split as pp-<schedule>-<split>.pt."""
    me = initialize_group(proc_id, "127.0.0.1", port, world, use_cuda=False, timeout_s=60)
    try:
        for schedule, split in runs:
            raw = tiny_resnet()
            pipe = model_to_pipeline(raw, microbatches=microbatches, schedule=schedule, batch_size=BATCH,
                                     amp="off", split=split, verbose=False)
            batches = [(x if pipe.first else torch.empty(0, 3, 32, 32),
                        y if pipe.last else torch.empty(0, dtype=torch.long)) for x, y in fixed_batches(STEPS, BATCH)]
            optimizer, sums = run_steps(pipe, raw.parameters(), batches, optimise=pipeline_step)
            sums = torch.stack(sums)
            torch.distributed.all_reduce(sums)
            state = PipelineState().capture(_Config(me.rank, world), raw, optimizer, tag="test")
            if me.rank == 0:
                torch.save({**state, "sums": sums, "split": pipe.split},
                           os.path.join(out_dir, f"pp-{schedule}-{split}.pt"))
        torch.distributed.barrier()
    finally:
        destroy_process()
