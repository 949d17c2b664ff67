"""What every benchmark shares: arguments, interleaved timing, the table and the JSON.

Ratios are only trusted when both sides ran in the same process, alternating, so
that drift (thermal, other load on the machine) hits both alike; `alternate` runs
candidates round-robin with a rotating start, and the median of the rounds is kept.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Optional, Union

from handler.runtime.errors import OneLineParser, UserError
from handler.runtime.cpu_memory import keep_freed_memory
from handler.compare.provenance import hardware, now, versions

ROOT = Path(__file__).resolve().parents[1]
BUSY_LOAD = 1.5  # a 1-minute load average above this at the start: other jobs are running

if TYPE_CHECKING:
    import torch


def parser(doc: Optional[str]) -> argparse.ArgumentParser:
    """--quick (seconds, for tests: numbers are not meaningful) and --json PATH.
    `doc` is the script's docstring, None under python -OO."""
    doc = doc or ""
    p = OneLineParser(description=doc.strip().partition("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    p.add_argument("--quick", action="store_true", help="tiny sizes, a few seconds; for smoke tests")
    p.add_argument("--json", type=Path, help="also write the results JSON here")
    return p


def results_cells(path: Path, flag: str, fix: str) -> list[dict]:
    """The cells of a compare results.json given as `flag`: one line naming what is wrong (missing, cut
    short, not JSON, nested past reading, no `cells`, a cell without its name, mode or count) and `fix`."""
    from handler.profiling.lab.metrics_file import read_json
    data = read_json(path, f"{flag} {path}", fix)
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        raise UserError(f"{flag} {path} holds no `cells` list: not a compare results.json; {fix}")
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict) or not isinstance(cell.get("name"), str):
            raise UserError(f"{flag} {path}: `cells[{i}]` is not a cell with a name; {fix}")
    return cells


def alternate(candidates: dict, rounds: int) -> dict:
    """{name: [result of each round]}: every round calls each candidate once, the
    starting candidate rotating, so no candidate always runs first or last."""
    names = list(candidates)
    results = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            results[name].append(candidates[name]())
    return results


def summary(samples) -> dict:
    """median, min and max of a list of rates."""
    return {"median": median(samples), "min": min(samples), "max": max(samples), "samples": list(samples)}


def ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def check_target(value: float, target: float) -> dict:
    return {"value": value, "target": target, "met": bool(value >= target)}


def table(header, rows) -> str:
    cells = [[str(h) for h in header]] + [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)


def context(name: str) -> dict:
    """Hardware, versions, date, command and machine load, taken when a benchmark starts:
    a number without them cannot be compared. Other jobs on the machine show in the load.
    The allocator gets the trainer's CPU setting (handler/runtime/cpu_memory.py)."""
    return {"date": now(), "hardware": hardware(), "versions": versions(), "cpu_allocator": keep_freed_memory(),
            "command": " ".join(["python -m", f"bench.{name}", *sys.argv[1:]]),
            "load_average_before": list(os.getloadavg())}


def emit(name: str, results: dict, args, text: str, started: dict) -> dict:
    """Print the table and the JSON; write the JSON to --json when given."""
    payload = {"bench": name, "quick": args.quick, **results,
               "context": {**started, "load_average_after": list(os.getloadavg())}}
    busy = started["load_average_before"][0]
    if busy > BUSY_LOAD:
        text += (f"\nnote: load average {busy:.1f} on {os.cpu_count()} cores at the start: other jobs shared the CPU. "
                 "Ratios are paired round by round; absolute rates are not comparable across runs.")
    print(text, flush=True)
    print(json.dumps(payload, indent=2), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2))
    return payload


def make_optimizer(model):
    """The trainer's recipe (handler/train/optimizer.py): SGD, Nesterov momentum, weight decay."""
    import torch
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)


def make_step(model, steps_per_epoch: int):
    """The loop's real Step with AMP off: a disabled GradScaler and nullcontext autocast."""
    from contextlib import nullcontext

    import torch
    from handler.train.loop import Step
    from handler.train.build import warmup_cosine
    optimizer = make_optimizer(model)
    return Step(model=model, optimizer=optimizer, scheduler=warmup_cosine(optimizer, steps_per_epoch, 100),
                scaler=torch.amp.GradScaler("cpu", enabled=False), autocast=nullcontext)


def fixed_batches(count: int, batch: int, device: Union[str, "torch.device"] = "cpu", seed: int = 123):
    """CIFAR-shaped random batches, made once: loaders play no part in the timing."""
    import torch
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, 32, 32, generator=g).to(device),
             torch.randint(0, 10, (batch,), generator=g).to(device)) for _ in range(count)]
