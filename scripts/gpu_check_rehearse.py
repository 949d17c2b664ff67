"""--rehearse: the plan a 2-GPU machine gets, run through the same code on this CPU
(docs/GPU_CHECK.md "Rehearsal"). Every check has an entry below saying what a CPU runs
instead of what only a GPU can show; the report row shows it. A check without an entry stops
the rehearsal, so a new check cannot pass here untranslated.
"""
from dataclasses import dataclass, replace
from typing import Dict, List

from scripts.gpu_check_plan import REHEARSAL, Check, Expect


@dataclass(frozen=True)
class Translation:
    note: str  # shown in the check's report row
    skip: bool = False  # the note says why a CPU cannot run it at all
    collect_only: bool = False  # pytest: collect (the tests import, their ids exist), run none


ONE_PROCESS = "one CPU process instead of one GPU"
GLOO = "one CPU rank over gloo: NCCL needs CUDA (expects backend gloo)"
CPU_RANKS = "2 CPU ranks over gloo instead of 2 GPUs over NCCL"
DP_ONE_DEVICE = ("DataParallel splits a batch over GPUs only; on a CPU it is one device, "
                 "which the 1-GPU dp rows run")
DALI_CPU = "DALI's CPU pipeline instead of its GPU one"

TRANSLATIONS: Dict[str, Translation] = {
    "gpu-marked tests": Translation("they need CUDA: collected (they import, their ids exist), not run",
                                    collect_only=True),
    "dp": Translation(ONE_PROCESS),
    "dp --dp-balanced": Translation(ONE_PROCESS),
    "ddp": Translation(GLOO),
    "ddp_dali memory": Translation(DALI_CPU),
    "ddp_dali raw": Translation(DALI_CPU),
    "ddp_dali jpeg": Translation("DALI decodes JPEG on the CPU (device=cpu) instead of nvJPEG's `mixed`"),
    "ddp_dali files (PNG tree; mixed decode)": Translation("DALI decodes the PNG tree on the CPU (device=cpu) "
                                                           "instead of `mixed`"),
    "fsdp": Translation("FSDP on one CPU rank over gloo"),
    "pp (1 stage)": Translation(GLOO),
    "bf16": Translation("CPU bf16 autocast instead of CUDA's"),
    "fp16 (GradScaler)": Translation("fp16 autocast with GradScaler needs a GPU: train_cifar.py refuses it "
                                     "on a CPU", skip=True),
    "channels_last": Translation("NHWC on the CPU"),
    "accumulation x2": Translation(GLOO),
    "activation checkpointing": Translation(GLOO),
    "--resume continues": Translation(GLOO),
    "pp --resume continues": Translation(GLOO),
    "SIGTERM stop, then --resume": Translation(
        f"{REHEARSAL.big_train:,} images instead of 50,000; SIGTERM {REHEARSAL.sigterm_delay_s} s into epoch 1"),
    "profiled run (nsys)": Translation("a CPU run has no CUDA activity: the profile's GPU trace is not required"),
    "2 GPUs: dp splits the batch": Translation(DP_ONE_DEVICE, skip=True),
    "2 GPUs: dp --dp-balanced": Translation(DP_ONE_DEVICE, skip=True),
    "2 GPUs: dp bf16 + activation checkpointing": Translation(DP_ONE_DEVICE, skip=True),
    "2 GPUs: ddp over NCCL": Translation(CPU_RANKS + " (expects backend gloo)"),
    "2 GPUs: ddp --sync-bn": Translation("SyncBatchNorm runs on CUDA only: torch refuses CPU tensors", skip=True),
    "2 GPUs: ddp_dali jpeg": Translation("2 CPU ranks, DALI decoding JPEG on the CPU"),
    "2 GPUs: ddp_dali files (PNG tree; mixed decode)": Translation("2 CPU ranks, DALI decoding the PNG tree on "
                                                                   "the CPU"),
    "2 GPUs: lab-style driver: ddp over NCCL": Translation(CPU_RANKS + " (expects backend gloo)"),
    "2 GPUs: lab-style driver: ddp_dali over NCCL": Translation(CPU_RANKS + ", DALI's CPU pipelines (expects backend "
                                                             "gloo)"),
    "2 GPUs: fsdp": Translation(CPU_RANKS),
    "2 GPUs: pp, 2 stages over NCCL": Translation(CPU_RANKS + ": send/recv over gloo (expects backend gloo)"),
    "2 GPUs: pp --resume (gathered checkpoint)": Translation(CPU_RANKS),
    "2 GPUs: a SIGSTOPped rank is named": Translation("a gpus(2) test: collected (it is in this checkout), "
                                                      "not run", collect_only=True),
}

# What a GPU run's metrics show, and what the same run shows on a CPU.
EXPECT_ON_CPU: Dict[tuple, tuple] = {("env.backend", "nccl"): ("env.backend", "gloo")}


def translate(check: Check) -> Check:
    """The check as this CPU runs it, its note saying how; KeyError for a check without an entry."""
    if check.name not in TRANSLATIONS:
        raise KeyError(f"gpu_check --rehearse: the check {check.name!r} has no entry in "
                       "scripts/gpu_check_rehearse.py TRANSLATIONS; add what a CPU runs instead")
    how = TRANSLATIONS[check.name]
    if how.skip:
        return replace(check, skip=check.skip or f"GPU only: {how.note}", note=how.note)
    expect: Expect = tuple(EXPECT_ON_CPU.get(pair, pair) for pair in check.expect)
    args = (*check.args, "--collect-only") if how.collect_only else check.args
    return replace(check, args=args, expect=expect, note=how.note)


def rehearse(checks: List[Check]) -> List[Check]:
    return [translate(c) for c in checks]
