"""What a job of rank processes leaves running, and ending it before the launcher goes on: a job
that has ended owns no process (docs/FAILURES.md). run_process (utils.py) notes `helpers()`
before it starts the ranks and calls `end_job` once they are done, whatever ended them.

Besides its ranks, a job has multiprocessing's helpers, which outlive their launcher unless
ended: the fork server the ranks are forked from (CPU ranks, utils.start_method) and the
resource tracker. Both are private to multiprocessing: their pid and the pipe that keeps each
running. Only those this job started are ended; one that ran before it belongs to someone else.
"""
import contextlib
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Tuple, cast

STOP_WAIT_S = 30  # how long ranks whose fork server died, or the tracker, get to end by themselves

_SERVER = cast(Any, multiprocessing.forkserver)._forkserver
_TRACKER = cast(Any, multiprocessing.resource_tracker)._resource_tracker


def helpers() -> Tuple[Optional[int], Optional[int]]:
    """The pids of this process's fork server and resource tracker (None: not running)."""
    return _SERVER._forkserver_pid, _TRACKER._pid


def end_job(ranks: Dict[int, Optional[str]], before: Tuple[Optional[int], Optional[int]]) -> None:
    """ranks: {pid: started_at(pid)} of the job's ranks; before: helpers() before they started.

    Ranks whose fork server died are orphans the join could not wait for: their parent-death
    signal (SIGINT, set by torch's spawn wrapper) stops them at a step, where they save; they
    are waited for, killed past STOP_WAIT_S. The fork server is ended (it has nothing to save,
    and its exit with torch loaded took seconds after the launcher's). So is every process still
    holding the tracker's pipe once the ranks are gone: a process the job started that outlived
    its rank (a killed rank's loader workers, which would notice within 5 s, or never if stuck).
    The tracker is then waited for: it cleans what a killed rank left and exits."""
    for pid in running_after(ranks, STOP_WAIT_S):
        print(f"rank process {pid} had not stopped {STOP_WAIT_S} s after its fork server died; killed",
              file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    server, tracker = helpers()
    if server is not None and server != before[0]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)
        _SERVER._stop()  # closes its pipe, reaps it
    if tracker is not None and tracker != before[1]:
        since = started_at(tracker)
        for pid in holding(_TRACKER._fd, besides=(os.getpid(), tracker)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.close(_TRACKER._fd)  # its end of file: the tracker cleans up and exits
        _TRACKER._fd = _TRACKER._pid = None  # a later job starts its own
        if running_after({tracker: since}, STOP_WAIT_S):
            print(f"warning: a process this job started still runs {STOP_WAIT_S} s after its ranks ended "
                  f"(multiprocessing's resource tracker, pid {tracker}, waits for it)", file=sys.stderr, flush=True)
        else:
            os.waitpid(tracker, 0)


def holding(fd: int, besides: Tuple[int, ...]) -> List[int]:
    """The processes, other than `besides`, holding the pipe of which `fd` is this process's end
    (every process the job started inherits the tracker's)."""
    pipe, found = os.readlink(f"/proc/self/fd/{fd}"), []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in besides:
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
                if any(os.readlink(f"/proc/{entry}/fd/{n}") == pipe for n in os.listdir(f"/proc/{entry}/fd")):
                    found.append(int(entry))
    return found


def running_after(started: Dict[int, Optional[str]], bound_s: float) -> List[int]:
    """The processes of `started` ({pid: started_at(pid)}) still running after up to bound_s."""
    deadline = time.monotonic() + bound_s
    running = [pid for pid, since in started.items() if since is not None and started_at(pid) == since]
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [pid for pid in running if started_at(pid) == started[pid]]
    return running


def started_at(pid: Optional[int]) -> Optional[str]:
    """When process pid started (clock ticks since boot): with its pid, it names one process.
    None once it has ended (a zombie included)."""
    fields = stat(pid)
    return fields[19] if fields and fields[0] != "Z" else None


def stat(pid: Optional[int]) -> List[str]:
    """/proc/PID/stat's fields from the state on; [] once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []
