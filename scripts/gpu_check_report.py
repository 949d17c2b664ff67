"""What scripts/gpu_check.py records: the machine it ran on, and one table (markdown and
JSON) with a row per check. docs/GPU_CHECK.md."""
import datetime
import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import List, Optional, Tuple

from scripts.gpu_check_run import Result

REHEARSAL_WARNING = ("REHEARSAL on this CPU, no GPU used: every check ran through the same code with gloo, "
                     "DALI's CPU pipelines and tiny data. Its times say nothing about GPU times.")


def nvidia_driver() -> Optional[str]:
    """The driver version nvidia-smi reports, or None without nvidia-smi or a driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout.strip() else None


def environment(rehearsal: bool = False) -> dict:
    """The machine: GPUs (none in a rehearsal, which hides them), driver, versions, load."""
    import torch
    from handler.runtime.machine import findings
    from handler.train.metrics import dali_version
    count = 0 if rehearsal else torch.cuda.device_count()
    cpu = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "rehearsal": rehearsal, "gpu": torch.cuda.get_device_name(0) if count else f"none (CPU: {cpu})",
            "gpus": count, "driver": nvidia_driver(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "dali": dali_version(), "cpu": cpu, "load_average": [round(x, 2) for x in os.getloadavg()],
            "machine_checks": findings(count) if count else []}  # handler/runtime/machine.py


def write_reports(results: List[Result], env: dict, out: Path, stem: str = "gpu_check") -> Tuple[Path, Path]:
    """One markdown table and one JSON; every row names the machine it ran on."""
    out.mkdir(parents=True, exist_ok=True)
    machine = {k: env.get(k) for k in ("gpu", "driver", "torch", "dali")}
    rows = [{**asdict(r), **machine} for r in results]
    failed = [r.check for r in results if r.result == "fail"]
    not_run = [r.check for r in results if r.result == "not run"]
    lines = [f"GPU check {env.get('date')}: {env.get('gpus')} x {env.get('gpu')}, driver {env.get('driver')}, "
             f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), DALI {env.get('dali') or 'not installed'}"]
    lines += ["", REHEARSAL_WARNING] if env.get("rehearsal") else []
    lines += ["", *env["machine_checks"]] if env.get("machine_checks") else []
    lines += ["", "| check | result | seconds | GPU | driver | torch | DALI | detail | rehearsal |",
              "|---|---|---:|---|---|---|---|---|---|"]
    lines += [f"| {r['check']} | {r['result']} | {r['seconds']:.1f} | {r['gpu']} | {r['driver']} | {r['torch']} "
              f"| {r['dali'] or '-'} | {cell(r['detail'])} | {cell(r['note'])} |" for r in rows]
    total = round(sum(r.seconds for r in results), 1)
    done = len(results) - len(failed) - len(not_run)
    lines += ["", f"{done} of {len(results)} passed or skipped in {total:.0f} s"
              + (f"; FAILED: {', '.join(failed)}" if failed else "")
              + (f"; NOT RUN (--budget): {', '.join(not_run)}" if not_run else "")]
    md, js = out / f"{stem}.md", out / f"{stem}.json"
    md.write_text("\n".join(lines) + "\n")
    js.write_text(json.dumps({"schema": 2, "env": env, "passed": not failed and not not_run, "total_s": total,
                              "checks": rows}, indent=2) + "\n")
    return md, js


def cell(text: str) -> str:
    return text.replace("|", "/") or "-"
