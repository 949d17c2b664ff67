"""GPU-trace views that the CPU ranges get wrong (issue 19, items 6-8), on copies of the real
nsys exports (tests/data/nsys) with rows added in their own schema:

- the pp bubble from each stage's kernels, not from `fwd`/`bwd`/`recv` ranges that time launches;
- GPU metrics of the GPU a rank really used, through TARGET_INFO_CUDA_DEVICE;
- DALI's and nvJPEG's GPU work as `data_gpu`, not as the training thread's forward.

Expected numbers come from SQL joins, the builders' own layouts and a 100 ns bitmap.
"""
import bisect
import sqlite3

import pytest

from handler.profiling.analysis import PHASES, summarize
from handler.profiling.gpu_view import gpu_stats, pipeline_threads
from handler.profiling.render import markdown, one_line
from handler.profiling.trace import GpuActivity, load_trace
from tests.nsys_helpers import REAL_EXPORTS, REPO, with_training_ranges
from tests.test_profile_gpu import BASE_TABLES, MS, PID, Bitmap, rank_of

RUNTIME, KERNEL, MEMCPY = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"


def clone_row(db, table, **changes):
    """Insert a copy of one real row of `table` with some columns changed (keeps every NOT NULL column filled)."""
    cursor = db.execute(f"SELECT * FROM {table} LIMIT 1")
    row = dict(zip([c[0] for c in cursor.description], cursor.fetchone()))
    row.update(changes)
    db.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def add_string(db, value):
    next_id = db.execute("SELECT MAX(id) + 1 FROM StringIds").fetchone()[0]
    db.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (next_id, value))
    return next_id


def add_range(db, text, start, end, tid):
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, ?, ?, ?, 0)",
               (start, end, 34 if end is None else 59, text, tid))


# --- 6. The pp bubble from the stages' kernels ------------------------------------------------

# One batch of a stage: pieces one after another, as fractions of the batch; the last 5 % is the optimizer.
PP_SPLIT = (("recv", 0.05), ("fwd mb0", 0.15), ("send", 0.05), ("fwd mb1", 0.15), ("recv", 0.05),
            ("bwd mb0", 0.20), ("send", 0.05), ("bwd mb1", 0.20), ("send", 0.05))


