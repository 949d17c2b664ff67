"""Proof on a GPU machine, in one command: every mode, precision and option for one short
epoch, resume, a SIGTERM stop and its resume, a profiled run, the `gpu`-marked tests, and a
2-GPU pass when two or more GPUs are visible. README "GPU check".

pp at 1 GPU runs one stage: NCCL refuses two ranks on one device ("Duplicate GPU detected"),
so its send/recv between stages, and the checkpoint gathered from two, are the 2-GPU pass's.

    bash scripts/gpu_check.sh [--out DIR] [--no-tests]      # PYTHON=python3 for an existing torch

Writes DIR/gpu_check.md (one table) and DIR/gpu_check.json. Exit status: 0 all passed (or
skipped, each said loudly), 1 any failure, 2 no usable CUDA GPU.
"""
import argparse
import datetime
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# CIFAR-sized synthetic data: 32x32 images, few enough that an epoch takes seconds.
TRAIN, TEST, BIG_TRAIN = 2_560, 1_000, 50_000
DATA = ["--dataset", "synthetic", "--synthetic-test", str(TEST), "--valid-size", "256",
        "--model", "resnet18", "--batch-size", "256", "--workers", "4", "--no-progress"]
CHECK_TIMEOUT_S = 240
ONE_GPU_MODES_TEST = "test_every_mode_trains_end_to_end_on_one_gpu"  # tests/machine/test_gpu.py
DALI_SOURCES = ("memory", "raw", "jpeg")


@dataclass(frozen=True)
class Check:
    name: str
    kind: str  # train | resume | sigterm | profile | pytest
    args: Tuple[str, ...] = ()  # train_cifar.py arguments beyond the data set-up
    gpus: int = 1
    skip: str = ""  # why it cannot run here ("" = it runs)
    expect: Tuple[Tuple[str, object], ...] = ()  # (metrics path "env.backend", value) pairs


@dataclass
class Result:
    check: str
    result: str  # pass | fail | skip
    seconds: float
    detail: str = ""


def train(name, *args, gpus=1, skip="", **expect) -> Check:
    return Check(name, "train", ("--num_gpu", str(gpus), *args), gpus, skip,
                 tuple((k.replace("__", "."), v) for k, v in expect.items()))


