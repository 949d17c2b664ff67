"""One summary for a job profiled on several hosts: one nsys report per node (docs/PROFILING.md).

Each report is summarised on its own (analysis.summarize); the ranks are pooled, each with its
host, and the numbers that compare ranks across reports (stragglers) are put on one clock:
a report's timestamps are its target's clock, and TARGET_INFO_SESSION_START_TIME ties that
clock to UTC at the session's start (utcEpochNs; systemClockNs is the target clock's reading
then, where the export has it; older exports count from the session start). Exact between
reports of one machine; across machines off by the hosts' UTC disagreement (NTP: typically
0.1-10 ms; PTP: around 1 us), which docs/PROFILING.md discusses.

Each rank's host, and which source named it (`host_from`, on the page's reports table): its
`host NAME` mark; else the export's own TARGET_INFO_SYSTEM_ENV `Hostname` (nsys records the host it
ran on); else the metrics' env.hosts (the run's own record); else the report's name as
train.sbatch writes it (`<job>_<node>`). Reports of one job that none names merge into one host `?`.
"""
from pathlib import Path

from handler.runtime.errors import UserError

from .analysis import _mean, _overall, _ratio, comm_config, first_comm_per_process, summarize
from .comm import stragglers
from .nsys import open_export
from .record.parse import parse_summary
from .scaling.run_facts import run_block
from .scaling.machine import machine_of
from .trace import load_trace


