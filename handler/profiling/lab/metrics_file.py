"""The run's metrics JSON as the report reads it (`--metrics`, or the lab page's `<name>.metrics.json`
beside a report): read once and checked for the fields the report takes from it (docs/METRICS.md),
so a damaged or foreign file is one line naming the field, never an exception deep in the analysis."""
import errno
import json
import math
from pathlib import Path

from handler.runtime.errors import UserError, too_long

# The fields the report reads (analysis.py, scaling/machine.py, scaling/links.py, cells.py), by type.
NUMBER, INTEGER, TEXT, OBJECT = "a number", "a whole number", "a string", "an object"
CONFIG_FIELDS = {"workers": NUMBER, "num_gpu": INTEGER, "mode": TEXT, "model": TEXT, "comm_hook": TEXT,
                 "bucket_cap_mb": NUMBER, "powersgd_rank": INTEGER}
ENV_FIELDS = {"hosts": OBJECT, "cpu_cores": INTEGER, "cpu_count": INTEGER, "torch_threads": INTEGER}


def _is(value, kind: str) -> bool:
    if kind == OBJECT:
        return isinstance(value, dict)
    if kind == TEXT:
        return isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return False
    return kind == NUMBER or value == int(value)


def metrics_problem(data) -> str | None:
    """What makes data unusable as a metrics JSON, naming the field; None when the report can read it."""
    if not isinstance(data, dict):
        return f"is a JSON {type(data).__name__}, not the object train_cifar.py writes"
    if "ranks" in data and "overall" in data:
        return "is a profile summary (.summary.json), not the run's metrics JSON"
    if not {"config", "env", "epochs"} & data.keys():
        return "has none of the metrics JSON's `config`, `env` and `epochs`: it is another file's JSON"
    for section, fields in (("config", CONFIG_FIELDS), ("env", ENV_FIELDS)):
        block = data.get(section)
        if block is None:
            continue
        if not isinstance(block, dict):
            return f"has `{section}` that is not an object"
        for key, kind in fields.items():
            if block.get(key) is not None and not _is(block[key], kind):
                return f"has `{section}.{key}` = {json.dumps(block[key])[:40]}, not {kind}"
    epochs = data.get("epochs")
    if epochs is not None and not isinstance(epochs, list):
        return "has `epochs` that is not a list"
    for i, entry in enumerate(epochs or []):
        if not isinstance(entry, dict):
            return f"has `epochs[{i}]` that is not an object"
        for key, kind in (("epoch", INTEGER), ("time_s", NUMBER)):
            if entry.get(key) is not None and not _is(entry[key], kind):
                return f"has `epochs[{i}].{key}` = {json.dumps(entry[key])[:40]}, not {kind}"
    return None


def read_json(path: Path, name: str, fix: str):
    """The JSON at path (`name` says it in the error: "metrics file X", or the path); UserError naming
    what is wrong with the file and `fix`. The what-if's summary and the report's metrics read through it."""
    try:
        text = path.read_bytes().decode()
    except FileNotFoundError:
        raise UserError(f"{name} does not exist; {fix}") from None
    except IsADirectoryError:
        raise UserError(f"{name} is a folder; {fix}") from None
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            raise UserError(too_long(path)) from None
        raise UserError(f"{name} cannot be read ({err.strerror}); check its permissions, or {fix}") from None
    except UnicodeDecodeError:
        raise UserError(f"{name} is not text (a binary file); {fix}") from None
    if not text.strip():
        raise UserError(f"{name} is empty; {fix}")
    try:
        return json.loads(text)
    except ValueError as err:
        raise UserError(f"{name} is not JSON ({err}): damaged or cut off; {fix}") from None
    except RecursionError:  # brackets nested deeper than any file of ours: not one of them
        raise UserError(f"{name} nests its brackets too deep to read (no file of ours does): not the file asked "
                        f"for; {fix}") from None


def read_metrics(path: Path, fix: str = "pass the metrics JSON the run wrote (<name>.metrics.json) with --metrics") -> dict:
    """The metrics JSON at path; UserError naming it, what is wrong and fix when it cannot be used."""
    data = read_json(path, f"metrics file {path}", fix)
    if problem := metrics_problem(data):
        raise UserError(f"metrics file {path} {problem}; {fix}")
    return data