def with_pp_ranges(source, target, batches=3):
    """Copy a real export and give each process's main thread `rank r`, `epoch 0`, `batch i` and,
    in each batch, the pp ranges of PP_SPLIT (`fwd`/`bwd` inside `forward`/`backward`, as
    handler/PP/schedule.py nests them), then `optimizer`. Returns pid -> (tid, batches, pieces)."""
    target.write_bytes(source.read_bytes())
    db = sqlite3.connect(target)
    threads = sorted(t for (t,) in db.execute(f"SELECT DISTINCT globalTid FROM {RUNTIME}")
                     if (t >> 24) & 0xFFFFFF == t & 0xFFFFFF)
    layout = {}
    for rank, tid in enumerate(threads):
        pid = tid & 0xFFFFFF
        start = db.execute(f"SELECT MIN(start) FROM {RUNTIME} WHERE {PID % 'globalTid'} = ?", (pid,)).fetchone()[0]
        end = db.execute(f"SELECT MAX(start) FROM {RUNTIME} WHERE {PID % 'globalTid'} = ?", (pid,)).fetchone()[0] + 1
        step = (end - start) // batches
        add_range(db, f"rank {rank}", start - 500, None, tid)
        add_range(db, "epoch 0", start, start + step * batches, tid)
        spans, pieces = [], []
        for i in range(batches):
            at = start + i * step
            spans.append((at, at + step))
            add_range(db, f"batch {i}", at, at + step, tid)
            for name, fraction in PP_SPLIT:
                length = int(step * fraction)
                pieces.append((name, at, at + length, i))
                add_range(db, name, at, at + length, tid)
                if name[:3] in ("fwd", "bwd"):
                    add_range(db, {"fwd": "forward", "bwd": "backward"}[name[:3]], at, at + length, tid)
                at += length
            add_range(db, "optimizer", at, at + step // 20, tid)
        layout[pid] = (tid, spans, pieces)
    db.commit()
    db.close()
    return layout


def expected_stage(db, pid, pieces):
    """(busy, wait, span) in seconds from an SQL join launch -> piece and a bitmap per batch."""
    starts = [p[1] for p in pieces]
    per_batch = {}
    for table in (KERNEL, MEMCPY, "CUPTI_ACTIVITY_KIND_MEMSET"):
        name = "s.value" if table == KERNEL else "NULL"
        join = "JOIN StringIds s ON s.id = a.shortName" if table == KERNEL else ""
        rows = db.execute(f"""
            WITH r AS MATERIALIZED (SELECT correlationId, {PID % 'globalTid'} AS pid, MIN(start) AS start
                                    FROM {RUNTIME} GROUP BY 1, 2)
            SELECT a.start, a.end, {name}, r.start FROM {table} a {join}
            JOIN r ON r.correlationId = a.correlationId AND r.pid = {PID % 'a.globalPid'}
            WHERE {PID % 'a.globalPid'} = ?""", (pid,)).fetchall()
        for start, end, kernel, launched in rows:
            i = bisect.bisect_right(starts, launched) - 1
            if i >= 0 and launched < pieces[i][2]:  # our pieces sit only on the main thread
                per_batch.setdefault(pieces[i][3], []).append((start, end, kernel, pieces[i][0]))
    busy = wait = span = 0.0
    for rows in per_batch.values():
        first, last = min(r[0] for r in rows), max(r[1] for r in rows)
        work, nccl = Bitmap(first, last), Bitmap(first, last)
        for start, end, kernel, piece in rows:
            if kernel and "nccl" in kernel.lower():
                nccl.set(start, end)
            elif piece[:3] in ("fwd", "bwd"):
                work.set(start, end)
        busy += work.seconds()
        wait += nccl.seconds() - nccl.seconds(work)
        span += (last - first) / 1e9
    return busy, wait, span


@pytest.fixture(scope="module")
def pp_export(tmp_path_factory):
    export = tmp_path_factory.mktemp("pp") / "pp.sqlite"
    layout = with_pp_ranges(REAL_EXPORTS["2026.2"], export)
    return export, layout, summarize(load_trace(export))


def test_pp_bubble_on_a_gpu_trace_comes_from_each_stages_kernels(pp_export):
    export, layout, summary = pp_export
    db = sqlite3.connect(export)
    cpu_busy = sum(f for name, f in PP_SPLIT if name[:3] in ("fwd", "bwd")) / sum(f for _, f in PP_SPLIT)
    for pid, (_, _, pieces) in layout.items():
        stage = rank_of(summary, pid)["pipeline"]
        busy, wait, span = expected_stage(db, pid, pieces)
        assert stage["source"] == "gpu kernels"
        assert stage["span_s"] == pytest.approx(span, abs=1e-6)
        assert stage["busy_share"] == pytest.approx(busy / span, abs=2e-3)
        assert stage["bubble_share"] == pytest.approx(1 - busy / span, abs=2e-3)
        assert stage["wait_share"] == pytest.approx(wait / span, abs=2e-3)
        # The CPU ranges tell another story here; they stay beside the GPU numbers.
        assert stage["cpu_ranges"]["busy_share"] == pytest.approx(cpu_busy, abs=1e-3)
        assert abs(stage["busy_share"] - cpu_busy) > 0.05
    assert any(rank_of(summary, pid)["pipeline"]["wait_share"] > 0 for pid in layout)  # NCCL send/recv kernels


def test_pp_report_names_where_its_bubble_comes_from(pp_export):
    page = markdown(pp_export[2], "pp")
    section = page[page.index("## Pipeline (pp)"):]
    assert "| source |" in section and section.count("| gpu kernels |") == len(pp_export[1])


def hand_built_stage(path, with_runtime=True):
    """One stage (pid 5) of two, one batch 0-100 ms; ranges on the main thread, kernels later on the GPU.
    Backward's first kernel is launched by an autograd thread without ranges, as torch does."""
    db = sqlite3.connect(path)
    db.executescript(BASE_TABLES + "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME "
                     "(start INTEGER, end INTEGER, globalTid INTEGER, correlationId INTEGER);")
    main, autograd, other = 5 << 24 | 5, 5 << 24 | 6, 6 << 24 | 6
    ranges = [("epoch 0", 0, 100), ("batch 0", 0, 100), ("fwd mb0", 0, 10), ("send", 10, 12), ("fwd mb1", 12, 22),
              ("recv", 22, 60), ("bwd mb0", 60, 70), ("bwd mb1", 70, 80), ("optimizer", 80, 90)]
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)", [(a * MS, b * MS, n, main) for n, a, b in ranges])
    db.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, NULL, ?)",  # stage 1: another process
                   [(0, 100 * MS, "epoch 0", other), (0, 100 * MS, "batch 0", other), (0, 50 * MS, "fwd mb1", other)])
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "sgemm"), (2, "ncclDevKernel_SendRecv")])
    # (launch ms, thread, kernel start ms, end ms, name id)
    launches = [(1, main, 5, 25, 1), (11, main, 25, 30, 2), (13, main, 30, 50, 1), (23, main, 50, 70, 2),
                (61, autograd, 70, 85, 1), (71, main, 85, 95, 1), (81, main, 95, 99, 1)]
    for corr, (launch, tid, start, end, name) in enumerate(launches):
        if with_runtime:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?)", (launch * MS, launch * MS + 1, tid, corr))
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?, ?)",
                   (start * MS, end * MS, 5 << 24, name, corr))
    db.commit()
    db.close()
    return path


