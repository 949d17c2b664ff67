"""GPU metric samples as columns, streamed from the export in rowid chunks (docs/PROFILING.md, "GPU metrics").

Each chunk is four arrays, one entry per metric value: time (ns, session clock), nsys GPU id, the
key's index in gpu_metrics.KEYS, and the value in the key's unit. Chunks are rowid ranges: nsys
writes no index, and a rowid range is the one filter SQLite answers without scanning the table,
so memory stays at two chunks: the one being summed and the next, read meanwhile on the other core
(SQLite and connectorx leave the GIL).

GPU_METRICS rows come out as they are. A GENERIC_EVENTS row holds every metric of one instant as
JSON of strings: SQLite's json_extract takes all reported fields in one call (one parse per row;
a call per field parsed each row once per field, 1.7x slower on the real export), and Arrow splits
and parses the array text in bulk.
"""
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from handler.runtime.errors import UserError

from . import JOINT, KEYS, MetricsSource
from ..sql_columns import read_arrow, read_columns

READERS = 1  # chunks read at once beside the summing thread; 2 gained nothing on the 2-core box (docs/RESULTS.md)
NO_TIME = -(1 << 62)  # a sample without a timestamp: outside every epoch
GPU_METRICS_CHUNK = 2_000_000  # rows, one value each
GENERIC_CHUNK = 200_000  # rows, a value per reported field each
NOT_REPORTED, UNLISTED = -1, -2  # a metric listed but not one we report (NVLink, clocks); a pair no table names


@dataclass(frozen=True)
class Chunk:
    time: np.ndarray  # int64 ns
    gpu: np.ndarray  # int64, nsys' GPU id
    key: np.ndarray  # int64, index into KEYS
    value: np.ndarray  # float64
    unknown: int = 0  # values of a (typeId, metric) the export's tables do not name
    wide: tuple | None = None  # (time, gpu, {joint name: values}) where the layout holds them side by side


def chunks(source: MetricsSource) -> Iterator[Chunk]:
    """The source's reported values, chunk by chunk."""
    reader = _gpu_metrics if source.layout == "GPU_METRICS" else _generic_events
    bounds = _rowids(source)
    with ThreadPoolExecutor(max_workers=READERS) as pool:  # the next chunks are read while this one is summed
        pending: list = []
        for low, high in bounds:
            pending.append(pool.submit(reader, source, low, high))
            if len(pending) > READERS:
                yield pending.pop(0).result()
        for job in pending:
            yield job.result()


def _rowids(source: MetricsSource) -> list[tuple[int, int]]:
    table = source.layout
    found = read_columns(source.path, f"SELECT COALESCE((SELECT MIN(rowid) FROM {table}), 0) AS lo, "
                                      f"COALESCE((SELECT MAX(rowid) FROM {table}), -1) AS hi",  # each one b-tree step
                         {"lo": "i8", "hi": "i8"})
    low, high = int(found["lo"][0]), int(found["hi"][0])
    step = GPU_METRICS_CHUNK if table == "GPU_METRICS" else GENERIC_CHUNK
    return [(a, min(a + step, high + 1)) for a in range(low, high + 1, step)]


def _wanted(source: MetricsSource) -> str:
    """The metricIds not worth reading: listed, but reported for no GPU (NVLink, clocks); they stay in
    SQLite. Any other row is read: a reported metric, or one no TARGET_INFO_GPU_METRICS row lists
    (counted as of an unknown source)."""
    reported = {int(s.metric) for s in source.series if isinstance(s.metric, int)}
    skipped = sorted({m for _, m in source.listed} - reported)
    return f" AND metricId NOT IN ({', '.join(map(str, skipped))})" if skipped else ""


def _gpu_metrics(source: MetricsSource, low: int, high: int) -> Chunk:
    """Three columns: time, code = GPU * 65536 + metricId (-1: a typeId TARGET_INFO_GPU_METRICS does
    not list), value."""
    rows = read_columns(source.path, f"SELECT COALESCE(timestamp, {NO_TIME}) AS t, {_code(source)} AS c, "
                                     f"CAST(value AS REAL) AS v FROM GPU_METRICS WHERE rowid >= {low} AND rowid < {high}"
                                     f" AND value IS NOT NULL{_wanted(source)}",
                        {"t": "i8", "c": "i8", "v": "f8"})
    lut, scale, width = _lookup(source)
    gpu, metric = rows["c"] >> 16, rows["c"] & 0xFFFF
    at = np.where((rows["c"] >= 0) & (metric < width), gpu * width + metric, len(lut) - 1)
    key = lut[at]
    keep = key >= 0
    return Chunk(rows["t"][keep], gpu[keep], key[keep], rows["v"][keep] * scale[at[keep]], int((key == UNLISTED).sum()))


