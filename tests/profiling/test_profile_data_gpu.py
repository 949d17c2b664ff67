"""DALI's and nvJPEG's GPU work is `data_gpu`, not the training thread's forward.

On a copy of the real 2026.2 export with DALI-like threads, kernels and copies added in its own
schema, and on a real ddp_dali capture (CPU, nsys 2022.4, DALI 2.4) for DALI's thread names.
"""
import sqlite3

import pytest

from handler.profiling.analysis import PHASES, summarize
from handler.profiling.gpu_view import gpu_stats, pipeline_threads
from handler.profiling.render import markdown, one_line
from handler.profiling.columns import from_rows
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS, REPO, with_training_ranges
from tests.nsys_rows import KERNEL, MEMCPY, MEMSET, RUNTIME, add_range, add_string, clone_row
from tests.profiling.test_profile_gpu import PID, rank_of

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
                (op_thread, MEMSET, None, 100_000, "data_gpu"),
                (entry["tid"], KERNEL, "dali", 800_000, "data_gpu"),
                (autograd, KERNEL, "torch", 900_000, "forward_extra")]
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
    activity = from_rows([(process.pid, 0, at, at + 1000, "k", training, at),
                          (process.pid, 0, at, at + 3000, "k", worker, at)])
    epochs = [r for r in process.ranges if r.name == "epoch 0"]
    gpu = gpu_stats(activity, phases, PHASES, epochs, training, batches, pipeline_threads(process, trace.thread_names))
    assert gpu["phase_kernel_s"]["forward"] == pytest.approx(1e-6)
    assert gpu["phase_kernel_s"]["data_gpu"] == pytest.approx(3e-6)
