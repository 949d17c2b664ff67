"""The profile summary JSON (`<name>.summary.json`) as every reader reads it: the what-if, the lab
page, compare and merge parse it here once (record/parse.py) and then read typed fields only. The
report writes through these models too, so docs/summary.schema.json, generated from them
(`python -m handler.profiling.record --schema`), is the contract the code keeps. A field a reader
needs is declared here first; fields not declared are kept as written and read by no reader."""
from pydantic import Field

from .kinds import (AnyNumberOrNull, BubbleOrNull, BusyShareOrNull, Count, CountOrNull, Devices, ModeOrNull, MsOrNull,
                    EpochOrNull, Number, NumberOrNull, Positive, PositiveOrNull, Record, ShareOrNull, SizeOrNull, Text,
                    TextOrNull, Time, TimeOrNull, Workers)


class Loop(Record):
    """Per rank, over its complete epochs (analysis.loop_stats): what the what-if splits."""
    epochs_s: Time
    """Seconds of the complete epochs, summed."""
    epochs: Count
    """How many complete epochs (0: the run stopped inside its first)."""
    steps: Count
    """Training steps inside them."""
    steps_per_epoch: NumberOrNull = None
    """steps over epochs."""
    step_mean_ms: MsOrNull
    """Epoch time over steps."""
    inside_steps_ms: MsOrNull
    """Per step, the time inside the step ranges."""
    between_steps_ms: MsOrNull
    """Per step, the time between the step ranges (a loop that fetches its batch there waits for data there)."""
    between_steps_data_ms: MsOrNull = None
    """Of it, per step, the time inside `data` ranges (a loop that marks its fetch between its steps, as PyTorch's
    MNIST example's `Data loading`)."""
    phase_ms: dict[str, MsOrNull]
    """ms per step of each phase (data, h2d, forward, backward, optimizer): its own time, nested phases left out."""


class Epoch(Record):
    """One epoch range."""
    epoch: Count
    """The epoch's number (`epoch N`), which the measured epoch names (scaling/epochs.py)."""
    time_s: Time
    """The epoch's length."""


class Comm(Record):
    """The rank's gradient communication inside batches (comm.py)."""
    seconds: TimeOrNull = None
    """All-reduce seconds (NCCL kernels on GPU, allreduce ranges on CPU)."""
    exposed_s: TimeOrNull = None
    """The part no compute overlapped."""
    buckets: CountOrNull = None
    """Distinct gradient buckets."""
    source: Text = ""
    """What was measured: `nccl kernels` or `allreduce ranges`."""


class Pipeline(Record):
    """pp only: this stage's pipeline numbers (bubble.py)."""
    stage: Count = 0
    """The stage's index."""
    theoretical_bubble_share: BubbleOrNull = None
    """(W-1)/(M+W-1) for W stages and M micro-batches."""
    microbatches: PositiveOrNull = None
    """The micro-batches the report's `fwd mb{j}` ranges counted (at any stage count, one included)."""
    span_s: TimeOrNull = None
    """The stage's pipeline span over the batches."""


class Stat(Record):
    """One GPU metric's statistics inside the epochs."""
    mean: AnyNumberOrNull
    """Mean over the samples."""
    p95: AnyNumberOrNull = None
    """95th percentile (from a histogram: docs/PROFILING.md, "GPU metrics")."""
    samples: CountOrNull = None
    """How many samples."""


class PcieOverlap(Record):
    """Of the instants inside the epochs when a GPU's PCIe TX was busy, those when RX was busy too (gpu_metrics/joint.py)."""
    tx_busy_samples: Count
    """Instants with TX busy."""
    both_busy_samples: Count
    """Of those, the instants with RX busy too."""
    share: ShareOrNull = None
    """both over tx; null when TX was never busy."""
    busy_at: Text = ""
    """The threshold that counts as busy."""


class Rank(Record):
    """One training process."""
    rank: Count = 0
    """The rank (its `rank N` mark, else pid order)."""
    host: TextOrNull = None
    """The rank's host: its `host NAME` mark, else the export's `Hostname`, else the metrics' env.hosts (a merge: else
    the node in the report's file name)."""
    host_from: TextOrNull = None
    """Which of those named it, or why none did."""
    pid: CountOrNull = None
    """The process id in the report."""
    loop: Loop
    epochs: list[Epoch] = []
    """Each epoch range."""
    comm: Comm | None = None
    """null without any communication."""
    pipeline: Pipeline | None = None
    """null for modes other than pp."""
    gpu_metrics: dict[str, dict[str, Stat]] | None = None
    """GPU metrics inside the epochs, by nsys' GPU id: {key: {mean, p95}}; null without GPU metrics."""
    gpu_metrics_phases: dict[str, dict[str, dict[str, Stat]]] | None = None
    """GPU metrics per phase (each phase, `other`, `comm`), by nsys' GPU id; null without GPU metrics."""
    pcie_overlap: dict[str, PcieOverlap] | None = None
    """By nsys' GPU id; null without GPU metrics of both PCIe directions."""


