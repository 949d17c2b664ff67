"""Rows of an export as numpy columns, with no Python object per row (docs/STYLE principle 13).

connectorx reads an SQLite query into Arrow in compiled code; each Arrow column becomes a numpy
array without a copy. Side by side on 4 M runtime-call rows of 4 integer columns (2-core box):
numpy.fromiter over a sqlite3 cursor 4.0 s, connectorx 1.2 s (docs/RESULTS.md).

Every selected column must be named (`AS name`) and must not hold NULL: COALESCE it in the query
to the value that stands for "missing", so that each column stays a plain int64 or float64 array.
"""
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from handler.runtime.errors import UserError

from .nsys import message_error


SAFE = re.compile(r"[\w./ -]+")  # a path connectorx's URI takes as it is


@contextmanager
def _uri(export: Path) -> Iterator[str]:
    """connectorx's URI for the export; a path it cannot take (bytes that are not UTF-8, `?`, `#`, `%`)
    is read through a link of a plain name in a temporary folder."""
    path = str(export.resolve())
    if SAFE.fullmatch(path):
        yield "sqlite://" + path
        return
    with tempfile.TemporaryDirectory() as folder:
        link = Path(folder) / "export.sqlite"
        link.symlink_to(export.resolve())
        yield "sqlite://" + str(link)


def read_columns(export: Path, sql: str, dtypes: dict[str, str]) -> dict[str, np.ndarray]:
    """{name: array} for the query's columns, each cast to its dtype in `dtypes` ("i8", "f8").

    An empty result gives empty arrays of those dtypes (SQLite gives no type to a column of no rows)."""
    table = read_arrow(export, sql)
    out = {}
    for name, dtype in dtypes.items():
        column = table.column(name)
        if column.null_count:
            raise ValueError(f"column {name} of {sql!r} holds NULL: COALESCE it in the query")
        out[name] = column.to_numpy().astype(dtype, copy=False) if len(column) else np.empty(0, dtype=dtype)
    return out


def read_arrow(export: Path, sql: str):
    """The query's result as one Arrow table (gpu_metrics/read.py parses a text column of it in bulk).
    SQLite's complaint (a damaged page, a missing column) is the one line nsys.message_error words."""
    try:
        import connectorx  # imported here: the report's start-up (one-line errors, --help) needs none of it
    except ImportError:  # a laptop venv built from an older requirements-report.txt
        raise UserError("the report needs connectorx and pyarrow to read exports as columns; "
                        "pip install -r requirements-report.txt") from None
    with _uri(export) as uri:
        try:
            return connectorx.read_sql(uri, sql, return_type="arrow")
        except RuntimeError as err:  # connectorx gives SQLite's errors as RuntimeError with SQLite's words
            raise UserError(message_error(export, str(err))) from None
