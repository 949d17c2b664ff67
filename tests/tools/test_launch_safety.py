"""A profiled launch never hangs and never leaves world-writable files (docs/PROFILING.md).

A fake nsys first on PATH behaves as nsys does where it matters: it starts the program with
umask 000, writes a report, and can then hang as nsys 2022.4 once did (a stuck child left
behind, SIGTERM ignored). One test runs the real nsys when it is installed.
"""
import os
import signal
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import run_process
from tests.nsys_helpers import REPO, once_more_if_nsys_failed_to_start, path_without_nsys, profile, require_nsys
from tests.parallel import one_at_a_time

LAUNCH = REPO / "scripts" / "launch.sh"
WATCH = REPO / "scripts" / "nsys_watch.sh"
FAKE_VERSION = "2022.4.2.1-fake"
TINY = ["--dataset", "synthetic", "--synthetic-train", "64", "--synthetic-test", "32", "--batch-size", "32",
        "--workers", "0", "--valid-size", "0", "--no-progress", "--epochs", "1", "--model", "resnet20"]
FAKE_NSYS = f"""#!/bin/bash
# nsys stand-in. FAKE_NSYS_AFTER: exit (default), hang (a stuck child, SIGTERM ignored),
# busy (working for FAKE_NSYS_BUSY_S, as while writing a big report, then exit), nostart
# (nsys 2022.4's failure to open its session, before the program starts: no report), nostart_once
# (that failure the first time only, then a normal run), interrupted (Ctrl-C before the program
# started: nsys exits 130), or
# noreport (the program ran, and no report, as nsys 2022.4 leaves for a program that stops at once).
[[ $1 == --version ]] && {{ echo "NVIDIA Nsight Systems version {FAKE_VERSION}"; exit 0; }}
[[ $1 == profile ]] || exit 1
shift
while [[ $1 == -* ]]; do
    if [[ $1 == --output ]]; then out=$2; shift; fi
    [[ $1 == --output=* ]] && out=${{1#--output=}}
    shift
done
# busy: like nsys's agent, a fifth of a core while the program runs and exits (a program
# that waits a second on a busy disk at exit must not look like a stuck tree), then the same
# for FAKE_NSYS_BUSY_S, as while writing a big report (2 % of a core counts as progress).
work() {{
    local end=$((SECONDS + $1)) t
    while ((SECONDS < end)); do
        t=${{EPOCHREALTIME/./}}; while (( ${{EPOCHREALTIME/./}} - t < 20000 )); do :; done; sleep 0.08
    done
}}
[[ ${{FAKE_NSYS_AFTER:-}} == interrupted ]] && exit 130  # Ctrl-C before the program started
if [[ ${{FAKE_NSYS_AFTER:-}} == nostart || ( ${{FAKE_NSYS_AFTER:-}} == nostart_once && ! -e $out.tried ) ]]; then
    touch "$out.tried"
    echo "Error: QuadDCommon::RuntimeException: Local Endpoint is not available." >&2
    exit 1
fi
[[ ${{FAKE_NSYS_AFTER:-}} == busy ]] && {{ work 3600 & agent=$!; }}
# hang: an agent as nsys 2022.4 starts one, a daemon (init its parent, a session of its own)
# whose --session-name ends in this nsys's PID.
if [[ ${{FAKE_NSYS_AFTER:-}} == hang ]]; then
    (setsid "{sys.executable}" -c "import time; time.sleep(3600)" --start-agent \
        --session-name="profile-python-$$" </dev/null >/dev/null 2>&1 & echo $! >"$FAKE_NSYS_AGENT_PID")
fi
(umask 000; exec "$@")
status=$?
[[ ${{FAKE_NSYS_AFTER:-}} == noreport ]] || echo "partial report" >"$out.nsys-rep"
case "${{FAKE_NSYS_AFTER:-exit}}" in
    hang) trap '' TERM
          sleep 3600 & echo $! >"$FAKE_NSYS_STUCK_PID"
          wait ;;
    busy) kill $agent; work "$FAKE_NSYS_BUSY_S" ;;
esac
exit $status
"""


