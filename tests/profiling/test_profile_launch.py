"""scripts/launch.sh's profiling set-up without a real install: nsys auto-install with a fake
installer, and the GPU metrics flag for old and new nsys with a fake nsys."""
import os
import shutil
import subprocess

import pytest

from tests.nsys_helpers import REPO, path_without_nsys

LAUNCH = REPO / "scripts" / "launch.sh"
OPTIONS = REPO / "scripts" / "nsys_options.sh"

# A stand-in nsys: `--version`, `profile --help` (listing $HELP_FLAG), and `profile ... --output=X cmd...`
# (or `--output X`)
# which prints $PROBE_OUTPUT when the command is `true` (launch's metrics probe), makes the report
# unless PROBE_REPORT=0 and exits $PROBE_STATUS (0), and otherwise runs the command.
FAKE_NSYS = """#!/usr/bin/env bash
if [[ $1 == --version ]]; then echo "NVIDIA Nsight Systems version 2099.1.1-fake"; exit 0; fi
if [[ $1 == profile && $2 == --help ]]; then echo "  $HELP_FLAG=<value>  GPU metrics"; exit 0; fi
shift
while [[ $# -gt 0 && $1 != --output && $1 != --output=* ]]; do shift; done
if [[ $1 == --output=* ]]; then output="${1#--output=}"; shift; else output="$2"; shift 2; fi
if [[ $1 == true ]]; then
    echo "$PROBE_OUTPUT"
    [[ ${PROBE_REPORT:-1} == 1 ]] && touch "$output.nsys-rep"
    exit "${PROBE_STATUS:-0}"
fi
exec "$@"
"""


def fake_nsys(folder, help_flag="--gpu-metrics-devices", probe_output="Generated: probe.nsys-rep", report=True,
              status=0):
    folder.mkdir(exist_ok=True)
    (folder / "nsys").write_text(FAKE_NSYS)
    (folder / "nsys").chmod(0o755)
    return {"HELP_FLAG": help_flag, "PROBE_OUTPUT": probe_output, "PROBE_REPORT": str(int(report)),
            "PROBE_STATUS": str(status)}


def gpu_metrics_options(tmp_path, **fake):
    env = {**os.environ, **fake_nsys(tmp_path / "bin", **fake),
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{path_without_nsys(tmp_path)}"}
    return subprocess.run(["bash", "-c", f'source "{OPTIONS}"; gpu_metrics_options'], env=env,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("help_flag", ["--gpu-metrics-devices", "--gpu-metrics-device"])
def test_gpu_metrics_flag_is_spelled_for_the_installed_nsys(tmp_path, help_flag):
    result = gpu_metrics_options(tmp_path, help_flag=help_flag)
    assert result.returncode == 0 and result.stdout.split() == [f"{help_flag}=all"], result.stderr
    assert result.stderr == ""


def test_refused_gpu_counters_give_one_line_with_the_fix_and_no_metrics(tmp_path):
    result = gpu_metrics_options(tmp_path, probe_output="ERR_NVGPUCTRPERM - The user does not have permission")
    assert result.returncode == 0 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "ERR_NVGPUCTRPERM" in lines[0]
    assert "NVreg_RestrictProfilingToAdminUsers=0" in lines[0] and "continuing without GPU metrics" in lines[0]


# The probe's output recorded from nsys 2022.4 on this machine (progress bars trimmed), then
# the line nsys's importer adds when it skipped something it could: "error" is in it, yet the
# report was made and GPU metrics work.
PROBE_OK = "Generating '/tmp/nsys-report-14d9.qdstrm'\n[1/1] [========================100%] probe.nsys-rep\n" \
           "Generated:\n    /tmp/i35/probe.nsys-rep"
NON_FATAL = "Importer error status: Importation succeeded with non-fatal errors."


@pytest.mark.parametrize("output", [PROBE_OK, f"{PROBE_OK}\n{NON_FATAL}"])
def test_a_probe_that_made_its_report_keeps_gpu_metrics_even_with_non_fatal_importer_errors(tmp_path, output):
    result = gpu_metrics_options(tmp_path, probe_output=output)
    assert result.stdout.split() == ["--gpu-metrics-devices=all"] and result.stderr == ""


@pytest.mark.parametrize("output, report, status, reason", [
    ("Illegal --gpu-metrics-devices argument: all. GPU metrics are not supported on this GPU.", False, 1,
     "Illegal --gpu-metrics-devices argument"),
    (PROBE_OK.replace("Generated:", "Failed to create the report:"), False, 0, "Failed to create"),
    ("", False, 0, "exit 0, no report"),
    ("Generating '/tmp/nsys-report.qdstrm'", True, 139, "exit 139, a report")])
def test_a_probe_that_failed_goes_without_gpu_metrics_in_one_line(tmp_path, output, report, status, reason):
    result = gpu_metrics_options(tmp_path, probe_output=output, report=report, status=status)
    lines = result.stderr.strip().splitlines()
    assert result.stdout == "" and len(lines) == 1 and reason in lines[0], result.stderr
    assert "continuing without GPU metrics" in lines[0]


def test_nsys_without_gpu_metrics_says_so_in_one_line(tmp_path):
    result = gpu_metrics_options(tmp_path, help_flag="--trace")
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "no --gpu-metrics-device[s] option" in result.stderr


def may_install_packages() -> bool:
    """The rule launch.sh applies: root, or password-less sudo."""
    if os.geteuid() == 0:
        return True
    return shutil.which("sudo") is not None and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def test_missing_nsys_is_installed_first_and_the_run_is_profiled(tmp_path):
    if not may_install_packages():
        pytest.skip("launch.sh installs nsys only as root or with password-less sudo")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = fake_nsys(tmp_path / "fake")
    installer = tmp_path / "installer.sh"
    installer.write_text(f'echo installing >&2; cp "{tmp_path / "fake" / "nsys"}" "{bin_dir}/nsys"\n')
    env = {**os.environ, **fake, "PATH": f"{bin_dir}{os.pathsep}{path_without_nsys(tmp_path)}",
           "NSYS_INSTALLER": str(installer), "MODE": "ddp", "NUM_GPUS": "2", "GPU_METRICS": "1",
           "NSIGHT_LOG_DIR": str(tmp_path / "logs"), "CKPT_DIR": str(tmp_path / "ckpt")}
    run = subprocess.run(["bash", str(LAUNCH), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert f"nsys not found: installing it first with {installer}" in run.stderr
    assert (bin_dir / "nsys").is_file() and "UNPROFILED" not in run.stderr
    assert "usage:" in run.stdout  # train_cifar.py ran under the (fake) nsys
    assert "GPU_METRICS=1 but no GPU is visible; continuing without GPU metrics" in run.stderr


def test_bad_gpu_metrics_value_fails_in_one_line(tmp_path):
    run = subprocess.run(["bash", str(LAUNCH)], cwd=tmp_path, env={**os.environ, "GPU_METRICS": "yes"},
                         capture_output=True, text=True, timeout=30)
    assert run.returncode != 0 and run.stderr.strip().splitlines() == \
        ["launch: GPU_METRICS='yes' is not 0 or 1; use GPU_METRICS=1 to sample GPU metrics (GPU runs)"]
