"""--mode pp: one slice of the model per process, micro-batches through a GPipe or 1F1B schedule."""
from ..DDP.mode import launch
from ..train.mode import Mode
from .options import PipelineOptions, check_options


def strategy(cfg):
    from .strategy import pipeline_strategy
    return pipeline_strategy(cfg)


MODE = Mode(run=launch(strategy), options=(PipelineOptions,), check=check_options, whole_batch=True)
