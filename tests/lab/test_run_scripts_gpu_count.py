"""scripts/run_<mode>.sh on a 1-GPU box runs its 1-GPU run and skips the 2-GPU one in one line
(scripts/lab_runs.sh), instead of stopping at 2 with exit 2. No GPU here: the one place that
counts GPUs (python -m handler.runtime.devices, torch's count) answers 1 from a stand-in
Python, which runs everything else as the real one with CUDA hidden."""
import os
import sys

import pytest

from tests.conftest import ROOT, run_process

TINY = ["--epochs", "1", "--model", "resnet20", "--dataset", "synthetic", "--synthetic-train", "64",
        "--synthetic-test", "32", "--valid-size", "0", "--batch-size", "16", "--workers", "0", "--no-progress"]


def one_gpu_python(folder):
    folder.mkdir()
    python = folder / "python"
    python.write_text(f"""#!/bin/sh
if [ "$1 $2" = "-m handler.runtime.devices" ]; then echo 1; exit 0; fi  # torch's count on a 1-GPU box
CUDA_VISIBLE_DEVICES= exec {sys.executable} "$@"
""")
    python.chmod(0o755)
    return python


@pytest.mark.slow  # 88 s: CI's slow step (pytest.ini), to keep the main suite in its 10 minutes on the slower 2-core box
def test_the_kits_run_flow_on_one_gpu_runs_one_and_skips_two_in_one_line(tmp_path):
    for name in ("scripts", "handler", "models", "train_cifar.py"):  # outputs land in tmp_path
        os.symlink(ROOT / name, tmp_path / name)
    # The box's GPU is visible to the caller (the suite hides GPUs with CUDA_VISIBLE_DEVICES=).
    caller = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    run = run_process(["bash", "scripts/lab_runs.sh", "ddp", *TINY], cwd=tmp_path, budget=30, inherit=False,
                      env={**caller, "PROFILE": "0", "PYTHON": str(one_gpu_python(tmp_path / "bin")), "TIMESTAMP": "t0"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    logs = tmp_path / "nsight_logs" / "ddp_t0"
    assert (logs / "gpu_1.metrics.json").is_file() and not (logs / "gpu_2.metrics.json").exists()
    skipped = [line for line in run.stderr.splitlines() if line.startswith("lab_runs: ")]
    assert skipped == ["lab_runs: skipping the 2-GPU run of ddp: 1 GPU(s) visible"], run.stderr
