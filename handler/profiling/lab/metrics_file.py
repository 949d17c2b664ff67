"""The run's metrics JSON as the report reads it (`--metrics`, or the lab page's `<name>.metrics.json`
beside a report): read once and parsed into the Metrics record (record/metrics.py: every field the
report takes from it, docs/METRICS.md), so a damaged or foreign file is one line naming the field,
never an exception deep in the analysis nor a summary that breaks its own contract."""
import errno
import json
from pathlib import Path
from typing import cast

from handler.runtime.errors import UserError, too_long

from ..record.metrics import Metrics
from ..record.parse import METRICS_FIX, parse_metrics


def metrics_problem(data: object) -> str | None:
    """What makes data another file's JSON than a metrics JSON; None when it is one (its fields are then
    checked by the Metrics model, record/metrics.py)."""
    if not isinstance(data, dict):
        return f"is a JSON {type(data).__name__}, not the object train_cifar.py writes"
    keys = {str(k) for k in cast(dict[object, object], data)}
    if {"ranks", "overall"} <= keys:
        return "is a profile summary (.summary.json), not the run's metrics JSON"
    if not {"config", "env", "epochs"} & keys:
        return "has none of the metrics JSON's `config`, `env` and `epochs`: it is another file's JSON"
    return None


def read_json(path: Path, name: str, fix: str) -> object:
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


def read_metrics(path: Path, fix: str = METRICS_FIX) -> Metrics:
    """The metrics JSON at path, parsed (record/metrics.py); UserError naming it, the field's path and fix
    when it cannot be used: an odd field is named as the metrics' own, before any summary is written."""
    data = read_json(path, f"metrics file {path}", fix)
    if problem := metrics_problem(data):
        raise UserError(f"metrics file {path} {problem}; {fix}")
    return parse_metrics(data, f"metrics file {path}", fix)
