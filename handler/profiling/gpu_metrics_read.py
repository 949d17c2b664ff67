"""GPU metric samples as columns, streamed from the export in rowid chunks (docs/PROFILING.md, "GPU metrics").

Each chunk is four arrays, one entry per metric value: time (ns, session clock), nsys GPU id, the
key's index in gpu_metrics.KEYS, and the value in the key's unit. Chunks are rowid ranges: nsys
writes no index, and a rowid range is the one filter SQLite answers without scanning the table,
so memory stays at one chunk (two while the next is read on the other core).

GPU_METRICS rows come out as they are. A GENERIC_EVENTS row holds every metric of one instant as
JSON of strings: SQLite's json_extract takes all reported fields in one call (one parse per row;
a call per field parsed each row once per field, 1.7x slower on the real export), and Arrow splits
and parses the array text in bulk.
"""
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .gpu_metrics import KEYS, MetricsSource
from .sql_columns import read_arrow, read_columns

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


def chunks(source: MetricsSource, since: int | None = None, until: int | None = None) -> Iterator[Chunk]:
    """The source's reported values, chunk by chunk; since/until (ns) keep a time window only."""
    reader = _gpu_metrics if source.layout == "GPU_METRICS" else _generic_events
    bounds = _rowids(source)
    with ThreadPoolExecutor(max_workers=1) as pool:  # the next chunk is read while this one is summed
        pending = None
        for low, high in bounds:
            job = pool.submit(reader, source, low, high, since, until)
            if pending is not None:
                yield pending.result()
            pending = job
        if pending is not None:
            yield pending.result()


def _rowids(source: MetricsSource) -> list[tuple[int, int]]:
    table = source.layout
    found = read_columns(source.path, f"SELECT COALESCE(MIN(rowid), 0) AS lo, COALESCE(MAX(rowid), -1) AS hi "
                                      f"FROM {table}", {"lo": "i8", "hi": "i8"})
    low, high = int(found["lo"][0]), int(found["hi"][0])
    step = GPU_METRICS_CHUNK if table == "GPU_METRICS" else GENERIC_CHUNK
    return [(a, min(a + step, high + 1)) for a in range(low, high + 1, step)]


def _window(column: str, since: int | None, until: int | None) -> str:
    return (f" AND {column} >= {int(since)}" if since is not None else "") + \
           (f" AND {column} < {int(until)}" if until is not None else "")


def _gpu_metrics(source: MetricsSource, low: int, high: int, since, until) -> Chunk:
    rows = read_columns(source.path, f"SELECT COALESCE(timestamp, {NO_TIME}) AS t, typeId AS ty, metricId AS m, "
                                     f"CAST(value AS REAL) AS v FROM GPU_METRICS WHERE rowid >= {low} AND rowid < {high}"
                                     f" AND value IS NOT NULL{_window('timestamp', since, until)}",
                        {"t": "i8", "ty": "i8", "m": "i8", "v": "f8"})
    types = np.array(sorted({t for t, _ in source.listed}), dtype=np.int64)
    width = max([m for _, m in source.listed] + [0]) + 1
    lut = np.full(len(types) * width + 1, UNLISTED, dtype=np.int64)  # the last entry: any pair not listed
    scale = np.ones(len(lut))
    for type_id, metric in source.listed:
        lut[int(np.searchsorted(types, type_id)) * width + metric] = NOT_REPORTED
    for s in source.series:
        at = int(np.searchsorted(types, s.type_id)) * width + int(s.metric)
        lut[at], scale[at] = KEYS.index(s.key), s.scale
    at = np.minimum(np.searchsorted(types, rows["ty"]), max(len(types) - 1, 0))
    listed = (types[at] == rows["ty"]) & (rows["m"] >= 0) & (rows["m"] < width) if len(types) else \
        np.zeros(len(rows["ty"]), dtype=bool)
    code = np.where(listed, at * width + rows["m"], len(lut) - 1)
    key = lut[code]
    keep = key >= 0
    return Chunk(rows["t"][keep], rows["ty"][keep] & 0xFF, key[keep], rows["v"][keep] * scale[code[keep]],
                 int((key == UNLISTED).sum()))


def _generic_events(source: MetricsSource, low: int, high: int, since, until) -> Chunk:
    parts = []
    for type_id in sorted({s.type_id for s in source.series}):
        fields = [s for s in source.series if s.type_id == type_id]
        paths = [f"'$.\"{str(s.metric).replace(chr(39), chr(39) * 2)}\"'" for s in fields]
        if len(paths) == 1:  # json_extract of one path gives the value, not an array
            paths.append(paths[0])
        table = read_arrow(source.path, f"SELECT COALESCE(timestamp, rawTimestamp, {NO_TIME}) AS t, "
                                        f"json_extract(data, {', '.join(paths)}) AS v FROM GENERIC_EVENTS "
                                        f"WHERE rowid >= {low} AND rowid < {high} AND typeId = {type_id}"
                                        f"{_window('COALESCE(timestamp, rawTimestamp)', since, until)}")
        if not table.num_rows:
            continue
        values = _parse_arrays(table.column("v"), len(paths))[:, :len(fields)]
        time = table.column("t").to_numpy().astype(np.int64)
        for i, s in enumerate(fields):
            column = values[:, i] * s.scale
            ok = ~np.isnan(column)
            parts.append((time[ok], np.full(int(ok.sum()), s.gpu, dtype=np.int64),
                          np.full(int(ok.sum()), KEYS.index(s.key), dtype=np.int64), column[ok]))
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return Chunk(empty, empty, empty, np.empty(0))
    time, gpu, key, value = (np.concatenate(column) for column in zip(*parts))
    return Chunk(time, gpu, key, value)


def _parse_arrays(column, width: int) -> np.ndarray:
    """'["12","0",null]' per row -> a (rows, width) float array, NaN where a field is missing."""
    import pyarrow.compute as pc
    call = pc.call_function
    text = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    text = call("replace_substring", [text], pc.ReplaceSubstringOptions('"', ""))
    text = call("utf8_trim", [text], pc.TrimOptions("[] \n"))
    text = call("replace_substring", [text], pc.ReplaceSubstringOptions("null", "nan"))
    text = pc.fill_null(text, ",".join(["nan"] * width))
    flat = call("list_flatten", [call("split_pattern", [text], pc.SplitPatternOptions(","))])
    numbers = pc.cast(call("utf8_trim_whitespace", [flat]), "float64", safe=False)
    return numbers.to_numpy(zero_copy_only=False).reshape(-1, width)
