"""The run's metrics JSON (docs/METRICS.md) as the report reads it: every field a summary takes from
it, with its kind and range, so an odd one is named as the metrics' own, with its path, when the
summary is written (record/parse.py), never carried into a summary that breaks its own contract.
Every field may be missing (a run older than it); the ones the report does not read are kept free."""
from typing import Annotated

from pydantic import Field

from .kinds import (Count, CountOrNull, Number, NumberOrNull, PositiveOrNull, Record, SizeOrNull, Text,
                    TextOrNull, Time, TimeOrNull)

Rate = NumberOrNull


class Config(Record):
    """Every resolved option of the run; the ones a summary reads."""
    mode: TextOrNull = None
    model: TextOrNull = None
    workers: Annotated[Annotated[int, Field(ge=0, le=4096)] | Annotated[float, Field(ge=0, le=4096)] | None,
                       Field(title="a number of workers from 0 to 4096, or null")] = None
    """Loader workers per process (a whole number stays one: compare's recipe prints it)."""
    num_gpu: CountOrNull = None
    world_size: PositiveOrNull = None
    microbatches: PositiveOrNull = None
    """pp's --microbatches."""
    comm_hook: TextOrNull = None
    bucket_cap_mb: SizeOrNull = None
    powersgd_rank: PositiveOrNull = None


class Env(Record):
    """What the run ran on."""
    mode: TextOrNull = None
    world_size: PositiveOrNull = None
    hosts: dict[str, Text] | None = None
    """rank -> its hostname."""
    nodes: PositiveOrNull = None
    """Distinct hosts of the ranks."""
    cpu_cores: PositiveOrNull = None
    """The cores the ranks may run on (their affinity)."""
    cpu_count: PositiveOrNull = None
    """The machine's cores."""
    torch_threads: PositiveOrNull = None
    dataset: TextOrNull = None
    profiled_epochs: list[Count] | None = None


class ModelSize(Record):
    """What the run's own model holds."""
    trainable_params: CountOrNull = None
    grad_mb: SizeOrNull = None
    """MB of fp32 gradients a step all-reduces."""


class CpuTime(Record):
    """An epoch's CPU time per step and rank (handler/data/cpu_time.py)."""
    rank_ms_per_step: Number
    loader_ms_per_step: Number
    steps: CountOrNull = None
    ranks: CountOrNull = None
    from_: TextOrNull = Field(None, alias="from")


class MetricsEpoch(Record):
    """One epoch as rank 0 timed it."""
    epoch: CountOrNull = None
    time_s: TimeOrNull = None
    """The synchronised wall time of the epoch's training batches."""
    images_per_s: Rate = None
    data_wait_s: TimeOrNull = None
    phase_s: dict[str, Time] | None = None
    """rank 0's seconds per phase from the loop's own timers."""
    cpu_time: CpuTime | None = None


class Scores(Record):
    """The test set's numbers."""
    acc: NumberOrNull = None


class Metrics(Record):
    """A metrics JSON train_cifar.py writes (`<name>.metrics.json`)."""
    config: Config = Config()
    env: Env = Env()
    model: ModelSize | None = None
    epochs: list[MetricsEpoch] = []
    test: Scores | None = None