def test_pp_gpu_bubble_counts_nccl_waits_and_leaves_the_optimizer_out(tmp_path):
    stage = summarize(load_trace(hand_built_stage(tmp_path / "stage.sqlite")))["ranks"][0]["pipeline"]
    # GPU: span 5-95 ms; busy = compute launched in fwd/bwd (20+20+15+10); the NCCL kernels
    # (25-30, 50-70) are waiting; the optimizer's kernel (95-99) is not pipeline work.
    assert stage["source"] == "gpu kernels"
    assert stage["span_s"] == pytest.approx(0.090)
    assert stage["busy_share"] == pytest.approx(65 / 90) and stage["bubble_share"] == pytest.approx(25 / 90)
    assert stage["wait_share"] == pytest.approx(25 / 90)
    # CPU ranges: span 0-80 ms, fwd/bwd ranges 40 ms of it.
    assert stage["cpu_ranges"] == pytest.approx({"busy_share": 0.5, "bubble_share": 0.5, "wait_share": 0.5,
                                                 "span_s": 0.080})


def test_pp_on_an_export_without_launch_links_says_it_shows_cpu_ranges(tmp_path):
    summary = summarize(load_trace(hand_built_stage(tmp_path / "stage.sqlite", with_runtime=False)))
    stage = summary["ranks"][0]["pipeline"]
    assert stage["source"] == "cpu ranges" and "no GPU activity is linked" in stage["note"]
    assert stage["busy_share"] == pytest.approx(0.5)
    assert "Note: no GPU activity is linked" in markdown(summary, "stage")


# --- 7. GPU metrics of the GPU each rank used ---------------------------------------------------

GPUS = 4  # the machine's GPUs, as nsys numbers them; SMs Active on GPU g reads 10 * (g + 1) %


def with_gpu_metrics(source, target, cuda_devices=None):
    """A real export with our training ranges, GPU metrics sampled on all GPUS every 1 ms over the
    epochs, and, when given, TARGET_INFO_CUDA_DEVICE rows (gpuId, cudaId, pid) in nsys' layout."""
    layout = with_training_ranges(source, target)
    db = sqlite3.connect(target)
    db.executescript("""
        CREATE TABLE TARGET_INFO_GPU_METRICS (typeId INTEGER NOT NULL, sourceId INTEGER NOT NULL, typeName TEXT NOT NULL,
                                              metricId INTEGER NOT NULL, metricName TEXT NOT NULL);
        CREATE TABLE GPU_METRICS (timestamp INTEGER, typeId INTEGER NOT NULL, metricId INTEGER NOT NULL, value INTEGER NOT NULL);
    """)
    first = min(e["epoch"][0] for e in layout.values())
    last = max(e["epoch"][1] for e in layout.values())
    for gpu in range(GPUS):
        type_id = 0x10000 | gpu
        db.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (?, 0, 'GH100', 1, 'SMs Active [Throughput %]')", (type_id,))
        db.executemany("INSERT INTO GPU_METRICS VALUES (?, ?, 1, ?)",
                       [(t, type_id, 10 * (gpu + 1)) for t in range(first, last, MS)])
    if cuda_devices is not None:
        db.execute("CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER NOT NULL, cudaId INTEGER NOT NULL, "
                   "pid INTEGER NOT NULL, uuid TEXT NOT NULL, numMultiprocessors INTEGER NOT NULL)")
        db.executemany("INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?, '', 132)", cuda_devices)
    db.commit()
    db.close()
    return layout