def plan(gpus: int, *, dali: bool, nsys: bool, pytest_ok: bool, tests: bool = True, bf16: bool = True) -> List[Check]:
    """The checks for a machine with `gpus` visible GPUs; what cannot run carries its reason."""
    no_dali = "" if dali else "NVIDIA DALI is not installed"
    no_bf16 = "" if bf16 else "this GPU has no bf16 (torch.cuda.is_bf16_supported() is False)"
    checks = [Check("gpu-marked tests", "pytest",
                    skip="" if pytest_ok else "pytest is not installed")] if tests else []
    checks += [
        train("dp", "--mode", "dp"),
        train("dp --dp-balanced", "--mode", "dp", "--dp-balanced"),
        train("ddp", "--mode", "ddp", env__backend="nccl"),
        *(train(f"ddp_dali {src}", "--mode", "ddp_dali", "--dali-source", src, skip=no_dali,
                config__dali_source=src) for src in DALI_SOURCES),
        train("fsdp", "--mode", "fsdp"),
        # One stage: NCCL refuses two ranks on one GPU, so send/recv between stages is the 2-GPU pass's.
        train("pp (1 stage)", "--mode", "pp", env__backend="nccl"),
        train("bf16", "--mode", "ddp", "--amp", "bf16", skip=no_bf16, config__amp="bf16"),
        train("fp16 (GradScaler)", "--mode", "ddp", "--amp", "fp16", config__amp="fp16"),
        train("channels_last", "--mode", "ddp", "--channels-last"),
        train("accumulation x2", "--mode", "ddp", "--accum-steps", "2"),
        train("activation checkpointing", "--mode", "ddp", "--activation-checkpointing"),
        Check("--resume continues", "resume", ("--mode", "ddp", "--num_gpu", "1")),
        Check("pp --resume continues", "resume", ("--num_gpu", "1", "--mode", "pp")),
        Check("SIGTERM stop, then --resume", "sigterm", ("--mode", "ddp", "--num_gpu", "1")),
        Check("profiled run (nsys)", "profile", ("--mode", "ddp",),
              skip="" if nsys else "nsys is not on PATH (scripts/install_nsys.sh)"),
    ]
    if gpus >= 2:
        amp = "bf16" if bf16 else "fp16"
        checks += [
            train("2 GPUs: dp splits the batch", "--mode", "dp", gpus=2),
            train("2 GPUs: dp --dp-balanced", "--mode", "dp", "--dp-balanced", gpus=2),
            train(f"2 GPUs: dp {amp} + activation checkpointing", "--mode", "dp", "--amp", amp,
                  "--activation-checkpointing", gpus=2),
            train("2 GPUs: ddp over NCCL", "--mode", "ddp", gpus=2, env__backend="nccl", env__world_size=2),
            train("2 GPUs: ddp --sync-bn", "--mode", "ddp", "--sync-bn", gpus=2, config__sync_bn=True),
            train("2 GPUs: ddp_dali jpeg", "--mode", "ddp_dali", "--dali-source", "jpeg", gpus=2,
                  skip=no_dali, env__world_size=2),
            train("2 GPUs: fsdp", "--mode", "fsdp", gpus=2, env__world_size=2),
            train("2 GPUs: pp, 2 stages over NCCL", "--mode", "pp", gpus=2, env__backend="nccl", env__world_size=2),
            Check("2 GPUs: pp --resume (gathered checkpoint)", "resume", ("--num_gpu", "2", "--mode", "pp"), gpus=2),
        ]
    return checks


def lookup(metrics: dict, dotted: str):
    value = metrics
    for part in dotted.split("."):
        value = value[part]
    return value


def verify(metrics_path: Path, check: Check, epochs: int = 1) -> str:
    """"" when the run's metrics show a finished CUDA run as the check expects, else why not."""
    if not metrics_path.is_file():
        return "no metrics file"
    m = json.loads(metrics_path.read_text())
    problems = []
    if m["env"]["device"] != "cuda":
        problems.append(f"ran on {m['env']['device']}")
    if [e["epoch"] for e in m["epochs"]] != list(range(epochs)):
        problems.append(f"epochs {[e['epoch'] for e in m['epochs']]}")
    if not m["epochs"] or not all(math.isfinite(e["train_loss"]) for e in m["epochs"]):
        problems.append("no finite training loss")
    if not m.get("test") or m["test"]["samples"] != TEST:
        problems.append(f"test samples {(m.get('test') or {}).get('samples')} != {TEST}")
    for key, want in check.expect:
        if lookup(m, key) != want:
            problems.append(f"{key}={lookup(m, key)!r}, expected {want!r}")
    return "; ".join(problems)


