"""How scripts/gpu_check.py runs its checks: each one a launch of train_cifar.py (or pytest,
or launch.sh under nsys) in its own session, its log under OUT/runs/, its metrics checked.
docs/GPU_CHECK.md.
"""
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence

from scripts.gpu_check_plan import GPU, Check, Scale, estimate_s

ROOT = Path(__file__).resolve().parents[1]
PYTEST_TIMEOUT_S = 600
NO_TESTS_COLLECTED = 5  # pytest's exit status


class BudgetSpent(Exception):
    """A launch was stopped at --budget's end: the check's row fails and says so."""


@dataclass
class Result:
    check: str
    result: str  # pass | fail | skip | not run
    seconds: float
    detail: str = ""
    note: str = ""  # the rehearsal's translation of the check


def lookup(metrics: dict, dotted: str) -> object:
    """metrics["env"]["backend"] for "env.backend"; None where the path ends early."""
    value: object = metrics
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def verify(metrics_path: Path, check: Check, epochs: int = 1, scale: Scale = GPU) -> str:
    """"" when the run's metrics show a finished run on the scale's device as the check
    expects, else why not."""
    if not metrics_path.is_file():
        return "no metrics file"
    m = json.loads(metrics_path.read_text())
    problems = []
    if m["env"]["device"] != scale.device:
        problems.append(f"ran on {m['env']['device']}")
    if [e["epoch"] for e in m["epochs"]] != list(range(epochs)):
        problems.append(f"epochs {[e['epoch'] for e in m['epochs']]}")
    if not m["epochs"] or not all(math.isfinite(e["train_loss"]) for e in m["epochs"]):
        problems.append("no finite training loss")
    if not m.get("test") or m["test"]["samples"] != scale.test:
        problems.append(f"test samples {(m.get('test') or {}).get('samples')} != {scale.test}")
    for key, want in check.expect:
        if lookup(m, key) != want:
            problems.append(f"{key}={lookup(m, key)!r}, expected {want!r}")
    return "; ".join(problems)


