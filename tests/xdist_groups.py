"""Which tests share a pytest-xdist worker (scripts/test.sh runs -n 2 --dist loadgroup).

A test that uses a module-scoped fixture joins its file's group, so that fixture is built
once; @pytest.mark.xdist_group("name") names a group by hand and wins. Each group runs on
one worker, its tests in collection order; the other tests go wherever a worker is free.

pytest-xdist 3.8 groups by appending "@group" to node ids, which pytest 9.2's structured
node ids silently drop (pytest-xdist#1386: every test scheduled on its own). So each worker
writes the groups it collected to a file and the controller's scheduler reads them there:
grouping that works with any pytest. tests/conftest.py imports these hooks.
"""
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

FOLDER = pytest.StashKey[str]()
GROUPS_FILE = "test_groups_file"  # the workers' workerinput key


def assign_groups(items) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.name))


def uses_module_fixture(item) -> bool:
    """Whether the test needs a fixture built once per module (or class, or package)."""
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope in ("module", "class", "package")
                                    for defs in info.name2fixturedefs.values())


def group_of(item):
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return "_".join(sorted(names)) or None


@pytest.hookimpl(tryfirst=True)  # a worker: before it reports its collection to the controller
def pytest_collection_finish(session) -> None:
    path = getattr(session.config, "workerinput", {}).get(GROUPS_FILE)
    if path:
        groups = {item.nodeid: group for item in session.items if (group := group_of(item))}
        partial = f"{path}.{os.getpid()}"
        Path(partial).write_text(json.dumps(groups))
        os.replace(partial, path)  # every worker writes the same map; none reads half of one


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    if FOLDER not in node.config.stash:
        node.config.stash[FOLDER] = tempfile.mkdtemp(prefix="test-groups-")
    node.workerinput[GROUPS_FILE] = os.path.join(node.config.stash[FOLDER], "groups.json")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    path = Path(config.stash[FOLDER], "groups.json")

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
