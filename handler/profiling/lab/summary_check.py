"""A profile summary JSON given by a user (the what-if reads one), checked before any number in it
is used: no NaN or infinity anywhere (Python's json reads both), and each field the readers use of
the kind FIELDS gives it. The first problem is one line naming the field's path
(`ranks[0].loop.steps`) and the fix."""
import math
from collections.abc import Iterator

from handler.runtime.errors import UserError

FIX = ("pass the .summary.json that python -m handler.profiling.report wrote, unedited, or summarise the "
       "report again")
ROUNDING = 1e-9  # a time this far below 0 is float rounding (an epoch less its steps), not a negative time


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# kind: (test, what a value of that kind is, for the error)
KINDS = {
    "list": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a whole number >= 0"),
    "time": (lambda v: _number(v) and v >= -ROUNDING, "a time >= 0"),
    "share": (lambda v: _number(v) and v >= 0, "a share >= 0"),
    "size": (lambda v: _number(v) and v > 0, "a size > 0"),
    "path": (lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(p, str) for p in v)),
             "a report's path or a list of them"),
}
REQUIRED, NULLABLE, OPTIONAL = "required", "may be null", "optional"  # OPTIONAL: absent, never null

# (path, kind, need): `[]` is each item of a list, `*` each value of an object. Parents come first.
FIELDS = (
    ("ranks", "list", REQUIRED),
    ("overall", "object", REQUIRED),
    ("ranks[]", "object", REQUIRED),
    ("ranks[].loop", "object", OPTIONAL),
    ("ranks[].loop.steps", "count", REQUIRED),
    ("ranks[].loop.epochs_s", "time", REQUIRED),
    ("ranks[].loop.epochs", "count", OPTIONAL),
    ("ranks[].loop.step_mean_ms", "time", NULLABLE),
    ("ranks[].loop.inside_steps_ms", "time", NULLABLE),
    ("ranks[].loop.between_steps_ms", "time", NULLABLE),
    ("ranks[].loop.phase_ms", "object", OPTIONAL),
    ("ranks[].loop.phase_ms.*", "time", NULLABLE),
    ("ranks[].epochs", "list", OPTIONAL),
    ("ranks[].epochs[]", "object", REQUIRED),
    ("ranks[].epochs[].time_s", "time", REQUIRED),
    ("ranks[].comm", "object", NULLABLE),
    ("ranks[].comm.seconds", "time", NULLABLE),
    ("ranks[].comm.exposed_s", "time", NULLABLE),
    ("ranks[].comm.buckets", "count", NULLABLE),
    ("gpus", "list", NULLABLE),
    ("gpus[]", "object", REQUIRED),
    ("gpus[].compute_busy_share", "share", NULLABLE),
    ("gpus[].kernel_busy_share", "share", NULLABLE),
    ("gpus[].epochs_s", "time", REQUIRED),
    ("comm_config", "object", NULLABLE),
    ("comm_config.bucket_cap_mb", "size", NULLABLE),
    ("overall.epoch_mean_s", "time", NULLABLE),
    ("incomplete", "object", NULLABLE),
    ("incomplete.complete_epochs", "count", REQUIRED),
    ("report", "path", OPTIONAL),
)
MISSING = object()


def check_summary(data, name: str) -> dict:
    """data when it is a summary every reader can use; else UserError naming the first bad field."""
    if not isinstance(data, dict):
        raise UserError(f"{name} is not a profile summary (a JSON object with ranks and overall); {FIX}")
    for where, value in _numbers(data, ""):
        if not math.isfinite(value):
            raise UserError(f"{name}: {where} is {value}, not a finite number; {FIX}")
    for path, kind, need in FIELDS:
        test, what = KINDS[kind]
        for where, value in _values(data, path):
            if value is MISSING and need != REQUIRED or value is None and need == NULLABLE:
                continue
            if value is MISSING:
                raise UserError(f"{name}: {where} is missing; it must be {what}; {FIX}")
            if not test(value):
                raise UserError(f"{name}: {where} is {_shown(value)}, not {what}"
                                f"{' or null' if need == NULLABLE else ''}; {FIX}")
    return data


def _numbers(value, where: str) -> Iterator[tuple[str, float]]:
    """(path, number) for every float in the JSON."""
    if isinstance(value, float):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _numbers(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _numbers(item, f"{where}[{i}]")


def _values(data: dict, path: str) -> list[tuple[str, object]]:
    """(concrete path, value) for each place the path names under a parent that is there; an
    absent key is MISSING. A parent of the wrong kind is its own row's error, so it is skipped."""
    found: list[tuple[str, object]] = [("", data)]
    for part in path.split("."):
        each, key = part.endswith("[]"), part.removesuffix("[]")
        step = []
        for where, parent in found:
            if not isinstance(parent, dict):
                continue
            names = list(parent) if key == "*" else [key]
            for name in names:
                here, value = f"{where}.{name}" if where else name, parent.get(name, MISSING)
                if each and isinstance(value, list):
                    step += [(f"{here}[{i}]", item) for i, item in enumerate(value)]
                elif not each:
                    step.append((here, value))
        found = step
    return found


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