def cuda_ordinals(export):
    with sqlite3.connect(export) as db:
        return dict(db.execute(f"SELECT {PID % 'globalPid'}, MIN(deviceId) FROM {KERNEL} GROUP BY 1"))


def test_gpu_metrics_follow_target_info_cuda_device_when_cuda_ids_differ_from_gpu_ids(tmp_path):
    export = tmp_path / "visible_subset.sqlite"
    ordinals = cuda_ordinals(REAL_EXPORTS["2026.2"])  # pid -> the CUDA ordinal CUPTI recorded
    # As under CUDA_VISIBLE_DEVICES=2,3: CUDA device n of each process is GPU n + 2. Another
    # process (pid 999) saw the same CUDA ordinals on GPUs 0 and 1.
    rows = [(cuda + 2, cuda, pid) for pid, cuda in ordinals.items()] + [(0, 0, 999), (1, 1, 999)]
    layout = with_gpu_metrics(REAL_EXPORTS["2026.2"], export, rows)
    summary = summarize(load_trace(export))
    assert summary["gpu_metrics_mapping"] == "TARGET_INFO_CUDA_DEVICE"
    for pid in layout:
        rank, gpu = rank_of(summary, pid), ordinals[pid] + 2
        assert rank["gpu"]["devices"] == [ordinals[pid]]
        assert rank["gpu_metrics_gpus"] == {str(ordinals[pid]): gpu}
        assert list(rank["gpu_metrics"]) == [str(gpu)]
        assert rank["gpu_metrics"][str(gpu)]["sm_active_pct"]["mean"] == pytest.approx(10 * (gpu + 1))
    page = markdown(summary, "subset")
    assert "Warning" not in page and f"| {gpu} (cuda {ordinals[pid]}) |" in page


@pytest.mark.parametrize("version", sorted(REAL_EXPORTS))
def test_export_without_target_info_cuda_device_says_gpu_ids_were_assumed(version, tmp_path):
    export = tmp_path / "old.sqlite"
    with sqlite3.connect(REAL_EXPORTS[version]) as db:  # neither real export has the table
        assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'TARGET_INFO_CUDA_DEVICE'").fetchone() == (0,)
    layout = with_gpu_metrics(REAL_EXPORTS[version], export)
    summary = summarize(load_trace(export))
    assert summary["gpu_metrics_mapping"].startswith("assumed: this export has no TARGET_INFO_CUDA_DEVICE")
    for pid in layout:
        cuda = rank_of(summary, pid)["gpu"]["devices"][0]
        assert list(rank_of(summary, pid)["gpu_metrics"]) == [str(cuda)]
    assert "**Warning: GPU ids assumed" in markdown(summary, "old")


def test_cuda_device_missing_from_the_table_gets_no_metrics_and_the_summary_says_so(tmp_path):
    export = tmp_path / "partial.sqlite"
    ordinals = cuda_ordinals(REAL_EXPORTS["2026.2"])
    listed, missing = sorted(ordinals)
    layout = with_gpu_metrics(REAL_EXPORTS["2026.2"], export, [(3, ordinals[listed], listed)])
    summary = summarize(load_trace(export))
    assert rank_of(summary, missing)["gpu_metrics"] == {}
    assert rank_of(summary, missing)["gpu_metrics_gpus"] == {str(ordinals[missing]): None}
    rank = layout[missing]["rank"]
    assert f"rank {rank} CUDA device {ordinals[missing]}" in summary["gpu_metrics_mapping"]
    assert "**Warning" in markdown(summary, "partial")


# --- 8. DALI's GPU work is data, not forward ---------------------------------------------------

