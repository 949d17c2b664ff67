"""The compute modes of the GPUs a run uses, and what they mean for its mode.

nvidia-smi lists every GPU, numbered in PCI order, whatever CUDA_VISIBLE_DEVICES says; a run
numbers the GPUs it sees 0, 1, ... (fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID). So each
of the run's GPUs is matched to nvidia-smi's row by what torch reports for it in the checks'
child (handler/runtime/machine.py `_cuda_identities`): its UUID, else its PCI bus id (a MIG
device has a UUID of its own and its GPU's bus id). Where torch reports neither, the fallback
reads CUDA_VISIBLE_DEVICES's entries as nvidia-smi's indices and UUID prefixes (all GPUs, in
nvidia-smi's order, when it is unset), and every line says it did.
"""
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

Bus = Tuple[int, int, int]  # PCI domain, bus, device
Identity = Tuple[str, Optional[Bus]]  # a GPU's UUID as bare_uuid gives it ("" unknown), its bus id


@dataclass(frozen=True)
class SmiRow:
    index: str  # nvidia-smi's numbering
    uuid: str  # "GPU-5f2c..."
    bus: Optional[Bus]
    mode: str  # "Default", "Exclusive_Process", "Prohibited"


def bare_uuid(text: str) -> str:
    """A UUID without its GPU-/MIG- prefix, lower case: torch reports it bare, nvidia-smi prefixed."""
    text = text.strip().lower()
    return text[4:] if text.startswith(("gpu-", "mig-")) else text


def parse_bus(text: str) -> Optional[Bus]:
    """nvidia-smi's "00000000:17:00.0" as (domain, bus, device), or None."""
    try:
        domain, bus, rest = text.strip().split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except ValueError:
        return None


def smi_rows(rows: Sequence[Tuple[str, str, str, str]]) -> List[SmiRow]:
    """cuda_build.smi_gpu_rows's tuples as rows."""
    return [SmiRow(index, uuid, parse_bus(bus), mode) for index, uuid, bus, mode in rows]


def matched(rows: List[SmiRow], identities: List[Identity]) -> List[Tuple[int, SmiRow]]:
    """(the run's GPU number, its nvidia-smi row) for each GPU torch identified."""
    pairs = []
    for number, (uuid, bus) in enumerate(identities):
        row = next((r for r in rows if uuid and bare_uuid(r.uuid) == uuid), None) \
            or next((r for r in rows if bus is not None and r.bus == bus), None)
        if row:
            pairs.append((number, row))
    return pairs


def matched_by_variable(rows: List[SmiRow], count: int, variable: Optional[str]) -> List[Tuple[int, SmiRow]]:
    """The fallback: CUDA_VISIBLE_DEVICES's first `count` entries read as nvidia-smi's indices or
    UUID prefixes (CUDA stops at the first entry naming no GPU); unset, nvidia-smi's first `count`."""
    if variable is None:
        return list(enumerate(rows[:count]))
    pairs = []
    for number, entry in enumerate(part.strip() for part in variable.split(",")[:count]):
        row = next((r for r in rows if r.index == entry or (not entry.isdigit() and entry
                    and r.uuid.lower().startswith(entry.lower()))), None)
        if row is None:
            break
        pairs.append((number, row))
    return pairs


def run_gpus(count: int, smi: Sequence[Tuple[str, str, str, str]],
             identities: List[Identity]) -> Tuple[List[Tuple[int, SmiRow]], str]:
    """The run's GPUs 0..count-1 as nvidia-smi rows, and "" or the note that the fallback was used."""
    rows = smi_rows(smi)
    if identities and any(uuid or bus for uuid, bus in identities):
        return matched(rows, identities[:count]), ""
    return (matched_by_variable(rows, count, os.environ.get("CUDA_VISIBLE_DEVICES")),
            " (matched through CUDA_VISIBLE_DEVICES as nvidia-smi numbers GPUs: torch reported no UUID or PCI bus id)")


EXCLUSIVE_MEANING = {
    "dp": "DataParallel drives every GPU from its one process: the run fits, and no other process can use them "
          "meanwhile",
    "ddp": "each rank holds only its own GPU (the launcher's checks ran in a child that has exited): the run fits "
           "while no other process holds one of them; under torchrun start at most one process per GPU",
    "fsdp": "each rank holds only its own GPU, as for ddp: the run fits while no other process holds one of them",
    "pp": "each stage's rank holds only its own GPU: the run fits while no other process holds one of them",
}
EXCLUSIVE_MEANING["ddp_dali"] = EXCLUSIVE_MEANING["ddp"].replace("each rank", "each rank (DALI's pipeline with it)")


def compute_mode_lines(mode: str, gpus: List[Tuple[int, SmiRow]], fallback: str = "") -> Tuple[str, str]:
    """(a note on the run's EXCLUSIVE_PROCESS GPUs saying what it means for `mode`, a refusal for
    its PROHIBITED ones), each "" where none is so. GPUs are named as the run numbers them, with
    nvidia-smi's number where it differs."""
    def listed(kind: str) -> Tuple[str, str]:
        chosen = [(n, row) for n, row in gpus if row.mode.replace(" ", "_").lower() == kind]
        names = ", ".join(f"{n}" if str(n) == row.index else f"{n} (nvidia-smi's GPU {row.index})" for n, row in chosen)
        return names, ",".join(row.index for _, row in chosen)
    (exclusive, _), (prohibited, smi_indices) = listed("exclusive_process"), listed("prohibited")
    note = (f"note: GPU {exclusive} in compute mode EXCLUSIVE_PROCESS{fallback}, one process per GPU: "
            f"{EXCLUSIVE_MEANING.get(mode, EXCLUSIVE_MEANING['ddp'])}") if exclusive else ""
    refusal = (f"GPU {prohibited} in compute mode PROHIBITED{fallback}: no process may use it; leave it out of "
               f"CUDA_VISIBLE_DEVICES, or have it set to DEFAULT (nvidia-smi -i {smi_indices} -c DEFAULT, as root)"
               ) if prohibited else ""
    return note, refusal