@pytest.fixture
def fake_nsys(tmp_path) -> str:
    """PATH with the fake nsys first and the real one absent."""
    folder = tmp_path / "fake-bin"
    folder.mkdir()
    (folder / "nsys").write_text(FAKE_NSYS)
    (folder / "nsys").chmod(0o755)
    return f"{folder}{os.pathsep}{path_without_nsys(tmp_path)}"


def launch(tmp_path, *args, budget, **env):
    """launch.sh from a shell whose umask is 022, with its outputs in folders it creates."""
    settings = {"MODE": "dp", "NUM_GPUS": "1", "PROFILE": "1", "PYTHON": sys.executable,
                "DATA_DIR": str(tmp_path / "out" / "data"), "CKPT_DIR": str(tmp_path / "out" / "ckpt"),
                "NSIGHT_LOG_DIR": str(tmp_path / "out" / "logs"), **env}
    return run_process(["bash", "-c", 'umask 0022 && exec bash "$0" "$@"', LAUNCH, *TINY, *args],
                       cwd=tmp_path, env=settings, budget=budget)


def world_writable(folder: Path) -> list:
    found = [p for p in [folder, *folder.rglob("*")] if not p.is_symlink() and p.stat().st_mode & stat.S_IWOTH]
    return [f"{oct(p.stat().st_mode & 0o777)} {p}" for p in found]


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].split()[0] != "Z"


@pytest.mark.slow  # 16 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_hung_nsys_is_ended_after_the_timeout_with_a_one_line_cause(tmp_path, fake_nsys):
    stuck, agent = tmp_path / "stuck.pid", tmp_path / "agent.pid"
    started = time.monotonic()
    try:
        run = launch(tmp_path, budget=30, PATH=fake_nsys, FAKE_NSYS_AFTER="hang", FAKE_NSYS_STUCK_PID=str(stuck),
                     FAKE_NSYS_AGENT_PID=str(agent), NSYS_EXIT_TIMEOUT="3")
        agent_left = process_exists(int(agent.read_text()))
    finally:  # the stand-in agent this test's fake nsys started, if the watchdog missed it
        if agent.exists() and process_exists(int(agent.read_text())):
            os.kill(int(agent.read_text()), signal.SIGKILL)
    elapsed = time.monotonic() - started
    logs = tmp_path / "out" / "logs"
    finished = (logs / "dp_cpu1.metrics.json").stat().st_mtime
    assert run.returncode == 124, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"launch: nsys {FAKE_VERSION} did not exit") and "NSYS_EXIT_TIMEOUT=3" in last, last
    assert "no progress for 3 s after training finished" in last and "SIGKILL" in last, last
    assert (logs / "dp_cpu1.nsys-rep").read_text() == "partial report\n"  # kept
    # After training: 3 s without progress, 3 s for SIGTERM, polling, and the analysis of the report.
    assert time.time() - finished < 30, (elapsed, run.stderr[-2000:])
    assert not process_exists(int(stuck.read_text())), "the stuck child nsys left behind is still running"
    assert not agent_left, "nsys's agent, a daemon outside its process tree, outlived the ended nsys"


@pytest.mark.slow  # 17 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_busy_nsys_writing_its_report_is_never_ended(tmp_path, fake_nsys):
    """Report generation after a long run can outlast NSYS_EXIT_TIMEOUT; only a tree that makes
    no progress is ended."""
    run = launch(tmp_path, budget=25, PATH=fake_nsys, FAKE_NSYS_AFTER="busy", FAKE_NSYS_BUSY_S="7",
                 NSYS_EXIT_TIMEOUT="2")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "did not exit" not in run.stderr


@pytest.mark.slow  # the backstop, 10 timeouts long: CI's slow step (pytest.ini)
def test_a_busy_nsys_is_still_ended_ten_timeouts_after_training_finished(tmp_path, fake_nsys):
    run = launch(tmp_path, budget=25, PATH=fake_nsys, FAKE_NSYS_AFTER="busy", FAKE_NSYS_BUSY_S="600",
                 NSYS_EXIT_TIMEOUT="1")
    assert run.returncode == 124, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert "nsys was still running 10 s after training finished" in last and "report is kept" in last, last