def _code(source: MetricsSource) -> str:
    """SQL for GPU * 65536 + metricId, -1 for a typeId not listed: one comparison where the listed
    typeIds differ only in their low byte (as nsys writes them), else a lookup per row."""
    types = sorted({t for t, _ in source.listed})
    code = "(typeId & 255) * 65536 + metricId"
    if len({t >> 8 for t in types}) == 1:
        return f"(typeId >> 8 = {types[0] >> 8}) * ({code} + 1) - 1"
    return f"CASE WHEN typeId IN ({', '.join(map(str, types)) or 'NULL'}) THEN {code} ELSE -1 END"


def _lookup(source: MetricsSource) -> tuple[np.ndarray, np.ndarray, int]:
    """(GPU * width + metricId) -> key index (or NOT_REPORTED, UNLISTED) and scale, and width; the
    last entry stands for any code out of range."""
    width = max([m for _, m in source.listed] + [0]) + 1
    lut = np.full(256 * width + 1, UNLISTED, dtype=np.int64)
    scale = np.ones(len(lut))
    for type_id, metric in source.listed:
        lut[(type_id & 0xFF) * width + metric] = NOT_REPORTED
    for s in source.series:
        at = s.gpu * width + int(s.metric)
        lut[at], scale[at] = KEYS.index(s.key), s.scale
    return lut, scale, width


def _generic_events(source: MetricsSource, low: int, high: int) -> Chunk:
    parts, wide = [], []
    for type_id in sorted({s.type_id for s in source.series}):
        fields = [s for s in source.series if s.type_id == type_id]
        paths = [f"'$.\"{str(s.metric).replace(chr(39), chr(39) * 2)}\"'" for s in fields]
        if len(paths) == 1:  # json_extract of one path gives the value, not an array
            paths.append(paths[0])
        table = read_arrow(source.path, f"SELECT COALESCE(timestamp, rawTimestamp, {NO_TIME}) AS t, "
                                        f"json_extract(data, {', '.join(paths)}) AS v FROM GENERIC_EVENTS "
                                        f"WHERE rowid >= {low} AND rowid < {high} AND typeId = {type_id}")
        if not table.num_rows:
            continue
        values = _parse_arrays(table.column("v"), len(paths), source.path)[:, :len(fields)]
        time = table.column("t").to_numpy().astype(np.int64)
        gpu = type_id & 0xFF
        joint = {}
        for i, s in enumerate(fields):
            column = values[:, i] * s.scale
            ok = ~np.isnan(column)
            parts.append((time[ok], np.full(int(ok.sum()), gpu, dtype=np.int64),
                          np.full(int(ok.sum()), KEYS.index(s.key), dtype=np.int64), column[ok]))
            if (name := s.key.rsplit("_", 1)[0]) in JOINT:
                joint[name] = column
        wide.append((time, np.full(len(time), gpu, dtype=np.int64), joint))
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return Chunk(empty, empty, empty, np.empty(0), wide=(empty, empty, {}))
    time, gpu, key, value = (np.concatenate(column) for column in zip(*parts))
    names = sorted({n for _, _, j in wide for n in j})
    together = (np.concatenate([w[0] for w in wide]), np.concatenate([w[1] for w in wide]),
                {n: np.concatenate([w[2].get(n, np.full(len(w[0]), np.nan)) for w in wide]) for n in names})
    return Chunk(time, gpu, key, value, wide=together)


def _parse_arrays(column, width: int, path) -> np.ndarray:
    """'["12","0",null]' per row -> a (rows, width) float array, NaN where a field is missing or empty."""
    import pyarrow as pa
    import pyarrow.compute as pc
    call = pc.call_function
    text = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    text = call("replace_substring", [text], pc.ReplaceSubstringOptions('"', ""))
    text = call("utf8_trim", [text], pc.TrimOptions("[] \n"))
    text = call("replace_substring", [text], pc.ReplaceSubstringOptions("null", "nan"))
    text = pc.fill_null(text, ",".join(["nan"] * width))
    flat = call("utf8_trim_whitespace", [call("list_flatten", [call("split_pattern", [text], pc.SplitPatternOptions(","))])])
    flat = call("if_else", [call("equal", [flat, pa.scalar("")]), pa.scalar("nan"), flat])
    try:
        numbers = pc.cast(flat, "float64", safe=False)
    except pa.ArrowInvalid as err:
        raise UserError(f"{path}: a GPU-metrics value in GENERIC_EVENTS.data is not a number ({err}); the export "
                        "is not as nsys writes it: export the report again (nsys export --type sqlite)") from None
    if len(numbers) != len(column) * width:
        raise UserError(f"{path}: GENERIC_EVENTS.data holds GPU-metrics values with commas inside them; the export "
                        "is not as nsys writes it: export the report again (nsys export --type sqlite)")
    return numbers.to_numpy(zero_copy_only=False).reshape(-1, width)
