"""Shared by the tests that run Nsight Systems.

nsys is optional on a laptop but required in CI (README.md): without it these tests
skip, unless CI=true, where they fail so that a broken CI image cannot pass silently.
"""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.parallel import one_at_a_time

REPO = Path(__file__).resolve().parents[1]
NSYS_OPTIONS = REPO / "scripts" / "nsys_options.sh"


def require_nsys() -> str:
    """Path of nsys; skips the test without it, or fails it when CI=true."""
    path = shutil.which("nsys")
    if path:
        return path
    message = "nsys is not on PATH; install it with scripts/install_nsys.sh"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true requires it)")
    pytest.skip(message)


def profile_options() -> list[str]:
    """The `nsys profile` options scripts/launch.sh uses, read from their one source."""
    out = subprocess.run(["bash", "-c", f'source "{NSYS_OPTIONS}"; printf "%s\\n" "${{NSYS_PROFILE_OPTS[@]}}"'],
                         capture_output=True, text=True, check=True).stdout
    return out.split()


# nsys 2022.4 failing its own session, not this project's code: its client found no endpoint of its
# agent (once in CI on a loaded 2-core box), lost the connection to it and printed only "End of
# file" (once in CI, no program output, no report; every other nsys run of that suite fine), or
# sem_open failed (tests/parallel.py); launch.sh names any nsys that exited before the training
# started (docs/FAILURES.md). Such a run is tried once more.
NSYS_SESSION_FAILURE = re.compile(r"Local Endpoint is not available|sem_open|^End of file$"
                                  r"|exited \d+ before the training started", re.MULTILINE)


def once_more_if_nsys_failed_to_start(run, pause_s: float = 2):
    """run() -> CompletedProcess; run again, once, pause_s later, when nsys failed to open its
    session (said on stderr)."""
    result = run()
    output = (result.stdout or "") + (result.stderr or "")
    if result.returncode != 0 and (failure := NSYS_SESSION_FAILURE.search(output)):
        print(f"nsys failed its own session ({failure.group(0)}); trying once more", file=sys.stderr)
        time.sleep(pause_s)
        result = run()
    return result


def profile(command: list[str], output: Path, timeout: float = 120) -> Path:
    """Run command under nsys with the lab's options; returns the .nsys-rep."""
    with one_at_a_time("nsys"):
        result = once_more_if_nsys_failed_to_start(lambda: subprocess.run(
            [require_nsys(), "profile", *profile_options(), f"--output={output}", *command],
            capture_output=True, text=True, timeout=timeout))
    report = output.with_name(output.name + ".nsys-rep")
    assert result.returncode == 0 and report.is_file(), result.stdout[-2000:] + result.stderr[-2000:]
    return report


def path_without_nsys(tmp_path: Path) -> str:
    """$PATH in which nsys cannot be found: each folder holding it is replaced by links
    to everything else in that folder (on merged-/usr systems /bin and /usr/bin both hold it)."""
    entries = []
    for i, entry in enumerate(os.environ["PATH"].split(os.pathsep)):
        folder = Path(entry)
        if (folder / "nsys").exists():
            farm = tmp_path / f"path-without-nsys-{i}"
            farm.mkdir(exist_ok=True)
            for tool in folder.iterdir():
                if tool.name != "nsys" and not (farm / tool.name).is_symlink():
                    (farm / tool.name).symlink_to(tool)
            folder = farm
        entries.append(str(folder))
    return os.pathsep.join(entries)


# Real exports of GPU runs (tests/data/nsys/README.md), by nsys version.
REAL_EXPORTS = {"2026.2": REPO / "tests" / "data" / "nsys" / "nsysai_mfu_2gpu_after.sqlite",
                "2022.2": REPO / "tests" / "data" / "nsys" / "pipit_saxpy_mpi_cuda_rank0.sqlite"}
# Each batch: these phases one after another, as fractions of the batch; the last 5 % is "other".
PHASE_SPLIT = (("data", 0.10), ("h2d", 0.05), ("forward", 0.30), ("backward", 0.40), ("optimizer", 0.10))


def with_training_ranges(source: Path, target: Path, batches: int = 4, string_ids: bool = False) -> dict:
    """Copy a real export and add docs/PROFILING.md ranges for every process that made CUDA calls:
    a `rank r` mark, `epoch 0` over its CUDA activity, `batches` equal `batch i` ranges, and the
    phases of PHASE_SPLIT in each, on the thread whose tid is the pid (the main thread).
    string_ids: store the text in StringIds (textId) instead of inline, as registered strings are.
    Returns pid -> {"rank", "tid", "epoch": (start, end), "phases": [(name, start, end)], "batches": [...]}."""
    import shutil
    import sqlite3
    shutil.copyfile(source, target)
    target.chmod(0o644)
    db = sqlite3.connect(target)
    runtime = db.execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
    main_threads = sorted(t for (t,) in runtime if (t >> 24) & 0xFFFFFF == t & 0xFFFFFF)
    next_id = (db.execute("SELECT MAX(id) FROM StringIds").fetchone()[0] or 0) + 1
    layout, rows = {}, []
    for rank, tid in enumerate(main_threads):
        pid = (tid >> 24) & 0xFFFFFF
        start = db.execute("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE (globalTid >> 24) & 16777215 = ?",
                           (pid,)).fetchone()[0] - 1000
        end = max(db.execute(f"SELECT MAX(end) FROM {t} WHERE (globalPid >> 24) & 16777215 = ?", (pid,)).fetchone()[0]
                  or 0 for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY")) + 1000
        step = (end - start) // batches
        entry = {"rank": rank, "tid": tid, "epoch": (start, start + step * batches), "phases": [], "batches": []}
        rows += [(f"rank {rank}", start - 500, None, tid), ("epoch 0", start, start + step * batches, tid)]
        for i in range(batches):
            b0 = start + i * step
            entry["batches"].append((b0, b0 + step))
            rows.append((f"batch {i}", b0, b0 + step, tid))
            at = b0
            for name, fraction in PHASE_SPLIT:
                length = int(step * fraction)
                entry["phases"].append((name, at, at + length))
                rows.append((name, at, at + length, tid))
                at += length
        layout[pid] = entry
    for text, start, end, tid in rows:
        if string_ids:
            db.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (next_id, text))
            db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, textId, globalTid, domainId) "
                       "VALUES (?, ?, ?, NULL, ?, ?, 0)", (start, end, 34 if end is None else 59, next_id, tid))
            next_id += 1
        else:
            db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                       "VALUES (?, ?, ?, ?, ?, 0)", (start, end, 34 if end is None else 59, text, tid))
    db.commit()
    db.close()
    return layout
