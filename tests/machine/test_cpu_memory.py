"""CPU processes keep freed memory: glibc stops re-mapping and zeroing big blocks each step."""
import json
import sys

from tests.conftest import ROOT, run_process

PROBE = """
import json, resource, sys
import numpy as np
from handler.runtime.cpu_memory import keep_freed_memory
setting = keep_freed_memory()
def step():  # a training step's activations: several big blocks alive at once, then freed
    blocks = [np.ones(2_000_000) for _ in range(4)]  # 4 x 16 MB
    del blocks
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(json.dumps({"setting": setting, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def probe(**env):
    clean = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env}
    out = run_process([sys.executable, "-c", PROBE], env=clean, inherit=False, budget=3)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_freed_blocks_are_reused_instead_of_faulted_in_again():
    kept, default = probe(), probe(HARNESS_GLIBC_DEFAULTS="1")
    assert kept["setting"] == "glibc, trim and mmap thresholds 1 GiB"
    assert default["setting"].startswith("glibc defaults")
    # glibc trims the freed 64 MB off its heap, so the next step faults it in again
    assert default["faults"] > 20 * 1000
    assert kept["faults"] < 1000


def test_allocator_settings_from_the_environment_win():
    assert probe(MALLOC_ARENA_MAX="2")["setting"] == "as set by MALLOC_ARENA_MAX"
