"""scripts/install_nsys.sh on a fake machine: it never installs, replaces or removes an NVIDIA
driver package where a driver runs, and uses an nsys that is already there.

The machine is a folder (NSYS_INSTALL_SYSROOT) plus fake apt-get, dpkg, nvidia-smi and sudo
first on PATH; the fake apt-get records every call, so a test sees whether a real (not
simulated) install was asked for. Nothing here touches the real apt or /usr/local/bin.
"""
import ctypes.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.conftest import gpu_count, run_process
from tests.nsys_helpers import REPO, once_more_if_nsys_failed_to_start, path_without_nsys, require_nsys
from tests.parallel import one_at_a_time

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
# What `apt-get -s install` planned for the dependencies of the unpacked packages that a CPU
# machine lacked: libraries only, no driver.
PLAN_DEPENDENCIES = """\
Inst libssh-4 (0.10.6-0+deb12u2 Debian:12.15/oldstable [amd64])
Inst libucx0 (1.13.1-1 Debian:12.15/oldstable [amd64])
"""
# The two packages' Depends, as Debian's 2022.4.2.1~11.8.0-5~deb12u1 declares them (shortened).
DEPENDS = {"nsight-systems": "libjs-jquery, nsight-systems-target (= 2099.1.1~fake-1), libssh-4, python3:any, "
                             "libc6 (>= 2.34)",
           "nsight-systems-target": "python3:any, libcuda1 (>= 520) | libnvidia-tesla-cuda1 (>= 520) | "
                                    "libcuda.so.1 (>= 520) | libcuda-11.8-1, libc6 (>= 2.34), libucx0 (>= 1.13.1)"}
INSTALLED = ("libc6", "python3", "libjs-jquery")


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
        # apt-get with a private state (-o Dir::...) is recorded as "[private] ...".
        executable(self.bin / "apt-get", f"""#!/bin/bash
private=""
while [[ $1 == -o ]]; do private="[private] "; shift 2; done
echo "$private$*" >>"{self.calls}"
case "$1" in
    update) exit 0 ;;
    -s) cat "{self.bin / 'plan'}" ;;
    download) for p in "${{@:2}}"; do echo "$p" >"$p"_2099.1.1~fake-1_amd64.deb; done ;;
    install) [[ $* == *nsight-systems* ]] || exit 0
             mkdir -p "{installed.parent}" && printf '%s' "{FAKE_NSYS}" >"{installed}" && chmod +x "{installed}" ;;
    *) exit 100 ;;
esac
""")
        listing = "\n".join(dpkg_lists)
        # dpkg -x lays out what the two packages hold that matters here: nsys, the importer's
        # folder with its link to the system's libssh, and the target folder.
        executable(self.bin / "dpkg", f"""#!/bin/bash
if [[ $1 == -x ]]; then
    case "$(cat "$2")" in
        nsight-systems) mkdir -p "$3/usr/lib/nsight-systems/bin" "$3/usr/lib/nsight-systems/host-linux-x64"
                        printf '%s' "{FAKE_NSYS}" >"$3/usr/lib/nsight-systems/bin/nsys"
                        chmod +x "$3/usr/lib/nsight-systems/bin/nsys"
                        ln -s ../../x86_64-linux-gnu/libssh.so.4 "$3/usr/lib/nsight-systems/host-linux-x64/libssh.so" ;;
        nsight-systems-target) mkdir -p "$3/usr/lib/x86_64-linux-gnu/nsight-systems/target-linux-x64" ;;
    esac
    exit 0
fi
[[ "$1 $2" == "-L nsight-systems" && -n "{listing}" ]] || exit 1
printf '%s\\n' "{listing}"
""")
        depends = "\n".join(f'    {name}) echo "{line}" ;;' for name, line in DEPENDS.items())
        executable(self.bin / "dpkg-deb", f"""#!/bin/bash
[[ $1 == -f && $3 == Version ]] && {{ echo "2099.1.1~fake-1"; exit 0; }}
[[ $1 == -f && $3 == Depends ]] || exit 2
case "$(cat "$2")" in
{depends}
esac
""")
        executable(self.bin / "dpkg-query", f"""#!/bin/bash
for p in {" ".join(INSTALLED)}; do [[ ${{@: -1}} == "$p" ]] && {{ printf installed; exit 0; }}; done
exit 1
""")
        system_libssh = self.root / "usr" / "lib" / "x86_64-linux-gnu" / "libssh.so.4"
        system_libssh.parent.mkdir(parents=True)
        system_libssh.write_text("the system's libssh\n")
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