def clock_offset(export: Path) -> tuple[int, str]:
    """(ns to add to the export's timestamps to get UTC ns, the session's UTC start)."""
    with open_export(export) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "TARGET_INFO_SESSION_START_TIME" not in tables:
            raise UserError(f"{export} has no TARGET_INFO_SESSION_START_TIME, so its clock cannot be aligned "
                            "with the other reports; export it with nsys 2021.3 or newer")
        have = {row[1] for row in db.execute("PRAGMA table_info(TARGET_INFO_SESSION_START_TIME)")}
        system = "systemClockNs" if "systemClockNs" in have else "0"
        utc, clock, text = db.execute(f"SELECT utcEpochNs, {system}, utcTime "
                                      "FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    return utc - (clock or 0), text


def merge(exports: list[tuple[str, Path]], metrics: dict | None = None) -> dict:
    """exports: (report name, its SQLite export) per node. The job's summary: every rank with its
    host, per-host epoch, step and communication numbers, stragglers across hosts on one clock."""
    ranks, arrivals, reports, sources, gpu_trace, gpus = [], {}, [], set(), False, []
    for name, export in exports:
        trace = load_trace(export)
        summary = summarize(trace, metrics)
        parse_summary(summary, f"{name}'s summary", "report it, with the report, as a bug")  # the records' contract
        offset, started = clock_offset(export)
        for rank in summary["ranks"]:  # named by the report (analysis.host_named), else by its file's name
            if rank["host"] is None and (node := _host_from_name(name)):
                rank["host"], rank["host_from"] = node, "file name"
            elif rank["host"] is None:
                rank["host_from"] = "not recorded: no host mark, Hostname, metrics env.hosts or node in the file name"
            rank["report"] = name
            if any(r["rank"] == rank["rank"] for r in ranks):
                raise UserError(f"rank {rank['rank']} appears in {name} and in an earlier report; pass the "
                                "reports of one job (its ranks carry `rank N` marks, train_cifar.py writes them)")
            ranks.append(rank)
        for rank, steps in first_comm_per_process(trace).items():
            arrivals[rank] = {step: at + offset for step, at in steps.items()}
        reports.append({"report": name, "hosts": sorted({r["host"] or "?" for r in summary["ranks"]}),
                        "host_from": " + ".join(sorted({r["host_from"] for r in summary["ranks"]})),
                        "ranks": [r["rank"] for r in summary["ranks"]], "clock_offset_ns": offset,
                        "session_start_utc": started, "machine": machine_of(export, summary["ranks"], metrics, trace.processes)})
        sources.add(summary["rank_source"])
        hosts = {r["host"] for r in summary["ranks"]}
        host = hosts.pop() if len(hosts) == 1 else None  # a node's GPUs are its report's: one host
        gpus += [{**g, "host": host} for g in summary["gpus"] or ()]
        gpu_trace = gpu_trace or summary["gpu_trace"]
    ranks.sort(key=lambda r: r["rank"])
    host_of = {r["rank"]: r["host"] for r in ranks}
    late = stragglers(arrivals)
    if late:
        late["last_host_counts"] = _by_host(late["last_rank_counts"], host_of)
        late["most_often_last_host"] = host_of[late["most_often_last"]]
    job = {"schema": 1, "job": True, "reports": reports, "rank_source": " + ".join(sorted(sources)),
           "gpu_trace": gpu_trace, "ranks": ranks, "overall": _overall(ranks), "hosts": host_table(ranks),
           "machine": job_machine([r["machine"] for r in reports]),
           "stragglers": late, "gpu_metrics_mapping": None, "metrics_comparison": None,
           "comm_config": comm_config(metrics), "model": ((metrics or {}).get("config") or {}).get("model"),
           "gpus": gpus or None}
    job["run"] = run_block(job, metrics, [name for name, _ in exports])
    return job


def job_machine(machines: list[dict]) -> dict:
    """The job's machine block: each fact as every node's report read it, or, where the nodes differ,
    the one that holds the job back (the fewest cores, loader workers or threads), saying so."""
    job = dict(machines[0])
    for fact in ("cpu_cores", "rank_cores", "loader_workers", "threads_per_rank"):
        values = [m[fact] for m in machines]
        if len(set(values)) > 1:
            known = [v for v in values if v is not None]
            job[fact] = min(known) if known else None
            job[f"{fact}_from"] = (f"the fewest over the job's {len(machines)} reports ({', '.join(map(str, values))}), "
                                   f"{machines[values.index(job[fact])][f'{fact}_from']}")
    return job


def host_table(ranks: list[dict]) -> dict:
    """host -> its ranks, mean epoch time per epoch (over its ranks), mean step time and the worst p95,
    communication and exposed communication (seconds summed over its ranks, share of batch time)."""
    hosts = {}
    for rank in ranks:
        hosts.setdefault(rank["host"] or "?", []).append(rank)
    table = {}
    for host, own in sorted(hosts.items()):
        epochs = sorted({e["epoch"] for r in own for e in r["epochs"]})
        batch_total = sum(r["batches"]["total_s"] for r in own)
        comms = [r["comm"] for r in own if r["comm"]]
        means = [r["batches"]["mean_ms"] for r in own if r["batches"]["mean_ms"] is not None]
        table[host] = {
            "ranks": [r["rank"] for r in own],
            "epochs": [{"epoch": e, "time_s": _mean([x["time_s"] for r in own for x in r["epochs"] if x["epoch"] == e])}
                       for e in epochs],
            "step_mean_ms": _mean(means),
            "step_p95_max_ms": max((r["batches"]["p95_ms"] for r in own if r["batches"]["p95_ms"]), default=None),
            "comm_s": sum(c["seconds"] for c in comms) if comms else None,
            "comm_exposed_s": sum(c["exposed_s"] for c in comms) if comms else None,
            "comm_share": _ratio(sum(c["seconds"] for c in comms), batch_total) if comms else None,
            "comm_exposed_share": _ratio(sum(c["exposed_s"] for c in comms), batch_total) if comms else None,
        }
    return table


def _by_host(counts: dict, host_of: dict) -> dict:
    out = {}
    for rank, n in counts.items():
        host = host_of[int(rank)] or "?"
        out[host] = out.get(host, 0) + n
    return out


def _host_from_name(name: str) -> str | None:
    """`<job>_<node>.nsys-rep` (train.sbatch's naming) -> node; None for other names."""
    stem = Path(name).name.split(".")[0]
    return stem.split("_", 1)[1] if "_" in stem and stem.split("_", 1)[0].isdigit() else None


def markdown_lines(summary: dict) -> list[str]:
    """The job page's host sections: per-host numbers, stragglers by host, the reports and their clocks."""
    num = lambda x, d=2: "n/a" if x is None else f"{x:.{d}f}"  # noqa: E731
    pct = lambda x: "n/a" if x is None else f"{100 * x:.1f} %"  # noqa: E731
    hosts = summary["hosts"]
    epochs = sorted({e["epoch"] for h in hosts.values() for e in h["epochs"]})
    lines = ["## Hosts", "", "Per host: its ranks, mean epoch time over its ranks, mean step time and the worst "
             "rank's p95, communication and the exposed part (seconds summed over its ranks, share of their "
             "batch time).", "",
             "| host | ranks | " + " | ".join(f"epoch {e} s" for e in epochs) + " | step mean ms | step p95 ms (worst) "
             "| comm s | comm share | exposed s | exposed share |", "|" + "---|" * (9 + len(epochs) - 1)]
    for host, h in hosts.items():
        times = {e["epoch"]: e["time_s"] for e in h["epochs"]}
        lines.append(f"| {host} | {', '.join(map(str, h['ranks']))} | "
                     + " | ".join(num(times.get(e)) for e in epochs)
                     + f" | {num(h['step_mean_ms'], 1)} | {num(h['step_p95_max_ms'], 1)} | {num(h['comm_s'], 3)} | "
                       f"{pct(h['comm_share'])} | {num(h['comm_exposed_s'], 3)} | {pct(h['comm_exposed_share'])} |")
    late = summary.get("stragglers")
    if late:
        lines += ["", f"Stragglers across hosts: over {late['steps']} steps the first all-reduce's start spread "
                  f"p50 {num(late['p50_ms'])} ms, p95 {num(late['p95_ms'])} ms; last most often: "
                  f"**{late['most_often_last_host']}** (rank {late['most_often_last']}); times last per host: "
                  + ", ".join(f"{h}: {n}" for h, n in late["last_host_counts"].items()) + "."]
    lines += ["", "## Reports and clocks", "",
              "Timestamps are put on one clock through each report's TARGET_INFO_SESSION_START_TIME (UTC at the "
              "session start): exact on one machine, off by the hosts' clock disagreement across machines "
              "(docs/PROFILING.md).", "", "| report | hosts | ranks | session start (UTC) | offset ns | host named by |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {r['report']} | {', '.join(r['hosts'])} | {', '.join(map(str, r['ranks']))} | "
              f"{r['session_start_utc']} | {r['clock_offset_ns']} | {r.get('host_from') or '?'} |"
              for r in summary["reports"]]
    return lines + [""]