class Runner:
    def __init__(self, python: str, out: Path):
        self.python, self.out = python, out
        self.data = out / "data"

    def train_cmd(self, check: Check, folder: Path, *extra, images=TRAIN) -> list:
        return [self.python, str(ROOT / "train_cifar.py"), *DATA, "--synthetic-train", str(images),
                "--data", str(self.data), "--ckpt", str(folder), "--metrics", str(folder / "metrics.json"),
                *check.args, *extra]

    def run(self, cmd, folder: Path, timeout=CHECK_TIMEOUT_S, env=None) -> subprocess.Popen:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "log.txt", "a") as log:
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            proc = self.start(cmd, log, env)
            try:
                proc.wait(timeout=timeout)
            finally:
                self.stop(proc)
            return proc

    @staticmethod
    def start(cmd, log, env=None) -> subprocess.Popen:
        # Its own session, so a timeout stops the spawned ranks (and nsys) too.
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})

    @staticmethod
    def stop(proc) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __call__(self, check: Check) -> str:
        """Run one check; "" when it passed, else why it failed."""
        folder = self.out / "runs" / check.name.replace(" ", "_").replace("/", "_")
        shutil.rmtree(folder, ignore_errors=True)
        if check.kind == "pytest":
            # The 1-GPU every-mode test is what the train checks below do at ResNet-18 size.
            cmd = [self.python, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", str(ROOT / "tests"),
                   "-k", f"not {ONE_GPU_MODES_TEST}"]
            proc = self.run(cmd, folder, timeout=600)
            return "" if proc.returncode == 0 else f"pytest exit {proc.returncode}; see {folder}/log.txt"
        if check.kind == "train":
            proc = self.run(self.train_cmd(check, folder, "--epochs", "1"), folder)
            return self.failed(proc, folder) or verify(folder / "metrics.json", check)
        if check.kind == "resume":
            first = self.run(self.train_cmd(check, folder, "--epochs", "2", "--stop-after", "1"), folder)
            then = self.run(self.train_cmd(check, folder, "--epochs", "2", "--resume"), folder)
            return self.failed(first, folder) or self.failed(then, folder) or verify(folder / "metrics.json", check, 2)
        if check.kind == "sigterm":
            return self.sigterm(check, folder)
        if check.kind == "profile":
            return self.profile(check, folder)
        raise ValueError(check.kind)

    @staticmethod
    def failed(proc, folder: Path) -> str:
        return "" if proc.returncode == 0 else f"exit {proc.returncode}; see {folder}/log.txt"

    def sigterm(self, check: Check, folder: Path) -> str:
        """SIGTERM in the second epoch of a 50,000-image run, then --resume finishes it."""
        folder.mkdir(parents=True, exist_ok=True)
        cmd = self.train_cmd(check, folder, "--epochs", "2", images=BIG_TRAIN)
        with open(folder / "log.txt", "a") as log:
            log.write(f"$ {' '.join(cmd)}  (SIGTERM once epoch 0 is saved)\n")
            log.flush()
            proc = self.start(cmd, log)
            try:
                deadline = time.time() + CHECK_TIMEOUT_S
                while not (folder / "last.pt").exists() and proc.poll() is None and time.time() < deadline:
                    time.sleep(0.05)
                time.sleep(1.0)  # into epoch 1
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=120)
            finally:
                self.stop(proc)
        if code != 128 + signal.SIGTERM:
            return f"exit {code} after SIGTERM, expected {128 + signal.SIGTERM}; see {folder}/log.txt"
        resumed = self.run(self.train_cmd(check, folder, "--epochs", "2", "--resume", images=BIG_TRAIN), folder)
        return self.failed(resumed, folder) or verify(folder / "metrics.json", check, 2)

    def profile(self, check: Check, folder: Path) -> str:
        """launch.sh under nsys (PROFILE=1), and its summary must contain a GPU trace."""
        env = {"PYTHON": self.python, "MODE": "ddp", "NUM_GPUS": "1", "PROFILE": "1",
               "NSIGHT_LOG_DIR": str(folder), "NSIGHT_FILE_NAME": "ddp_gpu1", "CKPT_DIR": str(folder / "ckpt")}
        args = [*DATA, "--synthetic-train", str(TRAIN), "--data", str(self.data), "--epochs", "1"]
        proc = self.run(["bash", str(ROOT / "scripts" / "launch.sh"), *args], folder, env=env)
        summary = folder / "ddp_gpu1.summary.json"
        if proc.returncode or not summary.is_file():
            return self.failed(proc, folder) or "no profile summary"
        gpu_trace = json.loads(summary.read_text()).get("gpu_trace")
        return (verify(folder / "ddp_gpu1.metrics.json", check)
                or ("" if gpu_trace else "the profile holds no CUDA activity"))


