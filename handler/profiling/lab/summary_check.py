"""A profile summary JSON checked against its contract before any reader uses a number in it:
docs/summary.schema.json (JSON Schema 2020-12) names every field a reader uses, its kind, its
range and whether it is required. The what-if, the lab page and compare all call check_summary.
JSON Schema's `number` takes NaN and infinity (Python's json reads both), so every number is
first checked to be finite. The first problem is one line naming the field's path
(`ranks[0].loop.steps`), what it must be (the schema's `title` of that field) and the fix.
"""
import json
import math
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from handler.runtime.errors import UserError

SCHEMA = Path(__file__).resolve().parents[3] / "docs" / "summary.schema.json"
FIX = ("pass the .summary.json that python -m handler.profiling.report wrote, unedited, or summarise the "
       "report again")


@cache
def schema() -> dict:
    return json.loads(SCHEMA.read_text())


@cache
def validator() -> Draft202012Validator:
    Draft202012Validator.check_schema(schema())
    return Draft202012Validator(schema())


def check_summary(data, name: str) -> dict:
    """data when it is a summary every reader can use; else UserError naming the first bad field."""
    if not isinstance(data, dict):
        raise UserError(f"{name} is not a profile summary (a JSON object with ranks and overall); {FIX}")
    for where, value in _numbers(data, ""):
        if not math.isfinite(value):
            raise UserError(f"{name}: {where} is {value}, not a finite number; {FIX}")
    errors = list(validator().iter_errors(data))
    if errors:  # the shallowest field first (a parent before its fields), then in the schema's order
        raise UserError(f"{name}: {_said(min(errors, key=_depth))}; {FIX}")
    return data


def _depth(error: ValidationError) -> int:
    return len(error.absolute_path) + (error.validator == "required")


def _said(error: ValidationError) -> str:
    """`ranks[0].loop.steps is 'ten', not a whole number >= 0`, or `... is missing; it must be ...`."""
    failed = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "required":
        required = error.validator_value if isinstance(error.validator_value, list) else []
        missing = next(k for k in required if k not in error.instance)
        wanted = _resolved(failed.get("properties", {}).get(missing, {}))
        return f"{_path([*error.absolute_path, missing])} is missing; it must be {_what(wanted)}"
    where = _path(list(error.absolute_path)) or "the summary"
    return f"{where} is {_shown(error.instance)}, not {_what(failed)}"


def _resolved(field: dict) -> dict:
    ref = field.get("$ref", "")
    return schema()["$defs"].get(ref.rsplit("/", 1)[-1], field) if ref.startswith("#/$defs/") else field


def _what(field: dict) -> str:
    return field.get("title") or "as docs/summary.schema.json says"


def _path(parts: list) -> str:
    """['ranks', 0, 'loop', 'steps'] -> ranks[0].loop.steps"""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


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


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
