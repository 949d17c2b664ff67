"""GPU metrics at real size: seconds and peak memory of the metrics summary, on both export layouts.

    python -m bench.gpu_metrics_scale [--gpus 4] [--samples 600000] [--metrics 20] [--ref COMMIT] [--quick] [--json PATH]

nsys samples at 10 kHz: a 60-s capture of 4 GPUs with 20 metrics is 48 M GPU_METRICS rows (the
layout of nsys 2023 on), or 2.4 M GENERIC_EVENTS rows of JSON (2022.x) holding the same values.
Both are generated in SQL (recursive CTEs, no Python row loops) with one rank's NVTX epochs, steps
and phases over them (DP: one process, kernels on every GPU), cached under the temporary folder
by their parameters. Each layout is summarised by `summarize(load_trace(export))` in a child
process: its seconds (load and summary apart; CPU seconds, user + system, less sensitive to other
load) and its peak memory (the child's max RSS, measured
in a fresh intermediate process, as bench/profile_scale.py does). `--ref COMMIT` also summarises
with that commit's code on the same exports (the reader before: one object per sample, GPU_METRICS
only). Target: 30 s and 1 GB each on a 2-core box (docs/RESULTS.md).
"""
import ast
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

from bench.common import ROOT, context, emit, parser, table
from handler.runtime.names import BACKWARD, BATCH, DATA, EPOCH, FORWARD, H2D, OPTIMIZER, Numbered
from bench.profile_scale import old_code

PERIOD_NS = 100_000  # 10 kHz
START_NS = 1_000_000
STEP_NS = 10_000_000  # one 10-ms step: data 1 ms (h2d 0.5 ms inside), forward 3, backward 4, optimizer 1
EPOCHS = 2
TARGET_S, TARGET_MB = 30.0, 1024.0
PID = 7
REPORTED = ("SM Active", "SM Issue", "Tensor Active", "GR Active", "Compute Warps In Flight", "DRAM Read Throughput",
            "DRAM Write Throughput", "PCIe TX Throughput", "PCIe RX Throughput")
OTHERS = ("SYS Clock Frequency", "GPC Clock Frequency", "NVLink TX Requests User Data", "NVLink RX Requests User Data",
          "NVLink TX Responses User Data", "NVLink RX Responses User Data", "Pixel Warps In Flight",
          "Unallocated Warps in Active SMs", "NVLink TX Requests Protocol Data", "NVLink RX Requests Protocol Data",
          "NVLink TX Responses Protocol Data")
CHILD = ("import json, sys, time; from pathlib import Path; t = time.perf_counter(); "
         "from handler.profiling.trace import load_trace; from handler.profiling.analysis import summarize; "
         "trace = load_trace(Path(sys.argv[1])); loaded = time.perf_counter(); c = time.process_time(); "
         "s = summarize(trace); done = time.perf_counter(); g = s['ranks'][0]['gpu_metrics'] or {}; "
         "print(json.dumps({'load_s': loaded - t, 'summary_s': done - loaded, "
         "'summary_cpu_s': time.process_time() - c, 'gpus': sorted(g), "
         "'sm_active': {k: v['sm_active_pct']['mean'] for k, v in g.items() if 'sm_active_pct' in v}, "
         "'unplaced': s.get('gpu_metrics_unplaced')}))")
MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
           "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
           "s = time.perf_counter() - t; u = resource.getrusage(resource.RUSAGE_CHILDREN); "
           "print(repr((r.returncode, s, u.ru_maxrss, u.ru_utime + u.ru_stime, r.stdout.strip()[-2000:], "
           "r.stderr.strip()[-600:])))")


def names(metrics: int) -> list[str]:
    pool: list[str] = [*REPORTED, *OTHERS]
    return pool[:metrics] if metrics <= len(pool) else pool + [f"Extra Counter {i}" for i in range(metrics - len(pool))]


def type_id(gpu: int) -> int:
    return (1 << 48) | (1 << 32) | gpu  # the GPU in the low byte, as nsys writes it (gpu_metrics.py)