class Runner:
    def __init__(self, python: str, out: Path, scale: Scale = GPU, env: Optional[Dict[str, str]] = None,
                 budget_s: float = 0, spent_s: float = 0):
        self.python, self.out, self.scale = python, out, scale
        self.env = env or {}  # for every launch (the rehearsal hides the GPUs)
        self.data = out / "data"
        # --budget's end: a launch still running then is stopped, so that a check slower than
        # its estimate cannot carry the whole command past the budget (one 10-minute command).
        self.budget_s = budget_s
        self.deadline = time.monotonic() + budget_s - spent_s if budget_s else math.inf

    def train_cmd(self, check: Check, folder: Path, *extra: str, images: int = 0) -> List[str]:
        return [self.python, str(ROOT / "train_cifar.py"), *self.scale.data_args(),
                "--synthetic-train", str(images or self.scale.train), "--data", str(self.data),
                "--ckpt", str(folder), "--metrics", str(folder / "metrics.json"), *check.args, *extra]

    def run(self, cmd: Sequence[str], folder: Path, timeout: float = 0, env: Optional[Dict[str, str]] = None,
            ) -> "subprocess.Popen[bytes]":
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "log.txt", "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            proc = self.start(cmd, log, env)
            limit = timeout or self.scale.timeout_s
            left = self.deadline - time.monotonic()
            try:
                proc.wait(timeout=max(min(limit, left), 0))
            except subprocess.TimeoutExpired:
                if left < limit:
                    raise BudgetSpent(f"--budget {self.budget_s:g} s ran out during this check; "
                                      f"see {folder}/log.txt") from None
                raise
            finally:
                self.stop(proc)
            return proc

    def start(self, cmd: Sequence[str], log: IO[str], env: Optional[Dict[str, str]] = None,
              ) -> "subprocess.Popen[bytes]":
        # Its own session, so a timeout stops the spawned ranks (and nsys) too.
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env, **(env or {})})

    @staticmethod
    def stop(proc: "subprocess.Popen[bytes]") -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __call__(self, check: Check) -> str:
        """Run one check; "" when it passed, else why it failed."""
        folder = self.out / "runs" / check.name.replace(" ", "_").replace("/", "_")
        shutil.rmtree(folder, ignore_errors=True)
        if check.kind == "pytest":
            return self.pytest(check, folder)
        if check.kind in ("train", "tree"):  # tests no resume: keeps no checkpoint
            tree = ("--data", str(self.png_tree()), "--dataset", "cifar10") if check.kind == "tree" else ()
            proc = self.run(self.train_cmd(check, folder, "--epochs", "1", "--save", "none", *tree), folder)
            return self.failed(proc, folder) or verify(folder / "metrics.json", check, 1, self.scale)
        if check.kind == "driver":
            backend = dict(check.expect).get("env.backend")
            proc = self.run([self.python, str(ROOT / "scripts" / "kit_driver.py"), *check.args, "--data",
                             str(self.png_tree()), "--out", str(folder / "ranks"),
                             *(("--expect-backend", str(backend)) if backend else ())], folder)
            return self.failed(proc, folder)
        try:
            if check.kind == "resume":
                first = self.run(self.train_cmd(check, folder, "--epochs", "2", "--stop-after", "1"), folder)
                then = self.run(self.train_cmd(check, folder, "--epochs", "2", "--resume"), folder)
                return (self.failed(first, folder) or self.failed(then, folder)
                        or verify(folder / "metrics.json", check, 2, self.scale))
            if check.kind == "sigterm":
                return self.sigterm(check, folder)
            if check.kind == "profile":
                return self.profile(check, folder)
            raise ValueError(check.kind)
        finally:
            drop_checkpoints(folder)

    def png_tree(self) -> Path:
        """The kit's PNG tree at this scale (train and test images), written once under the data folder."""
        root = self.data / "png_tree"
        if not (root / "valid").is_dir():
            from scripts.kit_driver import write_png_tree
            write_png_tree(root, self.scale.train, self.scale.test)
        return root

    @staticmethod
    def failed(proc: "subprocess.Popen[bytes]", folder: Path) -> str:
        return "" if proc.returncode == 0 else f"exit {proc.returncode}; see {folder}/log.txt"

    def pytest(self, check: Check, folder: Path) -> str:
        """pytest over check.args; selecting no test is a failure that names the selection."""
        cmd = [self.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *check.args]
        proc = self.run(cmd, folder, timeout=PYTEST_TIMEOUT_S)
        if proc.returncode == NO_TESTS_COLLECTED:
            return f"no test selected by `{shlex.join(check.args)}`: not in this checkout; see {folder}/log.txt"
        return "" if proc.returncode == 0 else f"pytest exit {proc.returncode}; see {folder}/log.txt"

    def sigterm(self, check: Check, folder: Path) -> str:
        """SIGTERM in the second epoch of a long run, then --resume finishes it."""
        folder.mkdir(parents=True, exist_ok=True)
        big = self.scale.big_train
        cmd = self.train_cmd(check, folder, "--epochs", "2", images=big)
        with open(folder / "log.txt", "a") as log:
            log.write(f"$ {' '.join(cmd)}  (SIGTERM once epoch 0 is saved)\n")
            log.flush()
            proc = self.start(cmd, log)
            try:
                deadline = time.time() + self.scale.timeout_s
                while not (folder / "last.pt").exists() and proc.poll() is None and time.time() < deadline:
                    time.sleep(0.05)
                time.sleep(self.scale.sigterm_delay_s)  # into epoch 1
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=120)
            finally:
                self.stop(proc)
        if code != 128 + signal.SIGTERM:
            return f"exit {code} after SIGTERM, expected {128 + signal.SIGTERM}; see {folder}/log.txt"
        resumed = self.run(self.train_cmd(check, folder, "--epochs", "2", "--resume", images=big), folder)
        return self.failed(resumed, folder) or verify(folder / "metrics.json", check, 2, self.scale)

    def profile(self, check: Check, folder: Path) -> str:
        """launch.sh under nsys (PROFILE=1); on a GPU its summary must hold a GPU trace."""
        env = {"PYTHON": self.python, "MODE": "ddp", "NUM_GPUS": "1", "PROFILE": "1",
               "NSIGHT_LOG_DIR": str(folder), "NSIGHT_FILE_NAME": "ddp_gpu1", "CKPT_DIR": str(folder / "ckpt")}
        args = [*self.scale.data_args(), "--synthetic-train", str(self.scale.train), "--data", str(self.data),
                "--epochs", "1"]
        proc = self.run(["bash", str(ROOT / "scripts" / "launch.sh"), *args], folder, env=env)
        summary = folder / "ddp_gpu1.summary.json"
        if proc.returncode or not summary.is_file():
            return self.failed(proc, folder) or "no profile summary"
        gpu_trace = json.loads(summary.read_text()).get("gpu_trace")
        wanted = self.scale.device == "cuda"  # a CPU run has no CUDA activity to trace
        return (verify(folder / "ddp_gpu1.metrics.json", check, 1, self.scale)
                or ("the profile holds no CUDA activity" if wanted and not gpu_trace else ""))