DALI_KERNEL = ("void dali::kernels::slice_impl::SliceFlipNormalizePermutePadKernel<false, true, false, "
               "unsigned char, float, 5>(const dali::kernels::slice_impl::SampleDesc<5> *, "
               "const dali::kernels::slice_impl::BlockDesc *)", "SliceFlipNormalizePermutePadKernel")
NVJPEG_KERNEL = ("void nvjpeg::dctQuantInvJpegKernel<ushort2, 1, 32, 8>(nvjpeg::InvDctParams)",
                 "dctQuantInvJpegKernel")
TORCH_KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                "std::array<char *, 1>>(int, T2, T3)", "vectorized_elementwise_kernel")


def with_dali_work(source, target):
    """A real export with our training ranges, plus per process, launched while the main thread is
    in `forward` of batch 1 (the old rule put them all in forward):
      - a DALI kernel and a copy from a thread named `[DALI][WT]` (ThreadNames);
      - an nvJPEG kernel from a thread nsys recorded no name for;
      - a memset from a thread that only opens DALI's own `[DALI][GPU op] ...` NVTX ranges;
      - a DALI kernel launched from the main thread itself (the kernel's namespace decides);
      - a torch kernel from an autograd thread (stays the training thread's forward);
      - a DALI kernel launched before the first batch (outside training: unattributed);
      - DALI's `[DALI][Executor] PopOutputs` range on the main thread during `data` (DALI opens
        ranges on the thread that asks for its outputs; the main thread's own launches keep their phases).
    Returns pid -> {"data_gpu": s, "forward_extra": s, "outside": s}."""
    layout = with_training_ranges(source, target)
    db = sqlite3.connect(target)
    names = {k: (add_string(db, full), add_string(db, short))
             for k, (full, short) in {"dali": DALI_KERNEL, "nvjpeg": NVJPEG_KERNEL, "torch": TORCH_KERNEL}.items()}
    dali_name = add_string(db, "[DALI][WT]")
    correlation = db.execute(f"SELECT MAX(correlationId) FROM {RUNTIME}").fetchone()[0] + 1000
    expected = {}
    for pid, entry in layout.items():
        base = entry["tid"] - pid  # (1 << 48) | pid << 24 for this pid
        worker, decoder, op_thread, autograd = (base + pid + 9000 + k for k in range(4))
        db.execute("INSERT INTO ThreadNames (nameId, priority, globalTid) VALUES (?, 0, ?)", (dali_name, worker))
        forward = [(a, b) for name, a, b in entry["phases"] if name == "forward"][1]
        add_range(db, "[DALI][GPU op] CropMirrorNormalize", forward[0], forward[1], op_thread)
        data = [(a, b) for name, a, b in entry["phases"] if name == "data"][1]
        add_range(db, "[DALI][Executor] PopOutputs", data[0], data[1], entry["tid"])
        gpu_pid = db.execute(f"SELECT globalPid FROM {KERNEL} WHERE {PID % 'globalPid'} = ? LIMIT 1",
                             (pid,)).fetchone()[0]
        at = forward[0] + 100
        work = [(worker, KERNEL, "dali", 1_500_000, "data_gpu"), (worker, MEMCPY, None, 400_000, "data_gpu"),
                (decoder, KERNEL, "nvjpeg", 2_000_000, "data_gpu"),
                (op_thread, "CUPTI_ACTIVITY_KIND_MEMSET", None, 100_000, "data_gpu"),
                (entry["tid"], KERNEL, "dali", 800_000, "data_gpu"), (autograd, KERNEL, "torch", 900_000, "forward_extra")]
        totals = {"data_gpu": 0, "forward_extra": 0, "outside": 0}
        for k, (tid, table, kind, duration, key) in enumerate(work + [(worker, KERNEL, "dali", 60_000, "outside")]):
            launch = at + 10 * k if key != "outside" else entry["epoch"][0] - 200
            clone_row(db, RUNTIME, start=launch, end=launch + 5, globalTid=tid, correlationId=correlation)
            kernel = {"demangledName": names[kind][0], "shortName": names[kind][1]} if kind else {}
            clone_row(db, table, start=launch + 1000, end=launch + 1000 + duration, globalPid=gpu_pid,
                      correlationId=correlation, **kernel)
            totals[key] += duration / 1e9
            correlation += 1
        expected[pid] = totals
    db.commit()
    db.close()
    return expected