@contextmanager
def core_hogs():
    """`yes > /dev/null` on every core, as a busy machine: started here, ended here by PID."""
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def watch(tmp_path, script: str, timeout_s: int, budget: float) -> tuple:
    """scripts/nsys_watch.sh over a bash `script` standing in for nsys, training finished.
    Returns (seconds until the watchdog exited, its cause line or "", the stand-in's exit status)."""
    metrics, pidfile, cause = tmp_path / "metrics.json", tmp_path / "nsys.pid", tmp_path / "cause"
    metrics.write_text('{"total_time_s": 1.0}\n')
    # In this session, as the hogs: with autogroup scheduling, a process in a session of its
    # own would get its group's fair share whatever its nice value.
    nsys = subprocess.Popen(["bash", "-c", script])
    try:
        pidfile.write_text(f"{nsys.pid}\n")
        started = time.monotonic()
        run = run_process(["bash", WATCH, pidfile, metrics, cause, str(timeout_s)], budget=budget)
        elapsed = time.monotonic() - started
        assert run.returncode == 0, run.stderr
        return elapsed, cause.read_text().strip() if cause.exists() else "", nsys.wait(timeout=30)
    finally:
        if nsys.poll() is None:  # the stand-in this test started
            nsys.kill()
            nsys.wait()


# A report writer starved on a loaded machine: niced to 19 beside a hog on every core, working
# in 20 ms bursts (by the clock) for 8 s; it gets well under 2 % of a core.
STARVED_WRITER = """exec nice -n 19 bash -c '
end=$((SECONDS + 8))
while ((SECONDS < end)); do
    t=${EPOCHREALTIME/./}; while (( ${EPOCHREALTIME/./} - t < 20000 )); do :; done; sleep 0.08
done'"""


def test_a_starved_but_working_nsys_on_a_loaded_machine_is_never_ended(tmp_path):
    """It waits in the run queue for the CPU it wants: that counts as progress (schedstat)."""
    with core_hogs():
        elapsed, cause, status = watch(tmp_path, STARVED_WRITER, timeout_s=2, budget=10)
    assert cause == "" and status == 0, (cause, status)
    assert elapsed > 7  # it watched the writer to its end


def test_a_stuck_nsys_on_a_loaded_machine_is_still_ended_after_the_timeout(tmp_path):
    with core_hogs():
        elapsed, cause, status = watch(tmp_path, "sleep 120", timeout_s=2, budget=8)
    assert cause.startswith("nsys made no progress for 2 s after training finished"), cause
    assert status == -15 or status == 143, status  # SIGTERM, by PID
    assert elapsed < 20


def test_an_nsys_that_fails_to_start_the_training_is_named_with_the_fix_on_the_last_line(tmp_path, fake_nsys):
    """nsys 2022.4's own start failure ('Local Endpoint is not available'), every time: no report,
    no metrics. Before, nsys's message was the last word, and a student read a training failure."""
    run = launch(tmp_path, budget=20, PATH=fake_nsys, FAKE_NSYS_AFTER="nostart")
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1, run.stdout + run.stderr
    assert last.startswith(f"launch: nsys {FAKE_VERSION} exited 1 before the training started, twice"), last
    assert "run again, or PROFILE=0 to train unprofiled" in last, last
    assert run.stderr.count("Local Endpoint is not available.") == 2  # tried once more, only once
    assert run.stderr.count("trying once more") == 1


def test_a_tmpdir_it_cannot_write_is_one_line_naming_tmpdir(tmp_path, fake_nsys):
    """Found by hand: TMPDIR=/proc ended launch.sh in mktemp's own message."""
    run = launch(tmp_path, budget=20, PATH=fake_nsys, TMPDIR="/proc")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stderr.strip().splitlines()[-1] == ("launch: cannot make a folder in TMPDIR=/proc for the profiled run; "
                                                   "point TMPDIR at a writable folder")
    assert "mktemp" not in run.stderr