class Overall(Record):
    """All ranks pooled (analysis._overall)."""
    epoch_mean_s: TimeOrNull
    """The first rank's mean epoch; null where no epoch completed."""
    phase_shares: dict[str, ShareOrNull] = {}
    """Each phase's share of summed batch time (compare's phase bars on CPU)."""
    gpu_phase_shares: dict[str, ShareOrNull] | None = None
    """GPU runs: each phase's GPU time over the GPUs' training time; null on CPU."""
    gpu_data_stall_share: ShareOrNull = None
    """GPU idle while the training thread waits for data, over the GPUs' training time."""


class Copies(Record):
    """One kind of memcpy on a GPU inside the epochs."""
    count: Count
    """How many copies."""
    mb: Number
    """Their megabytes."""
    seconds: Time
    """Their summed duration."""


class Gpu(Record):
    """One CUDA device that ran kernels, over the epochs of the ranks that used it (devices.py)."""
    device: Count = 0
    """The CUDA device number."""
    host: TextOrNull = None
    """A job's: the host of the node whose report holds the GPU."""
    kernel_busy_share: BusyShareOrNull
    """The union of its kernels over the epochs' length."""
    compute_busy_share: BusyShareOrNull
    """The same without NCCL kernels: the what-if's GPU busy time."""
    epochs_s: Time
    """The epochs' length on this GPU."""
    nccl_kernel_s: Time
    """NCCL kernels starting inside the epochs: a measured link's time."""
    peak_memory_mb: SizeOrNull = None
    """The peak of its allocated device memory (--cuda-memory-usage); null: not recorded."""
    memcpy: dict[str, Copies] = {}
    """memcpy inside the epochs, by kind (h2d, d2h, d2d, ...)."""
    metrics: dict[str, AnyNumberOrNull] | None = None
    """GPU metrics inside the epochs: {key: mean}; null without GPU metrics."""


class CommConfig(Record):
    """The run's gradient hook and DDP buckets (analysis.comm_config)."""
    hook: TextOrNull = None
    """The --comm-hook."""
    bucket_cap_mb: SizeOrNull = None
    """The --bucket-cap-mb."""
    powersgd_rank: PositiveOrNull = None
    """PowerSGD's rank; null for other hooks."""


class Incomplete(Record):
    """A run cut short: where it ended."""
    epoch: Count
    """The epoch left open."""
    complete_epochs: Count
    """The epochs every rank kept."""
    line: Text = ""
    """The sentence pages print."""


class Machine(Record):
    """The machine the report ran on (scaling/machine.py), each fact with its `_from`."""
    cpu_cores: PositiveOrNull = None
    """The HOST's cores: nsys' CpuCores, else the metrics' env.cpu_cores, else env.cpu_count."""
    cpu_cores_from: Text = "not recorded"
    """Where cpu_cores came from."""
    rank_cores: PositiveOrNull = None
    """The cores the ranks could run on (the metrics' env.cpu_cores: the CPU affinity); readers use it where
    recorded, else cpu_cores."""
    rank_cores_from: Text = "not recorded"
    """Where rank_cores came from, or `not recorded ...`."""
    loader_workers: Workers = None
    """Loader workers per training process (0: the loader runs in the rank)."""
    loader_workers_from: Text = "not recorded"
    """Where loader_workers came from."""
    threads_per_rank: PositiveOrNull = None
    """The metrics' env.torch_threads."""
    threads_per_rank_from: Text = "not recorded"
    """Where threads_per_rank came from."""
    loader_cpu_ms: MsOrNull = None
    """Per step per rank: CPU time of the rank's loader (DataLoader workers, DALI CPU threads)."""
    rank_cpu_ms: MsOrNull = None
    """Per step per rank: CPU time of the rank process's own threads less the loader's."""
    cpu_time_from: Text = "not recorded"
    """Where loader_cpu_ms and rank_cpu_ms came from, or `not recorded` / `assumed: ...`."""


