"""Profile analysis at scale: seconds, peak memory and rows per second of the report, by size,
beside `nsys stats` on the same export.

    python -m bench.profile_scale [--sizes 1,4,16,64] [--full] [--ref COMMIT] [--rounds N] [--no-nsys]
                                  [--lab] [--quick] [--json PATH]

The real 2-GPU NCCL export in tests/data/nsys is tiled in time (bench/profile_tile.py) to
each size: K copies of its kernels, runtime calls, copies and memsets, with NVTX ranges at the
density of a 30-epoch x 196-batch run of the full size. `--full` adds that full size:
560 copies, about 2.0 M kernels, 3.7 M runtime calls and 0.65 M copies and memsets, 30 x 196.
Each size runs `python -m handler.profiling.report --brief` in a child process; its wall and
CPU seconds (user + system: less sensitive to other load), and its peak memory: the child's max RSS (getrusage RUSAGE_CHILDREN, measured in a fresh intermediate
process so that sizes do not mask each other). Where nsys is installed, `nsys stats -r
nvtxsum,gpukernsum,gpumemsizesum` runs on a copy of the same export in the same rounds, and each
size gets ours over nsys' as ratios (wall, CPU, peak memory; a ratio of the same round's
neighbours moves less with other load on the box than either's seconds). `--ref COMMIT` also runs
that commit's report (from `git archive`) on the same exports, alternating with the current one
round by round, and checks that both print the same summary. `--lab`: the lab page over nine
copies of the 112-copy export (0.4 M kernels) against one report of it, alternating, as a
ratio (the page reads each export once: at most 9.5). docs/RESULTS.md has the figures.
"""
import ast
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from statistics import median

from bench.common import ROOT, context, emit, parser, ratio, table
from bench.profile_tile import tile

SOURCE = ROOT / "tests" / "data" / "nsys" / "nsysai_mfu_2gpu_after.sqlite"
FULL_COPIES, FULL_EPOCHS, FULL_BATCHES = 560, 30, 196
LAB_COPIES = 112  # 0.4 M kernels: the lab page's nine reports
NSYS_REPORTS = "nvtxsum,gpukernsum,gpumemsizesum"
LAB_CELLS = [f"{mode}_{n}gpu.sqlite" for mode in ("dp", "ddp", "ddp_dali") for n in (1, 2, 4)]
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


def measure(code: Path, export: Path, out: Path, *extra: str) -> dict:
    """One report run of the package under `code`: seconds, peak MB (child max RSS), its line."""
    command = [sys.executable, "-m", "handler.profiling.report", str(export), *extra, "--out", str(out), "--brief"]
    return measure_command(command, code, {**os.environ, "PYTHONPATH": str(code)}, f"the report of {code} on {export}")


def measure_nsys(nsys: str, export: Path) -> dict:
    """`nsys stats` with the three summaries nearest the report's (NVTX ranges, kernels, copies)."""
    return measure_command([nsys, "stats", "-r", NSYS_REPORTS, str(export)], export.parent, dict(os.environ),
                           f"nsys stats on {export}")


def measure_command(command: list[str], cwd: Path, env: dict, what: str) -> dict:
    raw = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True,
                         cwd=cwd, env=env, check=True).stdout
    rc, seconds, max_rss_kb, cpu_s, line = ast.literal_eval(raw)
    if rc != 0:
        raise SystemExit(f"bench.profile_scale: {what} failed: {line}")
    return {"seconds": seconds, "cpu_s": cpu_s, "peak_mb": max_rss_kb / 1024, "line": line}


def nsys_command() -> str | None:
    return shutil.which("nsys") or next((p for p in ("/usr/local/bin/nsys",) if Path(p).is_file()), None)


def old_code(ref: str, folder: Path) -> Path:
    """The handler package as it was at ref, unpacked into folder, with bench/ (the report's
    what-if imported bench.comm_model's formulas before they moved to handler/profiling/scaling/)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "handler", "bench"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


def run_size(copies: int, folder: Path, codes: dict, rounds: int, nsys: str | None) -> dict:
    epochs, batches = layout(copies)
    export = folder / f"tiled_x{copies}.sqlite"
    made = tile(SOURCE, export, copies, epochs, batches)
    rows = sum(made["rows"].values())
    theirs = folder / f"nsys_x{copies}" / export.name  # a copy: nsys stats may write beside its input
    if nsys:
        theirs.parent.mkdir()
        shutil.copyfile(export, theirs)
    runners: dict[str, Callable[[], dict]] = {
        name: partial(measure, code, export, folder / f"out-{name}") for name, code in codes.items()}
    if nsys:
        runners["nsys"] = lambda: measure_nsys(nsys, theirs)
    runs = {name: [] for name in runners}
    for r in range(rounds):
        names = list(runners)[r % len(runners):] + list(runners)[:r % len(runners)]
        for name in names:
            runs[name].append(runners[name]())
    result = {"copies": copies, "epochs": epochs, "batches": batches, "rows": made["rows"], "rows_total": rows,
              "export_mb": export.stat().st_size / 2**20}
    for name, samples in runs.items():
        seconds = median(s["seconds"] for s in samples)
        result[name] = {"seconds": seconds, "seconds_samples": [s["seconds"] for s in samples],
                        "cpu_s": median(s["cpu_s"] for s in samples), "cpu_s_samples": [s["cpu_s"] for s in samples],
                        "peak_mb": max(s["peak_mb"] for s in samples), "rows_per_s": rows / seconds,
                        "line": samples[0]["line"] if name != "nsys" else None}
    if "old" in runs:
        result["same_summary"] = result["old"]["line"] == result["new"]["line"]
        result["time_ratio_old_over_new"] = ratio(result["old"]["seconds"], result["new"]["seconds"])
    if nsys:
        result["over_nsys"] = over(runs["new"], runs["nsys"])
        shutil.rmtree(theirs.parent)
    export.unlink()
    return result


def over(ours: list[dict], theirs: list[dict]) -> dict:
    """Ours over theirs: the median of each round's ratio (neighbours in time share the load), and
    the peak memories' ratio."""
    return {"seconds": median(ratio(a["seconds"], b["seconds"]) for a, b in zip(ours, theirs)),
            "cpu_s": median(ratio(a["cpu_s"], b["cpu_s"]) for a, b in zip(ours, theirs)),
            "peak_mb": ratio(max(a["peak_mb"] for a in ours), max(b["peak_mb"] for b in theirs))}


