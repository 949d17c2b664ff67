"""Hypothesis strategies generated from the records' own JSON Schema (handler/profiling/record/: the
summary's, and the metrics'): every optional field present and absent, every number at its edges (its
least, its most, just inside them) or between, every nullable field null. A new field of a record is
generated here without a line changed."""
from typing import Any

from hypothesis import strategies as st

from handler.profiling.record.metrics import Metrics
from handler.profiling.record.parse import schema

TEXTS = ("not recorded", "metrics config.workers", "report: x", "nsight_logs/ddp_20261129_070000/gpu_2.nsys-rep",
         "resnet18", "resnet20", "allreduce", "powersgd", "fp16", "")


def summaries(overrides: dict[str, st.SearchStrategy[Any]] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    made = schema()
    return _of(made, made["$defs"], overrides or {}, ())


def record(name: str) -> st.SearchStrategy[dict[str, Any]]:
    """One record of the summary's schema by its name (`Machine`, `Run`, `CommConfig`, ...)."""
    made = schema()
    return _of(made["$defs"][name], made["$defs"], {}, ())


def metrics() -> st.SearchStrategy[dict[str, Any]]:
    made = Metrics.model_json_schema(by_alias=True)
    return _of(made, made.get("$defs", {}), {}, ())


def _of(node: dict[str, Any], defs: dict[str, Any], overrides: dict[str, st.SearchStrategy[Any]],
        at: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """overrides: a field's dotted path (`ranks.loop.steps`, list indexes left out) -> its strategy."""
    if ".".join(at) in overrides:
        return overrides[".".join(at)]
    if "$ref" in node:
        return _of(defs[node["$ref"].rsplit("/", 1)[-1]], defs, overrides, at)
    if "anyOf" in node:
        return st.one_of([_of(o, defs, overrides, at) for o in node["anyOf"]])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.sampled_from(TEXTS)
    if kind == "integer":
        least, most = node.get("minimum", 0), min(node.get("maximum", 10**6), 10**12)
        return st.one_of(st.sampled_from(sorted({least, least + 1, most})), st.integers(least, min(most, least + 64)))
    if kind == "number":
        return _numbers(node)
    if kind == "array":
        return st.lists(_of(node.get("items", {}), defs, overrides, at), min_size=node.get("minItems", 0), max_size=3)
    if kind == "object":
        return _objects(node, defs, overrides, at)
    return st.none()


def _numbers(node: dict[str, Any]) -> st.SearchStrategy[float]:
    least = node.get("minimum", node.get("exclusiveMinimum", 0.0))
    most = node.get("maximum", node.get("exclusiveMaximum", 1e7))
    edges = [v for v in (least, most, 1e-300 + least, least + 1e-9, 0.5 * (least + most))
             if ("exclusiveMinimum" not in node or v > least) and ("exclusiveMaximum" not in node or v < most)]
    open_ends = {"exclude_min": "exclusiveMinimum" in node, "exclude_max": "exclusiveMaximum" in node}
    inside = st.floats(least, most, allow_nan=False, allow_infinity=False, **open_ends)
    small = st.floats(max(least, 0.0), min(most, 1e4), exclude_min=open_ends["exclude_min"] and least >= 0.0,
                      exclude_max=open_ends["exclude_max"] and most <= 1e4)
    return st.one_of(st.sampled_from([float(v) for v in edges]), inside, small)


def _objects(node: dict[str, Any], defs: dict[str, Any], overrides: dict[str, st.SearchStrategy[Any]],
             at: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    properties: dict[str, Any] = node.get("properties", {})
    if not properties:  # a map: a few of its values under the phases' names
        values = node.get("additionalProperties")
        inner = _of(values, defs, overrides, at) if isinstance(values, dict) else st.none()
        return st.dictionaries(st.sampled_from(("data", "h2d", "forward", "backward", "optimizer", "0")), inner,
                               max_size=5)
    required = set(node.get("required", ()))
    fields = {k: _of(v, defs, overrides, (*at, k)) for k, v in properties.items()}
    return st.fixed_dictionaries({k: s for k, s in fields.items() if k in required},
                                 optional={k: s for k, s in fields.items() if k not in required})