def base(db, samples: int, gpus: int) -> None:
    """One rank's NVTX epochs, steps and phases over the sampled time, and a kernel per GPU."""
    db.executescript("""PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, text TEXT, textId INTEGER, globalTid INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, globalPid INTEGER,
                                                 shortName INTEGER, correlationId INTEGER);
        INSERT INTO StringIds VALUES (1, 'sgemm');""")
    span = samples * PERIOD_NS
    steps = max(1, span // STEP_NS // EPOCHS)
    tid = PID << 24 | PID
    epoch_ns = steps * STEP_NS
    db.execute(f"""INSERT INTO NVTX_EVENTS WITH RECURSIVE e(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM e WHERE i < {EPOCHS - 1})
                   SELECT {START_NS} + i * {epoch_ns}, {START_NS} + (i + 1) * {epoch_ns}, {_sql_name(EPOCH, "i")}, NULL, {tid} FROM e""")
    phases = ((None, 0, 10), (DATA, 0, 1), (H2D, 0.5, 1), (FORWARD, 1, 4), (BACKWARD, 4, 8), (OPTIMIZER, 8, 9))
    for name, a, b in phases:  # None: the step itself, `batch i`
        label = _sql_name(BATCH, f"i % {steps}") if name is None else f"'{name}'"
        db.execute(f"""INSERT INTO NVTX_EVENTS WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s
                       WHERE i < {steps * EPOCHS - 1}) SELECT {START_NS} + i * {STEP_NS} + {int(a * 1e6)},
                       {START_NS} + i * {STEP_NS} + {int(b * 1e6)}, {label}, NULL, {tid} FROM s""")
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, 1, ?)",
                   [(START_NS, START_NS + span // 2, g, PID << 24, g) for g in range(gpus)])


def _sql_name(name: Numbered, value: str) -> str:
    """SQL for the range name with an SQL expression as its number: 'batch ' || (i % 5) || ''."""
    before, after = name.template.split("{}")
    return f"'{before}' || ({value}) || '{after}'"


VALUE = "(s.i * 7 + m.id * 13 + g.g * 3) % 101"  # percent, the same in both layouts


def gpu_metrics_export(path: Path, gpus: int, samples: int, metrics: int) -> Path:
    with closing(sqlite3.connect(path)) as db:
        base(db, samples, gpus)
        db.executescript("""CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER, sourceId INTEGER, typeName TEXT,
                                metricId INTEGER, metricName TEXT);
                            CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL,
                                value INTEGER NOT NULL);
                            CREATE TEMP TABLE g (g INTEGER, ty INTEGER); CREATE TEMP TABLE m (id INTEGER);""")
        db.executemany("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GA100', ?, ?)",
                       [(type_id(g), i, n + (" [Throughput %]" if n in REPORTED else ""))
                        for g in range(gpus) for i, n in enumerate(names(metrics))])
        db.executemany("INSERT INTO temp.g VALUES (?, ?)", [(g, type_id(g)) for g in range(gpus)])
        db.executemany("INSERT INTO temp.m VALUES (?)", [(i,) for i in range(metrics)])
        db.execute(f"""INSERT INTO GPU_METRICS WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s
                       WHERE i < {samples - 1}) SELECT {START_NS} + s.i * {PERIOD_NS}, g.ty, m.id, {VALUE}
                       FROM s CROSS JOIN temp.g AS g CROSS JOIN temp.m AS m""")
        db.commit()
    return path


def generic_events_export(path: Path, gpus: int, samples: int, metrics: int) -> Path:
    fields = names(metrics)
    with closing(sqlite3.connect(path)) as db:
        base(db, samples, gpus)
        db.executescript("""CREATE TABLE GENERIC_EVENT_SOURCES (sourceId INTEGER, data TEXT);
                            CREATE TABLE GENERIC_EVENT_TYPES (typeId INTEGER, sourceId INTEGER, data TEXT);
                            CREATE TABLE GENERIC_EVENTS (rawTimestamp INTEGER, timestamp INTEGER, typeId INTEGER,
                                data TEXT);
                            CREATE TEMP TABLE g (g INTEGER, ty INTEGER);""")
        source = type_id(0) & ~0xFF
        db.execute("INSERT INTO GENERIC_EVENT_SOURCES VALUES (?, ?)",
                   (source, json.dumps({"Name": "GpuMetrics", "TimeSource": "SessionNs", "SourceGroup": "Unknown"})))
        db.executemany("INSERT INTO GENERIC_EVENT_TYPES VALUES (?, ?, ?)",
                       [(type_id(g), source, json.dumps({"Name": "", "Fields": [{"Name": n} for n in fields]}))
                        for g in range(gpus)])
        db.executemany("INSERT INTO temp.g VALUES (?, ?)", [(g, type_id(g)) for g in range(gpus)])
        pairs = ", ".join(f"'{n}', CAST({VALUE.replace('m.id', str(i))} AS TEXT)" for i, n in enumerate(fields))
        db.execute(f"""INSERT INTO GENERIC_EVENTS WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s
                       WHERE i < {samples - 1}) SELECT {START_NS} + s.i * {PERIOD_NS}, NULL, g.ty, json_object({pairs})
                       FROM s CROSS JOIN temp.g AS g""")
        db.commit()
    return path


def export(folder: Path, layout: str, gpus: int, samples: int, metrics: int) -> tuple[Path, float]:
    """The cached export of these parameters (made once), and the seconds it took to make (0: cached)."""
    path = folder / f"{layout}_g{gpus}_s{samples}_m{metrics}.sqlite"
    if path.is_file():
        return path, 0.0
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    started = time.perf_counter()
    (gpu_metrics_export if layout == "GPU_METRICS" else generic_events_export)(partial, gpus, samples, metrics)
    partial.replace(path)
    return path, time.perf_counter() - started


def measure(path: Path, code: Path = ROOT) -> dict:
    """One summary by the package under `code`, in a child: seconds, CPU seconds, peak MB and what it found."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    raw = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, "-c", CHILD, str(path)], capture_output=True,
                         text=True, cwd=code, env=env, check=True).stdout
    rc, seconds, max_rss_kb, cpu_s, out, err = ast.literal_eval(raw)
    if rc != 0:
        raise SystemExit(f"bench.gpu_metrics_scale: the summary of {path} failed: {err}")
    return {"seconds": seconds, "cpu_s": cpu_s, "peak_mb": max_rss_kb / 1024, **json.loads(out.splitlines()[-1])}


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--samples", type=int, default=600_000, help="instants per GPU (10 kHz: 60 s)")
    p.add_argument("--metrics", type=int, default=20)
    p.add_argument("--ref", help="also summarise with this commit's code (git archive), side by side")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "gpu_metrics_scale",
                   help="where the generated exports are kept, by their parameters")
    args = p.parse_args(argv)
    started = context("gpu_metrics_scale")
    gpus, samples, metrics = (2, 3000, 12) if args.quick else (args.gpus, args.samples, args.metrics)
    args.cache.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu_metrics_scale-") as tmp:
        old = old_code(args.ref, Path(tmp)) if args.ref else None
        for layout in ("GPU_METRICS", "GENERIC_EVENTS"):
            path, made_s = export(args.cache, layout, gpus, samples, metrics)
            rows = gpus * samples * (metrics if layout == "GPU_METRICS" else 1)
            run = measure(path)
            result = {"layout": layout, "rows": rows, "export_mb": path.stat().st_size / 2**20, "generated_s": made_s,
                      **run, "met": run["seconds"] <= TARGET_S and run["peak_mb"] <= TARGET_MB}
            if old is not None:
                before = measure(path, old)
                result["old"] = before
                result["old_over_new_s"] = before["seconds"] / run["seconds"]
                result["old_over_new_peak"] = before["peak_mb"] / run["peak_mb"]
            results.append(result)
    header = ["layout", "rows", "export MB", "made s", "s", "cpu s", "load s", "summary s", "summary cpu s", "peak MB",
              "met"]
    rows_out = [[r["layout"], r["rows"], r["export_mb"], r["generated_s"], r["seconds"], r["cpu_s"], r["load_s"],
                 r["summary_s"], r["summary_cpu_s"], r["peak_mb"], r["met"]] for r in results]
    if args.ref:
        header += ["old s", "old peak MB", "old gpus", "old/new s", "old/new peak"]
        for row, r in zip(rows_out, results):
            row += [r["old"]["seconds"], r["old"]["peak_mb"], len(r["old"]["gpus"]), r["old_over_new_s"],
                    r["old_over_new_peak"]]
    text = table(header, rows_out)
    return emit("gpu_metrics_scale", {"ref": args.ref, "gpus": gpus, "samples": samples, "metrics": metrics,
                                      "target": {"seconds": TARGET_S, "peak_mb": TARGET_MB}, "layouts": results},
                args, text, started)


if __name__ == "__main__":
    main()