def drop_checkpoints(folder: Path) -> None:
    """A resume check's checkpoints have served once it is done: a whole run then leaves its
    logs, metrics and profile (docs/GPU_CHECK.md "What a run leaves"), not a ResNet-18's
    checkpoints per check."""
    for checkpoint in folder.rglob("*.pt"):
        checkpoint.unlink()


def run_all(checks: List[Check], runner: Callable[[Check], str], say: Callable[..., None] = print,
            budget_s: float = 0, scale: Scale = GPU, clock: Callable[[], float] = time.perf_counter,
            after: Callable[[List[Result]], object] = lambda results: None,
            measured: Optional[Dict[str, float]] = None, spent_s: float = 0) -> List[Result]:
    """Each check in turn, one progress line each, and `after(results so far)` after each (the
    report is rewritten: a command killed from outside leaves the rows it finished). With a
    budget, a check whose estimate (its last measured seconds where there are some) no longer
    fits in what is left (`spent_s` of it went before this call) is not started; its row says so."""
    results: List[Result] = []
    began = clock()
    for i, check in enumerate(checks, 1):
        head = f"[{i}/{len(checks)}] {check.name} ..."
        left = budget_s - spent_s - (clock() - began) if budget_s else math.inf
        estimate = estimate_s(check, scale, measured)
        if check.skip:
            say(f"{head} skipped: {check.skip}", flush=True)
            results.append(Result(check.name, "skip", 0.0, check.skip, check.note))
        elif estimate > left:
            why = (f"not started: its {'measured time' if measured and check.name in measured else 'estimate'} "
                   f"{estimate:.0f} s is over the {max(left, 0):.0f} s left of --budget {budget_s:g}")
            say(f"{head} NOT RUN: {why}", flush=True)
            results.append(Result(check.name, "not run", 0.0, why, check.note))
        else:
            say(head, end=" ", flush=True)
            problem, seconds = timed(runner, check, clock)
            results.append(Result(check.name, "fail" if problem else "pass", round(seconds, 1), problem, check.note))
            say(f"{'FAIL' if problem else 'ok'} {seconds:.1f} s{': ' + problem if problem else ''}", flush=True)
        after(results)
    return results


def timed(runner: Callable[[Check], str], check: Check, clock: Callable[[], float]) -> "tuple[str, float]":
    started = clock()
    try:
        problem = runner(check)
    except subprocess.TimeoutExpired as e:
        problem = f"timed out after {e.timeout:.0f} s"
    except Exception as e:  # a check that breaks is a failed check, never the end of the others
        problem = f"{type(e).__name__}: {e}"
    return problem, clock() - started
