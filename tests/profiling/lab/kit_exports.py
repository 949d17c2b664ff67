"""Real GPU exports with the lab kit's NVTX ranges added to a copy (tests/data/nsys/README.md).

The kit's loop names its ranges "Epoch 0" > "Batch i" > "upload data to GPU", "forward", "loss",
"backward", after setup ranges ("Set data loader", "Set Data Parallelism"), and marks no rank and
no data fetch. The copy gets those ranges on each process's main thread; its kernels, copies and
runtime calls stay real. Half of them go to a second NVTX domain, as the `nvtx` package's
annotate(domain=...) puts them.
"""
import shutil
import sqlite3
from pathlib import Path

SETUP = ("Set data loader", "Set Data Parallelism")
# Each step slot: the step range takes INSIDE of it, the rest is the wait for data between steps.
INSIDE = 0.6
STEP_PHASES = (("upload data to GPU", 0.05), ("forward", 0.30), ("loss", 0.05), ("backward", 0.40))


def with_kit_ranges(source: Path, target: Path, steps: int = 4) -> dict:
    """pid -> {"epoch": (start, end), "steps": [(start, end)], "phases": [(name, start, end)],
    "setup": [(name, start, end)]}."""
    shutil.copyfile(source, target)
    target.chmod(0o644)
    db = sqlite3.connect(target)
    runtime = db.execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchall()
    main_threads = sorted(t for (t,) in runtime if (t >> 24) & 0xFFFFFF == t & 0xFFFFFF)
    layout, rows = {}, []
    for tid in main_threads:
        pid = (tid >> 24) & 0xFFFFFF
        start = db.execute("SELECT MIN(start) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE (globalTid >> 24) & 16777215 = ?",
                           (pid,)).fetchone()[0]
        end = max(db.execute(f"SELECT MAX(end) FROM {t} WHERE (globalPid >> 24) & 16777215 = ?", (pid,)).fetchone()[0]
                  or 0 for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"))
        setup = [(name, start - 3000 + 1000 * i, start - 2100 + 1000 * i) for i, name in enumerate(SETUP)]
        slot = (end - start) // steps
        entry = {"epoch": (start, start + slot * steps), "steps": [], "phases": [], "setup": setup}
        rows += [(n, s, e, tid) for n, s, e in setup] + [("Epoch 0", start, start + slot * steps, tid)]
        for i in range(steps):
            s0 = start + i * slot
            length = int(slot * INSIDE)
            entry["steps"].append((s0, s0 + length))
            rows.append((f"Batch {i}", s0, s0 + length, tid))
            at = s0
            for name, fraction in STEP_PHASES:
                entry["phases"].append((name, at, at + int(length * fraction)))
                rows.append((name, at, at + int(length * fraction), tid))
                at += int(length * fraction)
        layout[pid] = entry
    has_text_id = "textId" in {r[1] for r in db.execute("PRAGMA table_info(NVTX_EVENTS)")}
    for k, (text, s, e, tid) in enumerate(rows):
        if has_text_id:
            db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, 59, ?, ?, ?)",
                       (s, e, text, tid, k % 2))
        else:
            db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid) VALUES (?, ?, 59, ?, ?)",
                       (s, e, text, tid))
    db.commit()
    db.close()
    return layout
