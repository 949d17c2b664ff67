"""scripts/install_nsys.sh on a fake machine: it never installs, replaces or removes an NVIDIA
driver package where a driver runs, and uses an nsys that is already there.

The machine is a folder (NSYS_INSTALL_SYSROOT) plus fake apt-get, dpkg, nvidia-smi and sudo
first on PATH; the fake apt-get records every call, so a test sees whether a real (not
simulated) install was asked for. Nothing here touches the real apt or /usr/local/bin.
"""
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import run_process
from tests.nsys_helpers import REPO, path_without_nsys

INSTALLER = REPO / "scripts" / "install_nsys.sh"
LAUNCH = REPO / "scripts" / "launch.sh"
DRIVER = "550.54.15"
PROC_VERSION = f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {DRIVER}  Tue Mar  5 22:23:34 UTC 2024\n"
# What `apt-get -s install nsight-systems` planned on a Debian 12 machine without Debian's driver.
PLAN_WITH_DRIVER = """\
NOTE: This is only a simulation!
Inst nvidia-installer-cleanup (20220217+3~deb12u1 Debian:12.12/stable [amd64])
Inst nvidia-alternative (535.261.03-1 Debian:12.12/stable [amd64])
Inst libcuda1:amd64 (535.261.03-1 Debian:12.12/stable [amd64])
Inst libnvidia-ml1:amd64 (535.261.03-1 Debian:12.12/stable [amd64])
Inst nvidia-smi (535.261.03-1 Debian:12.12/stable [amd64])
Inst libcupti11.8:amd64 (11.8.87~11.8.0-5~deb12u1 Debian:12.12/stable [amd64])
Inst nsight-systems-target:amd64 (2022.4.2.1~11.8.0-5~deb12u1 Debian:12.12/stable [amd64])
Inst nsight-systems (2022.4.2.1~11.8.0-5~deb12u1 Debian:12.12/stable [amd64])
Conf libcuda1:amd64 (535.261.03-1 Debian:12.12/stable [amd64])
"""
# The same where the driver came from Debian's packages: nothing of the driver changes.
PLAN_WITHOUT_DRIVER = "\n".join(line for line in PLAN_WITH_DRIVER.splitlines()
                                if "nsight" in line or "cupti" in line or line.startswith("NOTE")) + "\n"
FAKE_NSYS = "#!/bin/sh\necho 'NVIDIA Nsight Systems version 2099.1.1-fake'\n"


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class FakeMachine:
    """A Debian 12 machine in a folder, with or without an NVIDIA driver."""

    def __init__(self, tmp_path: Path, *, driver_file=False, working_smi=False, plan=PLAN_WITH_DRIVER,
                 dpkg_lists=()):
        self.root, self.bin, self.calls = tmp_path / "root", tmp_path / "bin", tmp_path / "apt-get.calls"
        (self.root / "etc" / "apt" / "sources.list.d").mkdir(parents=True)
        (self.root / "etc" / "os-release").write_text('ID=debian\nVERSION_CODENAME=bookworm\n'
                                                       'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\n')
        if driver_file:
            (self.root / "proc" / "driver" / "nvidia").mkdir(parents=True)
            (self.root / "proc" / "driver" / "nvidia" / "version").write_text(PROC_VERSION)
        (self.bin / "plan").parent.mkdir(parents=True)
        (self.bin / "plan").write_text(plan)
        # The package's files, as Debian lays them out: nsys under /usr/lib/nsight-systems/bin.
        installed = self.root / "usr" / "lib" / "nsight-systems" / "bin" / "nsys"
        executable(self.bin / "apt-get", f"""#!/bin/bash
echo "$*" >>"{self.calls}"
case "$1" in
    update) exit 0 ;;
    -s) cat "{self.bin / 'plan'}" ;;
    install) mkdir -p "{installed.parent}" && printf '%s' "{FAKE_NSYS}" >"{installed}" && chmod +x "{installed}" ;;
    *) exit 100 ;;
esac
""")
        listing = "\n".join(dpkg_lists)
        executable(self.bin / "dpkg", f"""#!/bin/bash
[[ "$1 $2" == "-L nsight-systems" && -n "{listing}" ]] || exit 1
printf '%s\\n' "{listing}"
""")
        smi = f"echo {DRIVER}" if working_smi else \
            "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9"
        executable(self.bin / "nvidia-smi", f"#!/bin/bash\n{smi}\n")
        executable(self.bin / "sudo", '#!/bin/bash\n[[ $1 == -n ]] && shift\nexec "$@"\n')

    def env(self, tmp_path) -> dict:
        return {"NSYS_INSTALL_SYSROOT": str(self.root),
                "PATH": f"{self.bin}{os.pathsep}{path_without_nsys(tmp_path)}"}

    def install(self, tmp_path, *args):
        return run_process(["bash", INSTALLER, *args], env=self.env(tmp_path), budget=3)

    def apt_calls(self) -> list:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def real_installs(self) -> list:
        return [c for c in self.apt_calls() if c.split()[:1] == ["install"]]

    @property
    def link(self) -> Path:
        return self.root / "usr" / "local" / "bin" / "nsys"


