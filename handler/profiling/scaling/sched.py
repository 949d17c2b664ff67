# pyright: strict
"""A report's CPU time by thread, from what nsys recorded of the scheduler (`SCHED_EVENTS`: each
thread scheduled in and out of a core, recorded with `--cpuctxsw=process-tree`, the default
where nsys samples the CPU, as the course kit's `nsys profile --trace=...` does): the
`machine` block's loader_cpu_ms and rank_cpu_ms for a report whose run wrote no `cpu_time`
(cores.py). Only the time inside the ranks' closed epochs counts, as in the metrics: the epochs
of whichever convention read the report (the trace's own, `epoch_windows`), never names matched again.

- loader: DALI's threads in a rank (named `[DALI]...`) and the DataLoader's worker processes
  (workers.py: named `pt_data_worker`, or read from the process tree);
- rank: every other thread of a rank's process.
Per step and rank: the sums over the ranks' steps of their closed epochs.

The events move as columns (sql_columns.read_columns), never a Python object per row: a thread's
time on a core is each `in` event followed by its `out`. What cannot be placed is counted and said
in one line (`sched_line`): events outside every epoch, of no thread (globalTid NULL, as nsys'
schema allows), of other processes. A table without the columns nsys writes, or an empty one, is
`not recorded`, `cpu_time_from` saying which.
"""
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from handler.runtime.names import EPOCH

from ..nsys import open_export
from ..record.metrics import Metrics
from ..sql_columns import read_columns
from ..trace import Process
from .cores import cpu_time_of
from .workers import LoaderProcesses, columns

DALI_THREAD = "[DALI]"
NEEDED = ("start", "isSchedIn", "globalTid")  # nsys' SCHED_EVENTS columns (2021.x-2026.x)
Windows = list[tuple[int, int]]
Ints = npt.NDArray[np.int64]


def epoch_windows(processes: Iterable[Process]) -> Windows:
    """The ranks' closed epochs as disjoint [start, end) spans, in order."""
    return merged([(r.start, r.end) for p in processes for r in p.ranges if r.closed and EPOCH.pattern.fullmatch(r.name)])