def test_without_a_driver_it_unpacks_nsys_privately_and_installs_no_driver_library(tmp_path):
    """A CPU machine: Debian's package would bring libcuda1 535, and torch would then warn in
    every process that the driver is too old. The packages are downloaded and unpacked, and
    only the dependencies that are no driver package are installed."""
    machine = FakeMachine(tmp_path, plan=PLAN_DEPENDENCIES)  # nvidia-smi fails, as without a driver
    run = machine.install(tmp_path)
    assert run.returncode == 0, run.stderr
    assert machine.apt_calls() == [
        "[private] update", "[private] download nsight-systems nsight-systems-target", "update",
        "-s install -y --no-install-recommends libssh-4 libucx0", "install -y --no-install-recommends libssh-4 libucx0"]
    assert not any("libcuda" in call for call in machine.apt_calls())
    private = machine.root / "opt" / "nsight-systems-debian" / "2099.1.1"
    assert machine.link.resolve() == (private / "usr/lib/nsight-systems/bin/nsys").resolve()
    assert "2099.1.1-fake" in run.stdout
    assert not list(private.rglob("libcuda*"))
    # The importer's link to the system's libssh points at the system's file, not into the folder.
    libssh = private / "usr/lib/nsight-systems/host-linux-x64/libssh.so"
    assert libssh.resolve() == (machine.root / "usr/lib/x86_64-linux-gnu/libssh.so.4").resolve()
    host = private / "usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64"
    assert host.resolve() == (private / "usr/lib/nsight-systems/host-linux-x64").resolve()
    # The machine's apt sources are left as they were.
    assert list((machine.root / "etc" / "apt" / "sources.list.d").iterdir()) == []
    assert machine.install(tmp_path, "--find").stdout.strip() == str(private / "usr/lib/nsight-systems/bin/nsys")


def test_without_a_driver_dependencies_that_would_bring_a_driver_package_stop_it(tmp_path):
    machine = FakeMachine(tmp_path, plan=PLAN_WITH_DRIVER)
    run = machine.install(tmp_path)
    assert run.returncode == 3
    assert not machine.real_installs() and not machine.link.exists()
    last = run.stderr.strip().splitlines()[-1]
    assert "apt would also install NVIDIA driver packages" in last and "libcuda1" in last, last


def test_with_a_driver_a_plan_that_leaves_the_driver_alone_installs(tmp_path):
    """A driver from Debian's own packages: the plan has no driver package, so nothing stops it."""
    machine = FakeMachine(tmp_path, driver_file=True, plan=PLAN_WITHOUT_DRIVER)
    run = machine.install(tmp_path)
    assert run.returncode == 0, run.stderr
    assert machine.apt_calls() == ["update", "-s install -y nsight-systems", "install -y nsight-systems"]
    assert machine.link.is_symlink()


@pytest.mark.parametrize("where", ["opt/nsight-systems-debian/2022.4.2.1/usr/lib/nsight-systems/bin",
                                   "opt/nvidia/nsight-systems/2024.5.1/bin", "opt/nvidia/nsight-systems-2023.4.1/bin",
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


def test_an_old_install_s_libcuda1_on_a_machine_without_a_driver_is_named_with_its_fix(tmp_path):
    machine = FakeMachine(tmp_path)
    executable(machine.bin / "dpkg-query", '#!/bin/bash\n[[ ${@: -1} == libcuda1 ]] && printf installed\n')
    executable(machine.root / "usr/lib/nsight-systems/bin/nsys", FAKE_NSYS)
    run = machine.install(tmp_path)
    assert run.returncode == 0, run.stderr
    assert "libcuda1 is installed but no NVIDIA driver runs here" in run.stderr and "apt-get purge libcuda1" in run.stderr


def cpu_machine_with_nsys() -> str:
    """The nsys of this machine, when it is a machine without an NVIDIA driver."""
    if gpu_count() or Path("/proc/driver/nvidia/version").exists():
        pytest.skip("a machine with an NVIDIA driver: this is about machines without one")
    return require_nsys()


def test_a_cpu_machine_has_no_libcuda_after_the_install():
    """The real machine, after scripts/install_nsys.sh (scripts/test.sh runs it first)."""
    nsys = Path(cpu_machine_with_nsys()).resolve()
    loader = run_process(["ldconfig", "-p"], budget=2).stdout
    assert not [line for line in loader.splitlines() if "libcuda.so" in line], loader
    assert ctypes.util.find_library("cuda") is None
    install = next((p for p in nsys.parents if p.name == "usr"), nsys.parent).parent
    assert not list(install.rglob("libcuda.so*")), install


@pytest.mark.slow  # an end-to-end run of 13-17 s: CI's slow step (the main run's 10 minutes)
def test_a_profiled_run_on_a_cpu_machine_prints_no_driver_warning(tmp_path):
    """GPUs not hidden, as a user runs it: torch finds no libcuda and says nothing."""
    cpu_machine_with_nsys()
    tiny = ["--dataset", "synthetic", "--synthetic-train", "64", "--synthetic-test", "32", "--batch-size", "32",
            "--workers", "0", "--valid-size", "0", "--no-progress", "--epochs", "1", "--model", "resnet20"]
    env = {**{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
           "MODE": "dp", "NUM_GPUS": "1", "PROFILE": "1", "PYTHON": sys.executable,
           "NSIGHT_LOG_DIR": str(tmp_path / "logs"), "CKPT_DIR": str(tmp_path / "ckpt"),
           "DATA_DIR": str(tmp_path / "data")}
    with one_at_a_time("nsys"):
        run = once_more_if_nsys_failed_to_start(
            lambda: run_process(["bash", LAUNCH, *tiny], cwd=tmp_path, env=env, inherit=False, budget=30))
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "logs" / "dp_cpu1.nsys-rep").is_file()
    output = run.stdout + run.stderr
    assert "too old" not in output and "CUDA not usable" not in output, output[-3000:]
    metrics = json.loads((tmp_path / "logs" / "dp_cpu1.metrics.json").read_text())
    assert metrics["env"]["nsys"] and not [n for n in metrics["env"].get("notes", []) if "CUDA" in n]