def run_all(checks: List[Check], runner, say=print) -> List[Result]:
    results = []
    for check in checks:
        if check.skip:
            say(f"gpu_check: SKIPPED {check.name}: {check.skip}")
            results.append(Result(check.name, "skip", 0.0, check.skip))
            continue
        started = time.perf_counter()
        try:
            problem = runner(check)
        except subprocess.TimeoutExpired as e:
            problem = f"timed out after {e.timeout:.0f} s"
        except Exception as e:  # a check that breaks is a failed check, never the end of the others
            problem = f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - started
        results.append(Result(check.name, "fail" if problem else "pass", round(seconds, 1), problem))
        say(f"gpu_check: {'FAIL' if problem else 'pass'} {check.name} ({seconds:.1f} s){': ' + problem if problem else ''}")
    return results


def environment() -> dict:
    import torch
    from handler.train.metrics import dali_version
    smi = shutil.which("nvidia-smi")
    driver = None
    if smi:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True)
        driver = done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else None
    count = torch.cuda.device_count()
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "gpu": torch.cuda.get_device_name(0), "gpus": count, "driver": driver,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda, "dali": dali_version()}


def write_reports(results: List[Result], env: dict, out: Path) -> Tuple[Path, Path]:
    """One markdown table and one JSON; every row names the machine it ran on."""
    out.mkdir(parents=True, exist_ok=True)
    machine = {k: env.get(k) for k in ("gpu", "driver", "torch", "dali")}
    rows = [{**asdict(r), **machine} for r in results]
    failed = [r.check for r in results if r.result == "fail"]
    md = out / "gpu_check.md"
    lines = [f"GPU check {env.get('date')}: {env.get('gpus')} x {env.get('gpu')}, driver {env.get('driver')}, "
             f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), DALI {env.get('dali') or 'not installed'}",
             "", "| check | result | seconds | GPU | driver | torch | DALI | detail |",
             "|---|---|---:|---|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['result']} | {r['seconds']:.1f} | {r['gpu']} | {r['driver']} | {r['torch']} "
              f"| {r['dali'] or '-'} | {r['detail'].replace('|', '/')} |" for r in rows]
    total = round(sum(r.seconds for r in results), 1)
    lines += ["", f"{len(results) - len(failed)} of {len(results)} passed or skipped in {total:.0f} s"
              + (f"; FAILED: {', '.join(failed)}" if failed else "")]
    md.write_text("\n".join(lines) + "\n")
    js = out / "gpu_check.json"
    js.write_text(json.dumps({"schema": 1, "env": env, "passed": not failed, "total_s": total, "checks": rows}, indent=2) + "\n")
    return md, js


def module_present(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # nvidia.dali: the namespace package may exist without dali
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="gpu_check", help="folder for the table, the JSON and the runs' logs")
    p.add_argument("--no-tests", dest="tests", action="store_false", help="leave out the gpu-marked tests")
    args = p.parse_args(argv)
    from handler.runtime.devices import cuda_status
    gpus, why = cuda_status()
    if not gpus:
        why = why.removesuffix("; running on CPU") or "none visible"
        print(f"gpu_check: no usable CUDA GPU ({why}); run it on a GPU machine", file=sys.stderr)
        return 2
    dali, nsys = module_present("nvidia.dali"), shutil.which("nsys") is not None
    if not dali:
        print("gpu_check: WARNING: NVIDIA DALI is not installed: SKIPPING every ddp_dali check "
              "(pip install nvidia-dali-cuda130==2.4.0, or -cuda120 on a CUDA 12 driver)", file=sys.stderr)
    import torch
    checks = plan(gpus, dali=dali, nsys=nsys, pytest_ok=module_present("pytest"), tests=args.tests,
                  bf16=torch.cuda.is_bf16_supported())
    out = Path(args.out).resolve()
    env = environment()
    print(f"gpu_check: {len(checks)} checks on {gpus} x {env['gpu']}; logs under {out}/runs")
    results = run_all(checks, Runner(sys.executable, out))
    md, js = write_reports(results, env, out)
    print(md.read_text(), end="")
    print(f"gpu_check: wrote {md} and {js}")
    return 1 if any(r.result == "fail" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
