# pyright: strict
"""A report's DataLoader worker processes, from the process tree nsys recorded (machine.py counts
them, sched.py gives their CPU time to the loader).

nsys records each process's pid and name (`PROCESSES`: globalPid, pid, name, in every export schema
here, 2022.2 to 2026.2) and each thread's name (`ThreadNames`), but no parent pid. A worker is
- named: a process with a thread named `pt_data_worker` (the name newer torch gives its workers);
- unnamed (the torch of 2022 named none): a process of a rank's name (`python3`) started after the
  first rank (a larger pid: forked from it), whose threads the scheduler ran inside the ranks' epochs
  (`SCHED_EVENTS`), and that opened no NVTX range and made no CUDA call of its own (a rank does both).
"""
import sqlite3
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

DATA_WORKER = "pt_data_worker"
PID_OF = "(globalTid >> 24) & 16777215"  # the pid packed into nsys' serialized global thread id
TRACED = ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_RUNTIME")  # a process with rows here is not a worker


@dataclass(frozen=True)
class LoaderProcesses:
    named: tuple[int, ...]  # pids with a `pt_data_worker` thread
    unnamed: tuple[int, ...]  # pids read from the process tree (the module's docstring)
    rank_name: str | None = None  # the ranks' process name, where the unnamed were read by it

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(sorted({*self.named, *self.unnamed}))

    def says(self) -> str:
        """What the processes are, for the `_from` lines."""
        if not self.unnamed:
            return f"`{DATA_WORKER}` processes"
        named = f", {len(self.named)} named `{DATA_WORKER}`" if self.named else ""
        return (f"DataLoader worker processes ({len(self.unnamed)} unnamed: `{self.rank_name}` processes started after "
                f"the rank, scheduled inside its epochs, with no NVTX range or CUDA call of their own{named})")


def columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {str(row[1]) for row in db.execute(f"PRAGMA table_info({table})")}


def loader_processes(db: sqlite3.Connection, tables: Collection[str], ranks: Collection[int],
                     window: tuple[int, int] | None, threads: Mapping[int, Sequence[str]]) -> LoaderProcesses:
    """ranks: the ranks' pids; window: from the first epoch's start to the last one's end (None: no epoch);
    threads: pid -> its threads' names."""
    named = tuple(sorted(pid for pid, names in threads.items() if DATA_WORKER in names and pid not in ranks))
    if window is None or not ranks or not {"PROCESSES", "SCHED_EVENTS"} <= set(tables):
        return LoaderProcesses(named, ())
    if not {"pid", "name"} <= columns(db, "PROCESSES") or not {"start", "globalTid"} <= columns(db, "SCHED_EVENTS"):
        return LoaderProcesses(named, ())
    names = {int(pid): str(name) for pid, name in
             db.execute("SELECT pid, name FROM PROCESSES WHERE pid IS NOT NULL AND name IS NOT NULL")}
    rank_names = sorted({names[p] for p in ranks if p in names})
    first = min(ranks)
    candidates = sorted(pid for pid, name in names.items()
                        if name in rank_names and pid > first and pid not in ranks and pid not in named)
    if not candidates:
        return LoaderProcesses(named, ())
    among = f"{PID_OF} IN ({', '.join(map(str, candidates))})"
    scheduled = _pids(db, f"SELECT DISTINCT {PID_OF} FROM SCHED_EVENTS WHERE globalTid IS NOT NULL AND {among} "
                          "AND start >= ? AND start < ?", window)
    traced: set[int] = set()
    for table in TRACED:
        if table in tables and "globalTid" in columns(db, table):
            traced |= _pids(db, f"SELECT DISTINCT {PID_OF} FROM {table} WHERE globalTid IS NOT NULL AND {among}")
    unnamed = tuple(sorted(scheduled - traced))
    return LoaderProcesses(named, unnamed, "/".join(rank_names) if unnamed else None)


def _pids(db: sqlite3.Connection, sql: str, args: tuple[int, ...] = ()) -> set[int]:
    return {int(row[0]) for row in db.execute(sql, args)}
