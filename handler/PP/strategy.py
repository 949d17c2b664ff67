"""--mode pp as a Strategy for the shared loop: its wrap, loaders, step, evaluation, state."""
import os
from functools import partial

from ..train.strategy import Strategy
from .checkpoint import PipelineState
from .loader import get_PP_loader
from .options import PipelineOptions
from .schedule import model_to_pipeline, require_pipelining
from .step import evaluate_pipeline, pipeline_step
from .timing import CACHE_NAME


def split_record(pipe) -> dict:
    """What the metrics' env records of the run: the split its pipeline uses."""
    return {"pp_split": pipe.split}


def pipeline_strategy(cfg) -> Strategy:
    require_pipelining()
    pp = PipelineOptions.of(cfg)
    wrap = partial(model_to_pipeline, microbatches=pp.microbatches, schedule=pp.pp_schedule,
                   batch_size=cfg.batch_size, amp=cfg.amp, channels_last=cfg.channels_last, split=pp.pp_split,
                   model_name=cfg.model, cache=os.path.join(cfg.ckpt, CACHE_NAME))
    return Strategy(wrap=wrap, make_loaders=get_PP_loader, state=PipelineState(),
                    step=pipeline_step, evaluate=evaluate_pipeline, record=split_record)