def test_a_run_stopped_with_ctrl_c_before_the_training_started_is_not_tried_again(tmp_path, fake_nsys):
    run = launch(tmp_path, budget=20, PATH=fake_nsys, FAKE_NSYS_AFTER="interrupted")
    assert run.returncode == 130, run.stdout + run.stderr
    assert "trying once more" not in run.stderr and "before the training started" not in run.stderr


def test_an_nsys_that_failed_to_start_the_training_once_is_tried_once_more_and_the_run_trains(tmp_path, fake_nsys):
    """The same failure once (it failed CI runs, each time once among dozens of nsys runs): nothing
    had run, so launch.sh tries once more, says so, and the run trains as asked."""
    run = launch(tmp_path, budget=25, PATH=fake_nsys, FAKE_NSYS_AFTER="nostart_once")
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert f"launch: nsys {FAKE_VERSION} exited 1 before the training started (its message is above); " \
           "trying once more" in run.stderr
    assert "before the training started, twice" not in run.stderr
    assert (tmp_path / "out" / "logs" / "dp_cpu1.metrics.json").is_file()
    assert (tmp_path / "out" / "logs" / "dp_cpu1.nsys-rep").is_file()


def test_a_training_that_fails_under_nsys_is_not_blamed_on_nsys(tmp_path, fake_nsys):
    """The program ran and stopped in one line, and, as nsys 2022.4 does then, no report was
    written: the trainer's line is the news, not nsys."""
    run = launch(tmp_path, "--epochs", "0", budget=20, PATH=fake_nsys, FAKE_NSYS_AFTER="noreport")
    assert "--epochs 0: train for at least 1 epoch" in run.stderr
    assert run.returncode != 0 and "before the training started" not in run.stdout + run.stderr, run.stdout


@pytest.mark.parametrize("timeout", ["0", "2m", "-5"])
def test_a_bad_nsys_exit_timeout_fails_in_one_line(tmp_path, timeout):
    run = run_process(["bash", LAUNCH, "--help"], cwd=tmp_path, budget=10,
                      env={"NSYS_EXIT_TIMEOUT": timeout, "MODE": "dp", "PROFILE": "0", "PYTHON": sys.executable})
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        f"launch: NSYS_EXIT_TIMEOUT='{timeout}' is not a positive number of seconds; e.g. NSYS_EXIT_TIMEOUT=300"]


@pytest.mark.slow  # 11 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_a_profiled_run_under_umask_000_leaves_nothing_world_writable(tmp_path, fake_nsys):
    run = launch(tmp_path, budget=25, PATH=fake_nsys)
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "out"
    assert (out / "ckpt" / "last.pt").is_file() and (out / "logs" / "dp_cpu1.metrics.json").is_file()
    assert any((out / "data").iterdir())
    assert world_writable(out) == []


@pytest.mark.slow  # a profiled run for one check: CI's slow step (pytest.ini)
def test_a_run_profiled_by_the_real_nsys_leaves_nothing_world_writable(tmp_path):
    require_nsys()
    with one_at_a_time("nsys"):
        run = once_more_if_nsys_failed_to_start(lambda: launch(tmp_path, budget=40, MODE="ddp", NUM_GPUS="2"))
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "out"
    assert (out / "logs" / "ddp_cpu2.nsys-rep").is_file() and (out / "ckpt" / "last.pt").is_file()
    assert world_writable(out) == []


def test_the_lab_nsys_options_do_not_wait_for_a_process_the_program_left_behind(tmp_path):
    """nsys waits for re-parented descendants by default (--wait=all); a leftover of the
    program would hold the profile open, and launch.sh with it."""
    pid_file = tmp_path / "orphan.pid"
    with one_at_a_time("nsys"):  # the clock starts when no other worker's nsys runs
        started = time.monotonic()
        profile(["bash", "-c", f'sleep 60 >/dev/null 2>&1 & echo $! >"{pid_file}"'], tmp_path / "orphan", timeout=90)
        assert time.monotonic() - started < 40
        # Ended before the next nsys may start: the orphan keeps this session's agent alive.
        orphan = int(pid_file.read_text())
        if process_exists(orphan):  # a sleep this test started
            os.kill(orphan, 9)