def merged(spans: Iterable[tuple[int, int]]) -> Windows:
    out: list[list[int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _not_recorded(why: str) -> dict[str, Any]:
    return {"why": why}


def report_cpu_time(export: Path, ranks: Sequence[Mapping[str, Any]], windows: Windows,
                    loaders: LoaderProcesses, threads: Mapping[int, Sequence[str]]) -> dict[str, Any]:
    """{loader_cpu_ms, rank_cpu_ms, cpu_time_from, sched_events, sched_line}, or {"why": ...} where the
    report's scheduling events give none. threads: globalTid -> its names."""
    pids = [int(r["pid"]) for r in ranks if r.get("pid") is not None]
    loops: list[Mapping[str, Any]] = [r.get("loop") or {} for r in ranks]
    steps = sum(int(loop.get("steps") or 0) for loop in loops)
    with open_export(export) as db:
        tables = {str(row[0]) for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "SCHED_EVENTS" not in tables:
            return _not_recorded("no nsys scheduling events in the report")
        have = columns(db, "SCHED_EVENTS")
        if missing := [c for c in NEEDED if c not in have]:
            return _not_recorded(f"the report's SCHED_EVENTS lacks {', '.join(missing)} (it has "
                                 f"{', '.join(sorted(have)) or 'no column'}), not nsys' schema: its scheduling "
                                 "events are not read")
        total, no_thread = db.execute("SELECT COUNT(*), COUNT(*) - COUNT(globalTid) FROM SCHED_EVENTS").fetchone()
    if not total:
        return _not_recorded("the report's SCHED_EVENTS table is empty (nsys recorded no scheduling event)")
    if total == no_thread:
        return _not_recorded(f"the report's {total} scheduling events name no thread (globalTid NULL)")
    if not windows or not steps:
        return _not_recorded("no closed epoch with steps to place the report's scheduling events in")
    events = read_columns(export, "SELECT rowid AS event, start, isSchedIn AS sched_in, globalTid AS tid FROM SCHED_EVENTS "
                          "WHERE globalTid IS NOT NULL", {"event": "i8", "start": "i8", "sched_in": "i8", "tid": "i8"})
    dali = np.array([tid for tid, names in threads.items() if (tid >> 24) & 0xFFFFFF in pids
                     and any(n.startswith(DALI_THREAD) for n in names)], dtype=np.int64)
    order = np.lexsort((events["event"], events["start"], events["tid"]))
    start, into, tid = events["start"][order], events["sched_in"][order] != 0, events["tid"][order]
    pid = (tid >> 24) & 0xFFFFFF
    in_rank = np.isin(pid, np.array(pids, dtype=np.int64))
    loader = (in_rank & np.isin(tid, dali)) | np.isin(pid, np.array(loaders.pids, dtype=np.int64))
    ours = in_rank | loader
    pair = into[:-1] & ~into[1:] & (tid[:-1] == tid[1:])  # an `in` and the same thread's next event, its `out`
    spent = _covered(start[1:], windows) - _covered(start[:-1], windows)
    loader_ns, rank_ns = int(spent[pair & loader[:-1]].sum()), int(spent[pair & ours[:-1] & ~loader[:-1]].sum())
    inside = _inside(start, windows)
    counts = {"in_epochs": int((ours & inside).sum()), "outside_epochs": int((ours & ~inside).sum()),
              "other_processes": int((~ours).sum()), "no_thread": int(no_thread), "total": int(total)}
    if not counts["in_epochs"]:
        return _not_recorded(f"none of the report's {total} scheduling events is of a rank's or its loader's thread "
                             "inside the epochs")
    return {"loader_cpu_ms": loader_ns / 1e6 / steps, "rank_cpu_ms": rank_ns / 1e6 / steps,
            "cpu_time_from": "report: nsys SCHED_EVENTS inside the ranks' epochs (DALI threads and "
                             f"{len(loaders.pids)} DataLoader worker processes the loader's), per step of {steps} "
                             "over the ranks",
            "sched_events": counts, "sched_line": sched_line(counts)}


def sched_line(counts: Mapping[str, int]) -> str:
    """The page's one line: what the scheduling events held and what could not be placed."""
    left = [f"{counts['outside_epochs']} of the ranks' and loaders' threads outside every epoch",
            f"{counts['other_processes']} of other processes (nsys, the system)",
            f"{counts['no_thread']} of no thread (globalTid NULL)"]
    return (f"scheduling events: {counts['in_epochs']} of {counts['total']} inside the epochs; left out: "
            + ", ".join(part for part in left if not part.startswith("0 ")))


def _inside(at: Ints, windows: Windows) -> npt.NDArray[np.bool_]:
    starts, ends = np.array([w[0] for w in windows]), np.array([w[1] for w in windows])
    k = np.searchsorted(starts, at, side="right") - 1
    return (k >= 0) & (at < ends[np.maximum(k, 0)])


def _covered(at: Ints, windows: Windows) -> Ints:
    """Nanoseconds of the windows before each time: the time [a, b) spends inside is covered(b) - covered(a)."""
    starts, ends = np.array([w[0] for w in windows], dtype=np.int64), np.array([w[1] for w in windows], dtype=np.int64)
    before = np.concatenate(([0], np.cumsum(ends - starts)))
    k = np.searchsorted(starts, at, side="right") - 1
    last = np.maximum(k, 0)
    partial = np.clip(at - starts[last], 0, ends[last] - starts[last])
    return np.where(k >= 0, before[last] + partial, 0).astype(np.int64)


def cpu_time_for(export: Path | None, ranks: Sequence[Mapping[str, Any]], metrics: Mapping[str, Any] | None,
                 windows: Windows, loaders: LoaderProcesses, threads: Mapping[int, Sequence[str]]) -> dict[str, Any]:
    """The machine block's CPU time: the run's metrics where it recorded them, else the report's
    scheduling events, else `not recorded`, saying why (cores.py says on the page what is then assumed)."""
    recorded = cpu_time_of(Metrics.model_validate(metrics) if metrics else None)  # validated at its read (record/)
    if recorded["loader_cpu_ms"] is not None or export is None:
        return {**recorded, "sched_events": None, "sched_line": None}
    found = report_cpu_time(export, ranks, windows, loaders, threads)
    if "why" in found:
        return {**recorded, "cpu_time_from": f"{recorded['cpu_time_from']} and {found['why']}", "sched_events": None,
                "sched_line": None}  # the reason is in cpu_time_from, which the page's Machine line prints
    return found