@pytest.fixture(scope="module")
def dali_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dali")
    with_training_ranges(REAL_EXPORTS["2026.2"], folder / "plain.sqlite")
    expected = with_dali_work(REAL_EXPORTS["2026.2"], folder / "dali.sqlite")
    return expected, summarize(load_trace(folder / "plain.sqlite")), summarize(load_trace(folder / "dali.sqlite"))


def test_dali_and_nvjpeg_gpu_work_counts_as_data_gpu_not_forward(dali_export):
    expected, plain, dali = dali_export
    for pid, extra in expected.items():
        before, after = rank_of(plain, pid)["gpu"], rank_of(dali, pid)["gpu"]
        assert after["phase_kernel_s"]["data_gpu"] == pytest.approx(extra["data_gpu"], abs=1e-12)
        assert after["phase_kernel_s"]["forward"] == pytest.approx(before["phase_kernel_s"]["forward"]
                                                                  + extra["forward_extra"], abs=1e-12)
        for phase in ("data", "h2d", "backward", "optimizer"):
            assert after["phase_kernel_s"][phase] == pytest.approx(before["phase_kernel_s"][phase], abs=1e-12)
        assert after["unattributed_s"] == pytest.approx(before["unattributed_s"] + extra["outside"], abs=1e-12)
        assert after["pipeline_threads"] == 3  # the named worker and the two threads with DALI ranges
        assert after["data_gpu_share"] == pytest.approx(extra["data_gpu"] / after["training_s"])


def test_report_shows_data_gpu_beside_data_stall(dali_export):
    _, _, dali = dali_export
    share = dali["overall"]["gpu_phase_shares"]["data_gpu"]
    assert share > 0
    line = one_line(dali)
    assert f"data-stall {dali['overall']['gpu_data_stall_share'] * 100:.1f} %, data (GPU) {share * 100:.1f} %," in line
    page = markdown(dali, "dali")
    assert "| data-stall | data (GPU) |" in page
    assert "| data | h2d | forward | backward | optimizer | data (GPU) | unattributed |" in page


DALI_CAPTURE = REPO / "tests" / "data" / "nsys" / "ddp_dali_cpu_nsys2022.4.sqlite"  # see its README


def test_real_dali_capture_threads_are_recognised_and_the_training_thread_keeps_its_phases():
    """DALI 2.4 under nsys 2022.4 (a CPU run of ddp_dali): its threads are named `[DALI]...`, and it
    opens a `[DALI][Executor] PopOutputs` range on the training thread. A launch from a DALI thread
    during forward is data (GPU); one from the training thread stays forward."""
    trace = load_trace(DALI_CAPTURE)
    (process,) = trace.processes
    with sqlite3.connect(DALI_CAPTURE) as db:
        named = {t for (t,) in db.execute("SELECT t.globalTid FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId "
                                          "WHERE s.value LIKE '[DALI]%'")}
    training = next(r.tid for r in process.ranges if r.name == "batch 0")
    assert len(named) >= 4 and training not in named
    assert any(r.name == "[DALI][Executor] PopOutputs" and r.tid == training for r in process.ranges)
    assert pipeline_threads(process, trace.thread_names) == named | {training}
    batches = sorted((r for r in process.ranges if r.name.startswith("batch ")), key=lambda r: r.start)
    phases = [r for r in process.ranges if r.name in PHASES and any(b.start <= r.start < b.end for b in batches)]
    forward = next(r for r in phases if r.name == "forward")
    at, worker = (forward.start + forward.end) // 2, min(named)
    activity = [GpuActivity(process.pid, 0, at, at + 1000, "k", training, at),
                GpuActivity(process.pid, 0, at, at + 3000, "k", worker, at)]
    epochs = [r for r in process.ranges if r.name == "epoch 0"]
    gpu = gpu_stats(activity, phases, PHASES, epochs, training, batches, pipeline_threads(process, trace.thread_names))
    assert gpu["phase_kernel_s"]["forward"] == pytest.approx(1e-6)
    assert gpu["phase_kernel_s"]["data_gpu"] == pytest.approx(3e-6)
