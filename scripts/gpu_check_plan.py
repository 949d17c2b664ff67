"""What scripts/gpu_check.py runs: the checks for a machine, their sizes, their time
estimates, and the choice of a part of them (--only, --part). docs/GPU_CHECK.md.

pp at 1 GPU runs one stage: NCCL refuses two ranks on one device ("Duplicate GPU detected"),
so its send/recv between stages, and the checkpoint gathered from two, are the 2-GPU pass's.
"""
import fnmatch
from dataclasses import dataclass, replace
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from handler.DALI.options import ARRAY_SOURCES as DALI_SOURCES  # every --dali-source but files (a PNG tree) gets a check

Expect = Tuple[Tuple[str, object], ...]  # (metrics path "env.backend", value) pairs

ONE_GPU_MODES_TEST = "test_every_mode_trains_end_to_end_on_one_gpu"  # tests/machine/test_gpu.py
SIGSTOP_TEST = "test_sigstopped_rank_is_named_on_nccl"  # a gpus(2) test in tests/machine/
# pytest selects markers by name: tests marked only gpus(2) are not `gpu` to -m.
GPU_TESTS = "gpu or gpus"


@dataclass(frozen=True)
class Scale:
    """The sizes of every run: CIFAR-sized synthetic data, few enough images that an epoch
    takes seconds on a GPU; the rehearsal's are tiny, for a CPU."""
    device: str
    model: str
    batch: int
    workers: int
    train: int
    test: int
    valid: int
    big_train: int  # the SIGTERM run: long enough that the signal lands inside epoch 1
    sigterm_delay_s: float  # after epoch 0's checkpoint, before the SIGTERM
    timeout_s: float  # one launch

    def data_args(self) -> List[str]:
        return ["--dataset", "synthetic", "--synthetic-test", str(self.test), "--valid-size", str(self.valid),
                "--model", self.model, "--batch-size", str(self.batch), "--workers", str(self.workers),
                "--no-progress"]


GPU = Scale("cuda", "resnet18", 256, 4, 2_560, 1_000, 256, 50_000, 1.0, 240)
REHEARSAL = Scale("cpu", "resnet20", 16, 1, 64, 32, 16, 1_600, 0.5, 120)


@dataclass(frozen=True)
class Check:
    name: str
    kind: str  # train | tree (train on a PNG tree made on the fly) | driver (scripts/kit_driver.py) | resume | sigterm | profile | pytest
    args: Tuple[str, ...] = ()  # train_cifar.py arguments beyond the data set-up, or pytest's
    gpus: int = 1
    skip: str = ""  # why it cannot run here ("" = it runs)
    expect: Expect = ()
    note: str = ""  # how the rehearsal translated it (docs/GPU_CHECK.md "Rehearsal")


def train(name: str, *args: str, gpus: int = 1, skip: str = "", **expect: object) -> Check:
    return Check(name, "train", ("--num_gpu", str(gpus), *args), gpus, skip,
                 tuple((k.replace("__", "."), v) for k, v in expect.items()))


def tree(name: str, *args: str, gpus: int = 1, skip: str = "", **expect: object) -> Check:
    """ddp_dali on the kit's PNG tree (--dali-source files: on a GPU, DALI decodes it with
    `mixed`), the path the lab runs by default; gpu_check writes a small tree first."""
    return replace(train(name, "--mode", "ddp_dali", "--dali-source", "files", *args, gpus=gpus, skip=skip,
                         config__dali_source="files", **expect), kind="tree")


def driver(mode: str, skip: str = "") -> Check:
    """The lab's functions called as the kit's train_cifar.py calls them, on 2 GPUs over NCCL."""
    return Check(f"2 GPUs: lab-style driver: {mode} over NCCL", "driver", ("--mode", mode, "--num_gpu", "2"), 2, skip,
                 (("env.backend", "nccl"),))


def plan(gpus: int, *, dali: bool, nsys: bool, pytest_ok: bool, tests: bool = True, bf16: bool = True) -> List[Check]:
    """The checks for a machine with `gpus` visible GPUs; what cannot run carries its reason."""
    no_dali = "" if dali else "NVIDIA DALI is not installed"
    no_bf16 = "" if bf16 else "this GPU has no native bf16 (compute capability below 8.0; handler/runtime/precision/gpu.py)"
    no_pytest = "" if pytest_ok else "pytest is not installed"
    checks = [Check("gpu-marked tests", "pytest", ("-m", GPU_TESTS, "tests", "-k",
                                                   f"not {ONE_GPU_MODES_TEST} and not {SIGSTOP_TEST}"),
                    skip=no_pytest)] if tests else []
    checks += [
        train("dp", "--mode", "dp"),
        train("dp --dp-balanced", "--mode", "dp", "--dp-balanced"),
        train("ddp", "--mode", "ddp", env__backend="nccl"),
        *(train(f"ddp_dali {src}", "--mode", "ddp_dali", "--dali-source", src, skip=no_dali,
                config__dali_source=src) for src in DALI_SOURCES),
        tree("ddp_dali files (PNG tree; mixed decode)", skip=no_dali),
        train("fsdp", "--mode", "fsdp"),
        # One stage: NCCL refuses two ranks on one GPU, so send/recv between stages is the 2-GPU pass's.
        train("pp (1 stage)", "--mode", "pp", env__backend="nccl"),
        train("bf16", "--mode", "ddp", "--amp", "bf16", skip=no_bf16, config__amp="bf16"),
        train("fp16 (GradScaler)", "--mode", "ddp", "--amp", "fp16", config__amp="fp16"),
        train("channels_last", "--mode", "ddp", "--channels-last"),
        train("accumulation x2", "--mode", "ddp", "--accum-steps", "2"),
        train("activation checkpointing", "--mode", "ddp", "--activation-checkpointing"),
        Check("--resume continues", "resume", ("--mode", "ddp", "--num_gpu", "1")),
        Check("pp --resume continues", "resume", ("--num_gpu", "1", "--mode", "pp")),
        Check("SIGTERM stop, then --resume", "sigterm", ("--mode", "ddp", "--num_gpu", "1")),
        Check("profiled run (nsys)", "profile", ("--mode", "ddp",),
              skip="" if nsys else "nsys is not on PATH (scripts/install_nsys.sh)"),
    ]
    if gpus >= 2:
        checks += two_gpu_pass(no_dali, no_pytest, "bf16" if bf16 else "fp16", tests)
    return checks