def test_a_run_whose_nsys_failed_to_open_its_session_is_tried_once_more_and_no_other_is(capsys):
    """tests/nsys_helpers.py: nsys 2022.4's own start failure (once in CI) is not a failed test."""
    def runs(*outputs):
        made = iter(outputs)
        return lambda: subprocess.CompletedProcess(["nsys"], *next(made))

    def tried(*outputs):
        return once_more_if_nsys_failed_to_start(runs(*outputs), pause_s=0)

    endpoint = (1, "", "Throw in function ... GetLocalEndpoint() const\n[QuadDCommon::tag_message*] = "
                       "Local Endpoint is not available.\n")
    assert tried(endpoint, (0, "Generated", "")).returncode == 0
    assert "Local Endpoint is not available); trying once more" in capsys.readouterr().err
    assert tried(endpoint, endpoint).returncode == 1  # once only
    assert tried((1, "", "training failed"), (0, "", "")).returncode == 1
    assert tried((0, "Local Endpoint is not available", "")).returncode == 0
    # nsys's lost agent connection: its whole output (CI, 2026-11-28), and launch.sh's line for any
    # nsys that never started the training.
    assert tried((1, "", "End of file\n"), (0, "Generated", "")).returncode == 0
    assert "(End of file); trying once more" in capsys.readouterr().err
    launch_line = "launch: nsys 2022.4.2.1 exited 1 before the training started (no report, ...)"
    assert tried((1, "", launch_line), (0, "", "")).returncode == 0
    assert tried((1, "", "ValueError: end of file in the data loader"), (0, "", "")).returncode == 1


PROBE_NSYS = f"""#!/bin/bash
# nsys stand-in for the probes: makes the report, and leaves its agent running as nsys 2022.4
# sometimes does after a tiny run (a daemon whose --session-name ends in this nsys's PID).
[[ $1 == profile ]] || exit 1
while [[ $# -gt 1 ]]; do [[ $1 == --output ]] && out=$2; [[ $1 == --output=* ]] && out=${{1#--output=}}; shift; done
(setsid "{sys.executable}" -c "import time; time.sleep(3600)" --start-agent \\
    --session-name="profile-true-$$" </dev/null >/dev/null 2>&1 & echo $! >"$PROBE_AGENT_PID")
echo report >"$out.nsys-rep"
"""


@pytest.mark.parametrize("probe", ["nsys_makes_reports", "gpu_metrics_options"])
def test_an_nsys_probe_ends_the_agent_its_tiny_run_left_behind(tmp_path, probe):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "nsys").write_text(PROBE_NSYS)
    (folder / "nsys").chmod(0o755)
    agent = tmp_path / "agent.pid"
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "PROBE_AGENT_PID": str(agent)}
    if probe == "gpu_metrics_options":  # the probe runs only where nsys has the option
        (folder / "nsys").write_text(PROBE_NSYS.replace("[[ $1 == profile ]] || exit 1",
                                                        '[[ $2 == --help ]] && { echo "--gpu-metrics-device"; exit 0; }\n'
                                                        "[[ $1 == profile ]] || exit 1"))
    try:
        run = subprocess.run(["bash", "-c", f'source "{REPO / "scripts" / "nsys_options.sh"}" && {probe}'],
                             env=env, capture_output=True, text=True, timeout=60)
        left = process_exists(int(agent.read_text()))
    finally:  # the stand-in agent, if the probe missed it
        if agent.exists() and process_exists(int(agent.read_text())):
            os.kill(int(agent.read_text()), signal.SIGKILL)
    assert run.returncode == 0, run.stderr
    assert not left, "the probe's nsys left its agent running"