class Run(Record):
    """The run's own facts (scaling/run_facts.py), each with where it came from: the metrics JSON, then the
    report, then its file name."""
    mode: ModeOrNull
    """The harness's mode."""
    mode_from: Text
    """`metrics config.mode`, `report: ...`, `file name NAME ...` or `not recorded ...`."""
    model: TextOrNull = None
    """The metrics' config.model."""
    model_from: Text = "not recorded"
    """Where model came from."""
    grad_mb: SizeOrNull = None
    """MB of fp32 gradients a step all-reduces: the metrics' model.grad_mb, else whatif.GRAD_MB by model name."""
    grad_mb_from: Text = "not recorded"
    """Where grad_mb came from."""
    nodes: Positive
    """The job's nodes: distinct hosts of its ranks, the metrics' env.nodes where more (one node's report of a
    bigger job)."""
    gpus_per_node: Devices
    """GPUs that ran kernels, the most on any node; 0: no GPU ran."""
    processes: Positive
    """The ranks of the job (the metrics' world size where this report holds fewer: one node's of a job)."""
    nodes_from: Text = "report: the ranks' hosts"
    """Where nodes, gpus_per_node and processes came from."""
    pp_stages: PositiveOrNull = None
    """pp only: the stages (ranks with pp ranges)."""
    pp_microbatches: PositiveOrNull = None
    """pp only: the metrics' config.microbatches, else counted from the report's `fwd mb{j}` ranges."""
    pp_from: TextOrNull = None
    """Where pp's numbers came from; null for other modes."""


class MeasuredEpoch(Record):
    """The run's one epoch time (scaling/epochs.py)."""
    s: EpochOrNull = None
    """The epoch time."""
    epochs: list[Count] = []
    """The epoch numbers used."""
    spread: Number = 0.0
    """(max - min) / median over the epochs used."""
    noisy: bool = False
    """spread above the stated share."""
    rule: Text = ""
    """One sentence saying how s was found."""


class OutsideEpoch(Record):
    """An epoch the run trained that the report does not hold (report.capture_window)."""
    epoch: Count
    """Its number."""
    metrics_s: TimeOrNull = None
    """Its time in the metrics JSON."""


class CaptureWindow(Record):
    """The epochs the report covers (a capture window may leave some out), and how many the run trained."""
    epochs: list[Count] = []
    """The epochs the report holds."""
    run_epochs: CountOrNull = None
    """The epochs the run trained (the metrics JSON's); null without metrics."""
    outside: list[OutsideEpoch] = []
    """The metrics' epochs the report does not hold."""


class Unplaced(Record):
    """The GPU-metric values the report read and where those it could not place went (gpu_metrics.summary.unplaced)."""
    layout: Text
    """GPU_METRICS (nsys 2023 on) or GENERIC_EVENTS (nsys 2022.x)."""
    values: Count
    """Values read."""
    placed: Count
    """Of those, placed on a rank's GPU inside its epochs."""
    unknown_source: Count = 0
    """Values of a metric no table of the export names."""
    unused_gpu: Count = 0
    """Values of GPUs no rank used."""
    outside_epochs: Count = 0
    """Values of the ranks' GPUs outside every epoch."""
    not_reported: list[Text] = []
    """Metrics sampled but not reported (NVLink, clocks)."""
    lines: list[Text] = []
    """One line per kind of value left out, as the pages print them."""


class Summary(Record):
    """A profile summary: one report's (analysis.summarize) or a job's (merge.merge)."""
    ranks: list[Rank] = Field(min_length=1)
    """One entry per training process."""
    overall: Overall
    gpus: list[Gpu] | None = None
    """One entry per CUDA device that ran kernels; null on a CPU run."""
    model: TextOrNull = None
    """The run's model (the metrics' config.model); null without metrics."""
    comm_config: CommConfig | None = None
    """null without metrics."""
    incomplete: Incomplete | None = None
    """null for a run that closed every range."""
    report: str | list[str] | None = None
    """The report summarised (a job: its reports); the mode's last source, from its file or folder name."""
    run_mode: TextOrNull = None
    """The lab page's row mode (the kit's folder name, or compare's label)."""
    machine: Machine | None = None
    """null or absent: nothing read."""
    run: Run | None = None
    """Absent in a summary older than it: the readers then read the report's shape."""
    measured_epoch: MeasuredEpoch | None = None
    """The run's one epoch time (scaling/epochs.py): every page's."""
    capture_window: CaptureWindow | None = None
    """Which epochs the report holds; the measured epoch leaves the warm-up out only where it was captured."""
    convention: TextOrNull = None
    """The NVTX naming convention the report's ranges were read by (conventions.py)."""
    gpu_metrics_unplaced: Unplaced | None = None
    """null without GPU metrics."""
    gpu_metrics_unread: TextOrNull = None
    """Why the GPU-metric rows the export holds were not read (no table naming them, no sampler's source, no
    metric the report reads); null where it holds none or they were read."""