def run_lab(folder: Path, rounds: int, copies: int = LAB_COPIES) -> dict:
    """The lab page over nine reports (hard links to one tiled export) against one report of it."""
    epochs, batches = layout(copies)
    export = folder / "lab_one.sqlite"
    made = tile(SOURCE, export, copies, epochs, batches)
    nine = folder / "lab_reports"
    nine.mkdir()
    for name in LAB_CELLS:
        os.link(export, nine / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    page = [sys.executable, "-m", "handler.profiling.report", *(str(nine / n) for n in LAB_CELLS), "--lab",
            "--out", str(folder / "lab_page")]
    runners = {"one": lambda: measure(ROOT, export, folder / "lab_out_one"),
               "lab": lambda: measure_command(page, ROOT, env, "the lab page")}
    runs = {name: [] for name in runners}
    for r in range(rounds):
        for name in (list(runners) if r % 2 == 0 else list(runners)[::-1]):
            runs[name].append(runners[name]())
    shutil.rmtree(nine)
    export.unlink()
    return {"copies": copies, "kernels": made["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"], "reports": len(LAB_CELLS),
            **{name: {"seconds": median(s["seconds"] for s in samples), "cpu_s": median(s["cpu_s"] for s in samples),
                      "peak_mb": max(s["peak_mb"] for s in samples)} for name, samples in runs.items()},
            "lab_over_one": {"seconds": median(ratio(a["seconds"], b["seconds"]) for a, b in zip(runs["lab"], runs["one"])),
                             "cpu_s": median(ratio(a["cpu_s"], b["cpu_s"]) for a, b in zip(runs["lab"], runs["one"]))}}


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--sizes", default="1,4,16,64", help="copies of the source export, comma-separated")
    p.add_argument("--full", action="store_true", help=f"also the full size ({FULL_COPIES} copies, ~2.0 M kernels)")
    p.add_argument("--ref", help="also run this commit's report (the code before), side by side")
    p.add_argument("--rounds", type=int, default=1, help="runs per size and code, alternating (median kept)")
    p.add_argument("--no-nsys", action="store_true", help="leave nsys stats out even where it is installed")
    p.add_argument("--lab", action="store_true", help=f"also the lab page over nine {LAB_COPIES}-copy reports vs one")
    args = p.parse_args(argv)
    started = context("profile_scale")
    sizes = [1, 2] if args.quick else [int(s) for s in args.sizes.split(",")]
    sizes += [FULL_COPIES] if args.full else []
    nsys = None if args.no_nsys else nsys_command()
    with tempfile.TemporaryDirectory(prefix="profile_scale-") as tmp:
        folder = Path(tmp)
        codes = {"new": ROOT}
        if args.ref:
            (folder / "old").mkdir()
            codes["old"] = old_code(args.ref, folder / "old")
        results = [run_size(k, folder, codes, args.rounds, nsys) for k in sizes]
        lab = run_lab(folder, args.rounds, 2 if args.quick else LAB_COPIES) if args.lab else None
    names = [*codes, *(["nsys"] if nsys else [])]
    header = ["copies", "kernels", "rows", *(f"{n} {c}" for n in names for c in ("s", "cpu s", "peak MB", "rows/s"))]
    rows = [[r["copies"], r["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"], r["rows_total"],
             *(v for n in names for v in (r[n]["seconds"], r[n]["cpu_s"], r[n]["peak_mb"], r[n]["rows_per_s"]))] for r in results]
    if args.ref:
        header += ["old/new s", "same summary"]
        for row, r in zip(rows, results):
            row += [r["time_ratio_old_over_new"], r["same_summary"]]
    if nsys:
        header += ["new/nsys s", "new/nsys cpu s", "new/nsys peak"]
        for row, r in zip(rows, results):
            row += [r["over_nsys"]["seconds"], r["over_nsys"]["cpu_s"], r["over_nsys"]["peak_mb"]]
    text = table(header, rows)
    if lab:
        text += "\n\n" + table(["lab page", "kernels each", "one s", "lab s", "lab/one s", "lab/one cpu s"],
                                [[f"{lab['reports']} reports", lab["kernels"], lab["one"]["seconds"], lab["lab"]["seconds"],
                                  lab["lab_over_one"]["seconds"], lab["lab_over_one"]["cpu_s"]]])
    return emit("profile_scale", {"ref": args.ref, "nsys": nsys, "nsys_reports": NSYS_REPORTS if nsys else None,
                                  "sizes": results, "lab": lab}, args, text, started)


if __name__ == "__main__":
    main()
