"""Profile analysis at scale: seconds, peak memory and rows per second of the report, by size.

    python -m bench.profile_scale [--sizes 1,4,16,64] [--full] [--ref COMMIT] [--rounds N] [--quick] [--json PATH]

The real 2-GPU NCCL export in tests/data/nsys is tiled in time (bench/profile_tile.py) to
each size: K copies of its kernels, runtime calls, copies and memsets, with NVTX ranges at the
density of a 30-epoch x 196-batch run of the full size. `--full` adds that full size:
560 copies, about 2.0 M kernels, 3.7 M runtime calls and 0.65 M copies and memsets, 30 x 196.
Each size runs `python -m handler.profiling.report --brief` in a child process; its wall and
CPU seconds (user + system: less sensitive to other load), and its peak memory: the child's max RSS (getrusage RUSAGE_CHILDREN, measured in a fresh intermediate
process so that sizes do not mask each other). `--ref COMMIT` also runs that commit's report
(from `git archive`) on the same exports, alternating with the current one round by round, and
checks that both print the same summary; docs/RESULTS.md has the figures.
"""
import ast
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from bench.common import ROOT, context, emit, parser, ratio, table
from bench.profile_tile import tile

SOURCE = ROOT / "tests" / "data" / "nsys" / "nsysai_mfu_2gpu_after.sqlite"
FULL_COPIES, FULL_EPOCHS, FULL_BATCHES = 560, 30, 196
MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
           "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
           "s = time.perf_counter() - t; u = resource.getrusage(resource.RUSAGE_CHILDREN); "
           "print(repr((r.returncode, s, u.ru_maxrss, u.ru_utime + u.ru_stime, "
           "r.stdout.strip()[-400:] + r.stderr.strip()[-400:])))")


def layout(copies: int) -> tuple[int, int]:
    """(epochs, batches per epoch) at the full size's NVTX density."""
    if copies == FULL_COPIES:
        return FULL_EPOCHS, FULL_BATCHES
    batches = max(1, round(copies * FULL_EPOCHS * FULL_BATCHES / FULL_COPIES))
    epochs = max(1, round(copies * FULL_EPOCHS / FULL_COPIES))
    return epochs, max(1, batches // epochs)


def measure(code: Path, export: Path, out: Path) -> dict:
    """One report run of the package under `code`: seconds, peak MB (child max RSS), its line."""
    command = [sys.executable, "-m", "handler.profiling.report", str(export), "--out", str(out), "--brief"]
    env = {**os.environ, "PYTHONPATH": str(code)}
    raw = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True,
                         cwd=code, env=env, check=True).stdout
    rc, seconds, max_rss_kb, cpu_s, line = ast.literal_eval(raw)
    if rc != 0:
        raise SystemExit(f"bench.profile_scale: the report of {code} failed on {export}: {line}")
    return {"seconds": seconds, "cpu_s": cpu_s, "peak_mb": max_rss_kb / 1024, "line": line}


def old_code(ref: str, folder: Path) -> Path:
    """The handler package as it was at ref, unpacked into folder, with bench/ (the report's
    what-if imported bench.comm_model's formulas before they moved to handler/profiling/scaling/)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "handler", "bench"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def run_size(copies: int, folder: Path, codes: dict, rounds: int) -> dict:
    epochs, batches = layout(copies)
    export = folder / f"tiled_x{copies}.sqlite"
    made = tile(SOURCE, export, copies, epochs, batches)
    rows = sum(made["rows"].values())
    runs = {name: [] for name in codes}
    for r in range(rounds):
        names = list(codes)[r % len(codes):] + list(codes)[:r % len(codes)]
        for name in names:
            runs[name].append(measure(codes[name], export, folder / f"out-{name}"))
    result = {"copies": copies, "epochs": epochs, "batches": batches, "rows": made["rows"], "rows_total": rows,
              "export_mb": export.stat().st_size / 2**20}
    for name, samples in runs.items():
        seconds = median(s["seconds"] for s in samples)
        result[name] = {"seconds": seconds, "seconds_samples": [s["seconds"] for s in samples],
                        "cpu_s": median(s["cpu_s"] for s in samples),
                        "peak_mb": max(s["peak_mb"] for s in samples), "rows_per_s": rows / seconds,
                        "line": samples[0]["line"]}
    if "old" in runs:
        result["same_summary"] = result["old"]["line"] == result["new"]["line"]
        result["time_ratio_old_over_new"] = ratio(result["old"]["seconds"], result["new"]["seconds"])
    export.unlink()
    return result


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--sizes", default="1,4,16,64", help="copies of the source export, comma-separated")
    p.add_argument("--full", action="store_true", help=f"also the full size ({FULL_COPIES} copies, ~2.0 M kernels)")
    p.add_argument("--ref", help="also run this commit's report (the code before), side by side")
    p.add_argument("--rounds", type=int, default=1, help="runs per size and code, alternating (median kept)")
    args = p.parse_args(argv)
    started = context("profile_scale")
    sizes = [1, 2] if args.quick else [int(s) for s in args.sizes.split(",")]
    sizes += [FULL_COPIES] if args.full else []
    with tempfile.TemporaryDirectory(prefix="profile_scale-") as tmp:
        folder = Path(tmp)
        codes = {"new": ROOT}
        if args.ref:
            (folder / "old").mkdir()
            codes["old"] = old_code(args.ref, folder / "old")
        results = [run_size(k, folder, codes, args.rounds) for k in sizes]
    header = ["copies", "kernels", "rows", *(f"{n} {c}" for n in codes for c in ("s", "cpu s", "peak MB", "rows/s"))]
    rows = [[r["copies"], r["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"], r["rows_total"],
             *(v for n in codes for v in (r[n]["seconds"], r[n]["cpu_s"], r[n]["peak_mb"], r[n]["rows_per_s"]))] for r in results]
    if args.ref:
        header += ["old/new s", "same summary"]
        for row, r in zip(rows, results):
            row += [r["time_ratio_old_over_new"], r["same_summary"]]
    return emit("profile_scale", {"ref": args.ref, "sizes": results}, args, table(header, rows), started)


if __name__ == "__main__":
    main()
