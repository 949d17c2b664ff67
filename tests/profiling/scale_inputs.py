"""The exports whose summaries the analysis must keep bit for bit (tests/data/nsys/golden_summaries.json).

The golden file was written by the analysis as it was before it learned to aggregate in
SQLite (commit a4a3301), with `python -m tests.profiling.scale_inputs`; the test compares
the current analysis to it, so any change of a number shows.
"""
import json
import sys
from pathlib import Path

from bench.profile_tile import tile
from handler.profiling.analysis import summarize
from handler.profiling.render import one_line
from handler.profiling.trace import load_trace
from tests.nsys_helpers import REAL_EXPORTS, REPO, with_training_ranges

GOLDEN = REPO / "tests" / "data" / "nsys" / "golden_summaries.json"
DALI_CPU = REPO / "tests" / "data" / "nsys" / "ddp_dali_cpu_nsys2022.4.sqlite"


def build(folder: Path) -> dict:
    """name -> export path, each made the same way every time."""
    exports = {"ddp_dali_cpu_2022.4": DALI_CPU}
    for version, source in REAL_EXPORTS.items():
        exports[f"real_{version}"] = folder / f"real_{version}.sqlite"
        with_training_ranges(source, exports[f"real_{version}"], batches=4, string_ids=version == "2022.2")
    exports["tiled_2026.2_x3"] = folder / "tiled_x3.sqlite"
    tile(REAL_EXPORTS["2026.2"], exports["tiled_2026.2_x3"], copies=3, epochs=2, batches=7)
    return exports


def summaries(folder: Path) -> dict:
    """name -> the summary (plus its one line), as JSON would store it."""
    out = {}
    for name, path in build(folder).items():
        summary = summarize(load_trace(path))
        out[name] = json.loads(json.dumps({**summary, "one_line": one_line(summary)}))
    return out


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps(summaries(Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}", file=sys.stderr)
