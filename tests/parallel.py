"""Running the suite on pytest-xdist workers (scripts/test.sh: -n 2 --dist loadgroup): which
tests share a worker, in what order the workers get them, and what runs one at a time.

Groups: tests that use one module-scoped fixture form a group, so that the fixture is
built once (each of its parameters once); GPU tests form one group, so that they never share
the GPUs with each other; @pytest.mark.xdist_group("name") names a group by hand and wins.
Each group runs on one worker, its tests in collection order; the other tests go wherever
a worker is free. Order: the files in SLOW_FIRST are handed out first, slowest first, so
that the run ends on quick tests instead of one worker finishing a long one alone.

pytest-xdist 3.8 groups by appending "@group" to node ids, which pytest 9.2's structured
node ids silently drop (pytest-xdist#1386: every test scheduled on its own). So each worker
writes the groups it collected to a file and the controller's scheduler reads them there:
grouping that works with any pytest. tests/conftest.py imports these hooks.

One at a time: nsys 2022.4 sessions that start together can fail (sem_open: "No such file
or directory", seen with three started at once), so profiled runs take turns (one_at_a_time).
"""
import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

FOLDER = pytest.StashKey[str]()  # the controller's folder for this run: groups file, locks
RUN_FOLDER = "test_run_folder"  # the workers' workerinput key for it
shared = {}  # in a worker: "folder"
held = {}  # one_at_a_time names this worker holds


# Files whose tests start training processes, slowest unit (a group or a test) first, from
# --durations with two workers on the 2-core box. A new file of slow tests belongs here.
SLOW_FIRST = ("test_gpu_check.py", "test_launch.py", "test_comm_hooks.py", "test_compare.py", "test_pp.py",
              "test_resume_and_torchrun.py",
              "test_faults.py", "test_toolbox.py", "test_bench.py", "test_training_modes.py", "test_safety.py",
              "test_launch_safety.py", "test_launch_modes_and_earlier_runs.py", "test_cpu_machine.py",
              "test_profile_report.py",
              "test_devices.py", "test_nsys_install.py", "test_ddp_correctness.py", "test_hosts.py", "test_peers_errors.py",
              "test_ddp_edges.py")


def assign_groups(items) -> None:
    """Tests sharing a module-scoped fixture (directly or through another fixture) get one
    group, named after the first such fixture; GPU tests share one group, "gpu"."""
    owner = {}  # fixture -> the fixture that names its group (union-find)

    def root(key):
        while owner.setdefault(key, key) != key:
            key = owner[key]
        return key

    keys = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            keys[item] = module_fixtures(item) + (["gpu"] if uses_gpus(item) else [])
            for key in keys[item][1:]:
                owner[root(key)] = root(keys[item][0])
    for item, instances in keys.items():
        if instances:
            item.add_marker(pytest.mark.xdist_group(root(instances[0])))


def module_fixtures(item) -> list:
    """'file::fixture' for each fixture the test needs built once per module (or class, or
    package). Every parameter of one fixture is one group: a worker builds them in turn."""
    info = getattr(item, "_fixtureinfo", None)
    return [f"{item.path.name}::{name}" for name, defs in sorted((info.name2fixturedefs if info else {}).items())
            if defs and defs[-1].scope in ("module", "class", "package")]


def uses_gpus(item) -> bool:
    return item.get_closest_marker("gpu") is not None or item.get_closest_marker("gpus") is not None


def slow_first(items) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order within


def group_of(item):
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


@contextlib.contextmanager
def locked(path):
    """Holds an exclusive lock on `path` (created if missing) across processes."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def one_at_a_time(name: str):
    """While this is held, no other xdist worker of this run holds one_at_a_time(name).
    Nested use in one worker is fine: only the outermost takes the lock."""
    if "folder" not in shared or held.get(name):  # one process, or held already: nothing runs beside it
        yield
        return
    held[name] = True
    try:
        with locked(os.path.join(shared["folder"], f"{name}.lock")):
            yield
    finally:
        held[name] = False


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):
        shared["folder"] = config.workerinput[RUN_FOLDER]


@pytest.hookimpl(tryfirst=True)  # a worker: before it reports its collection to the controller
def pytest_collection_finish(session) -> None:
    if "folder" in shared:
        groups = {item.nodeid: group for item in session.items if (group := group_of(item))}
        path = os.path.join(shared["folder"], "groups.json")
        partial = f"{path}.{os.getpid()}"
        Path(partial).write_text(json.dumps(groups))
        os.replace(partial, path)  # every worker writes the same map; none reads half of one


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    if FOLDER not in node.config.stash:
        node.config.stash[FOLDER] = tempfile.mkdtemp(prefix="pytest-run-")
    node.workerinput[RUN_FOLDER] = node.config.stash[FOLDER]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    path = Path(config.stash[FOLDER], "groups.json")
    config.option.loadscopereorder = False  # the workers' order (slow_first), not xdist's by group size

    class GroupScheduling(LoadScopeScheduling):
        """xdist's loadgroup, with the groups read from the workers' file."""
        groups = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(path.read_text())
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


def pytest_unconfigure(config) -> None:
    folder = config.stash.get(FOLDER, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
