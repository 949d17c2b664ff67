"""A summary or a metrics JSON parsed once, at its reader's entry, into the typed records of
summary.py and metrics.py; the first problem is one line naming the field's path
(`ranks[0].loop.steps`), what it must be (the title of its kind in the generated schema) and the
fix (UserError: exit 2). docs/summary.schema.json is generated here (`schema`)."""
from functools import cache
from typing import Any, TypeVar, cast

from pydantic import BaseModel, ValidationError
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import ErrorDetails

from handler.runtime.errors import UserError

from .metrics import Metrics
from .summary import Summary

SUMMARY_FIX = ("pass the .summary.json that python -m handler.profiling.report wrote, unedited, or summarise the "
               "report again")
METRICS_FIX = "pass the metrics JSON the run wrote (<name>.metrics.json) with --metrics"
SCHEMA_ID = "docs/summary.schema.json"
KINDS = {"model_type": "an object", "dict_type": "an object", "list_type": "a list", "int_type": "a whole number",
         "float_type": "a number", "string_type": "a text", "bool_type": "true or false",
         "finite_number": "a finite number", "missing": "given"}
Parsed = TypeVar("Parsed", bound=BaseModel)


class _Titled(GenerateJsonSchema):
    """Titles only where a kind (record/kinds.py) names one: never the field's name capitalised."""
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def schema() -> dict[str, Any]:
    """docs/summary.schema.json: `python -m handler.profiling.record --schema > docs/summary.schema.json`."""
    made = Summary.model_json_schema(schema_generator=_Titled)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "a profile summary (a JSON object with ranks and overall)", **made}


def parse_summary(data: object, name: str, fix: str = SUMMARY_FIX) -> Summary:
    if isinstance(data, Summary):
        return data
    if not isinstance(data, dict):
        raise UserError(f"{name} is not a profile summary (a JSON object with ranks and overall); {fix}")
    return _parsed(Summary, cast(dict[str, Any], data), name, fix, _summary_schema())


def parse_metrics(data: object, name: str, fix: str = METRICS_FIX) -> Metrics:
    return _parsed(Metrics, data, name, fix, _metrics_schema())


def _parsed(model: type[Parsed], data: object, name: str, fix: str, made: dict[str, Any]) -> Parsed:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = min(err.errors(), key=lambda e: (len(e["loc"]) + (e["type"] == "missing"), e["type"] == "missing"))
        raise UserError(f"{name}: {said(first, made)}; {fix}") from None


@cache
def _summary_schema() -> dict[str, Any]:
    return schema()


@cache
def _metrics_schema() -> dict[str, Any]:
    return Metrics.model_json_schema(schema_generator=_Titled, by_alias=True)


def said(error: ErrorDetails, made: dict[str, Any]) -> str:
    """`ranks[0].loop.steps is 'ten', not a whole number >= 0`, or `... is missing; it must be ...`."""
    path, node = _walk(list(error["loc"]), made)
    where = _path(path) or "the file"
    structural = error["type"] in ("model_type", "dict_type", "list_type", "finite_number")
    kind = (KINDS[error["type"]] if structural else "an object" if "properties" in node else
            node.get("title") or _bound(error) or KINDS.get(error["type"]) or error["msg"].removeprefix("Input should be "))
    if error["type"] == "missing":
        return f"{where} is missing; it must be {kind}"
    return f"{where} is {_shown(error['input'])}, not {kind}"


def _walk(loc: list[int | str], made: dict[str, Any]) -> tuple[list[int | str], dict[str, Any]]:
    """The loc without pydantic's union tags (`str`, `list[str]`), and the schema node it names."""
    node: dict[str, Any] = made
    path: list[int | str] = []
    for part in loc:
        node = _resolved(node, made)
        if isinstance(part, int) and "items" in node:
            node = node["items"]
        elif isinstance(part, str) and part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(part, str) and isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif isinstance(part, str) and "anyOf" in node:
            continue  # a union's member tag (report: str | list[str])
        else:
            node = {}
        path.append(part)
    return path, node if "title" in node else _resolved(node, made)


def _resolved(node: dict[str, Any], made: dict[str, Any]) -> dict[str, Any]:
    """A $ref's definition; a nullable kind (anyOf [kind, null]): the kind's, keeping the node's title."""
    rest = {k: v for k, v in node.items() if k not in ("$ref", "anyOf")}
    if "$ref" in node:
        return {**made["$defs"][node["$ref"].rsplit("/", 1)[-1]], **rest}
    options = [o for o in node.get("anyOf", ()) if o.get("type") != "null"]
    return {**_resolved(options[0], made), **rest} if len(options) == 1 else node


def _bound(error: ErrorDetails) -> str | None:
    """`a number >= 0` from a range error (a dict's values carry no title in the schema)."""
    ctx = error.get("ctx") or {}
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "of at least"}
    for key, sign in signs.items():
        if key in ctx:
            bound = round(float(ctx[key]), 6) + 0.0
            return f"a list {sign} {bound:g} item(s)" if key == "min_length" else f"a number {sign} {bound:g}"
    return None


def _path(parts: list[int | str]) -> str:
    """['ranks', 0, 'loop', 'steps'] -> ranks[0].loop.steps"""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