def two_gpu_pass(no_dali: str, no_pytest: str, amp: str, tests: bool) -> List[Check]:
    sigstop = [Check("2 GPUs: a SIGSTOPped rank is named", "pytest",
                     ("tests/machine", "-m", GPU_TESTS, "-k", SIGSTOP_TEST), gpus=2, skip=no_pytest)] if tests else []
    return [
        train("2 GPUs: dp splits the batch", "--mode", "dp", gpus=2),
        train("2 GPUs: dp --dp-balanced", "--mode", "dp", "--dp-balanced", gpus=2),
        train(f"2 GPUs: dp {amp} + activation checkpointing", "--mode", "dp", "--amp", amp,
              "--activation-checkpointing", gpus=2),
        train("2 GPUs: ddp over NCCL", "--mode", "ddp", gpus=2, env__backend="nccl", env__world_size=2),
        train("2 GPUs: ddp --sync-bn", "--mode", "ddp", "--sync-bn", gpus=2, config__sync_bn=True),
        train("2 GPUs: ddp_dali jpeg", "--mode", "ddp_dali", "--dali-source", "jpeg", gpus=2,
              skip=no_dali, env__world_size=2),
        tree("2 GPUs: ddp_dali files (PNG tree; mixed decode)", gpus=2, skip=no_dali, env__world_size=2),
        driver("ddp"),
        driver("ddp_dali", skip=no_dali),
        train("2 GPUs: fsdp", "--mode", "fsdp", gpus=2, env__world_size=2),
        train("2 GPUs: pp, 2 stages over NCCL", "--mode", "pp", gpus=2, env__backend="nccl", env__world_size=2),
        Check("2 GPUs: pp --resume (gathered checkpoint)", "resume", ("--num_gpu", "2", "--mode", "pp"), gpus=2),
        *sigstop,
    ]


# Seconds each check is expected to take before a run has measured it, read from the code
# (launches x start-up + the epoch): docs/GPU_CHECK.md "Estimates". A run's gpu_check.json
# records each check's seconds, and the next run in the same --out uses them instead. On an H100 one launch costs about 8 s
# of start-up (torch import, CUDA context, NCCL set-up) plus a 2,560-image epoch; on a CPU
# (the rehearsal) about 5 s with tiny data, measured on 2 cores.
LAUNCHES: Dict[str, int] = {"train": 1, "tree": 1, "driver": 1, "resume": 2, "sigterm": 2, "profile": 1, "pytest": 1}
LAUNCH_S: Dict[str, float] = {"cuda": 14, "cpu": 5}
ESTIMATE_BY_NAME_S: Dict[str, Dict[str, float]] = {
    "cuda": {"gpu-marked tests": 240, "2 GPUs: a SIGSTOPped rank is named": 40,
             "SIGTERM stop, then --resume": 60, "profiled run (nsys)": 60},
    "cpu": {"gpu-marked tests": 15, "2 GPUs: a SIGSTOPped rank is named": 10,
            "SIGTERM stop, then --resume": 14, "profiled run (nsys)": 30},
}


def estimate_s(check: Check, scale: Scale = GPU, measured: Optional[Mapping[str, float]] = None) -> float:
    """The estimate of one check at this scale: its seconds in the last run that measured it
    (`measured`, by check name), else the table below; 0 for one that is skipped."""
    if check.skip:
        return 0.0
    if measured and check.name in measured:
        return measured[check.name]
    by_name = ESTIMATE_BY_NAME_S[scale.device]
    if check.name in by_name:
        return by_name[check.name]
    return LAUNCHES[check.kind] * LAUNCH_S[scale.device] * (1.2 if check.gpus > 1 else 1.0)


def select(checks: Sequence[Check], only: Sequence[str] = (), part: Tuple[int, int] = (1, 1),
           scale: Scale = GPU, measured: Optional[Mapping[str, float]] = None) -> List[Check]:
    """The checks named by --only (shell patterns; each must match one), then part K of N:
    consecutive checks, cut where the estimates at this scale (measured ones first) add up to
    about 1/N each."""
    if only:
        unmatched = [p for p in only if not any(fnmatch.fnmatchcase(c.name, p) for c in checks)]
        if unmatched:
            raise ValueError(f"--only {', '.join(unmatched)}: no such check; `--list` names them")
        checks = [c for c in checks if any(fnmatch.fnmatchcase(c.name, p) for p in only)]
    k, n = part
    if not checks:
        return []
    costs = [estimate_s(c, scale, measured) or 1.0 for c in checks]  # a skipped check still has a part
    total, before, chosen = sum(costs), 0.0, []
    for check, cost in zip(checks, costs):
        if min(n - 1, int((before + cost / 2) / total * n)) == k - 1:
            chosen.append(check)
        before += cost
    return chosen


def parse_part(text: str) -> Tuple[int, int]:
    """"K/N" with 1 <= K <= N."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--part {text}: write it K/N, e.g. --part 1/2") from None
    if not 1 <= k <= n:
        raise ValueError(f"--part {text}: K must be 1..N, e.g. --part 1/{max(n, 2)}")
    return k, n