@pytest.mark.parametrize("evidence", ["/proc/driver/nvidia/version", "a working nvidia-smi"])
def test_with_a_driver_a_plan_that_brings_libcuda1_stops_in_one_line_before_installing(tmp_path, evidence):
    machine = FakeMachine(tmp_path, driver_file=evidence.startswith("/proc"), working_smi="smi" in evidence)
    run = machine.install(tmp_path)
    assert run.returncode != 0
    assert machine.apt_calls() == ["update", "-s install -y nsight-systems"]  # simulated, never installed
    assert not machine.real_installs() and not machine.link.exists()
    last = run.stderr.strip().splitlines()[-1]
    for named in ("libcuda1", "libnvidia-ml1", "nvidia-smi", "nvidia-alternative", "nvidia-installer-cleanup",
                  f"driver {DRIVER}", "by hand", "https://developer.nvidia.com/nsight-systems"):
        assert named in last, last
    assert "nsight-systems-target" not in last and "cupti" not in last  # only driver packages are named
    # The contrib/non-free source it added for the simulation is taken away again.
    assert list((machine.root / "etc" / "apt" / "sources.list.d").iterdir()) == []


def test_without_a_driver_it_installs_the_package_and_links_its_nsys(tmp_path):
    machine = FakeMachine(tmp_path)  # Debian's nvidia-smi without a driver fails, as on a CPU machine
    run = machine.install(tmp_path)
    assert run.returncode == 0, run.stderr
    assert machine.apt_calls() == ["update", "install -y nsight-systems"]
    assert machine.link.resolve() == (machine.root / "usr/lib/nsight-systems/bin/nsys").resolve()
    assert "2099.1.1-fake" in run.stdout
    assert (machine.root / "etc/apt/sources.list.d/debian-nonfree.sources").read_text().count("non-free") == 1


def test_with_a_driver_a_plan_that_leaves_the_driver_alone_installs(tmp_path):
    """A driver from Debian's own packages: the plan has no driver package, so nothing stops it."""
    machine = FakeMachine(tmp_path, driver_file=True, plan=PLAN_WITHOUT_DRIVER)
    run = machine.install(tmp_path)
    assert run.returncode == 0, run.stderr
    assert machine.apt_calls() == ["update", "-s install -y nsight-systems", "install -y nsight-systems"]
    assert machine.link.is_symlink()


@pytest.mark.parametrize("where", ["opt/nvidia/nsight-systems/2024.5.1/bin", "opt/nvidia/nsight-systems-2023.4.1/bin",
                                   "usr/local/cuda-12.4/bin", "usr/lib/nsight-systems/bin", "dpkg -L"])
def test_an_nsys_already_on_the_machine_is_used_and_nothing_is_installed(tmp_path, where):
    folder = "srv/debian-layout/bin" if where == "dpkg -L" else where
    machine = FakeMachine(tmp_path, driver_file=True,
                          dpkg_lists=["/usr/share/doc/nsight-systems", f"/{folder}/nsys"] if where == "dpkg -L" else ())
    nsys = executable(machine.root / folder / "nsys", FAKE_NSYS)
    found = machine.install(tmp_path, "--find")
    assert found.returncode == 0 and found.stdout.strip() == str(nsys)
    run = machine.install(tmp_path)
    assert run.returncode == 0, run.stderr
    assert machine.apt_calls() == []
    assert machine.link.resolve() == nsys.resolve() and "2099.1.1-fake" in run.stdout


def test_find_without_any_nsys_fails(tmp_path):
    assert FakeMachine(tmp_path).install(tmp_path, "--find").returncode != 0


def test_launch_with_profile_auto_trains_unprofiled_and_says_so_when_the_install_stops(tmp_path):
    machine = FakeMachine(tmp_path, driver_file=True)
    tiny = ["--dataset", "synthetic", "--synthetic-train", "64", "--synthetic-test", "32", "--batch-size", "32",
            "--workers", "0", "--valid-size", "0", "--no-progress", "--epochs", "1", "--model", "resnet20"]
    run = run_process(["bash", LAUNCH, *tiny], cwd=tmp_path, budget=25,
                      env={**machine.env(tmp_path), "MODE": "dp", "NUM_GPUS": "1", "PROFILE": "auto",
                           "NSIGHT_LOG_DIR": str(tmp_path / "logs"), "CKPT_DIR": str(tmp_path / "ckpt"),
                           "DATA_DIR": str(tmp_path / "data"), "PYTHON": sys.executable})
    assert run.returncode == 0, run.stderr
    assert "apt would also install or replace NVIDIA driver packages" in run.stderr
    assert "running UNPROFILED" in run.stderr
    assert not machine.real_installs()
    metrics = json.loads((tmp_path / "logs" / "dp_cpu1.metrics.json").read_text())
    assert metrics["env"]["nsys"] is None
    assert any("unprofiled" in note for note in metrics["env"]["notes"]), metrics["env"]["notes"]
    assert not list((tmp_path / "logs").glob("*.nsys-rep"))
