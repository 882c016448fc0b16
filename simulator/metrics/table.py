"""Table: named numpy columns of one length, the requests table of a run without pandas.

A run's requests table is made of int64 / float64 columns and str columns (status, reject
reason, tenant, tier); the summary, the time series and the alerts only read its columns as
numpy arrays (`column`, which reads a pandas DataFrame the same way), so a run needs pandas
only when a caller asks for a DataFrame (Table.to_pandas, Result.requests). `write_parquet`
writes such columns as the file DataFrame.to_parquet(path, index=False) writes, byte for byte
(the same arrow table, pandas metadata included), without importing pandas (~0.45 s of CPU of
every run's start-up); tables it cannot vouch for (no rows, a column of another kind) are
written by pandas itself.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.workload.arrowio import arrow_array

if TYPE_CHECKING:
    import pandas as pd


def column(table: Any, name: str) -> np.ndarray:
    """A column of a Table or a pandas DataFrame as a numpy array (str columns: object)."""
    if isinstance(table, Table):
        return table[name]
    return table[name].to_numpy()


class Table:
    """Columns by name (numpy arrays of one length: int64, float64 with NaN for missing, or
    object arrays of str); `len` is the number of rows, `in` and [] look a column up."""

    __slots__ = ("_cols", "_n")

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self._cols = columns
        self._n = len(next(iter(columns.values()))) if columns else 0

    def __len__(self) -> int:
        return self._n

    def __contains__(self, name: str) -> bool:
        return name in self._cols

    def __getitem__(self, name: str) -> np.ndarray:
        return self._cols[name]

    @property
    def columns(self) -> list[str]:
        return list(self._cols)

    def to_pandas(self) -> pd.DataFrame:
        """The DataFrame (str columns from lists, as pandas infers their dtype)."""
        import pandas as pd

        return pd.DataFrame({name: (v.tolist() if v.dtype == object else v)
                             for name, v in self._cols.items()})

    def to_parquet(self, path: str | Path) -> None:
        """The file self.to_pandas().to_parquet(path, index=False) writes."""
        write_parquet(path, self._cols)


def _arrow_columns(columns: dict[str, np.ndarray]):
    """(arrow arrays, pandas metadata of each column) as pyarrow's Table.from_pandas makes
    them for a DataFrame of these columns, or None when a column is not one this module
    vouches for (then pandas writes the table)."""
    arrays, meta = [], []
    for name, v in columns.items():
        if not isinstance(name, str) or v.ndim != 1:
            return None
        if v.dtype in (np.int64, np.float64):
            kind = str(v.dtype)
            meta.append({"name": name, "field_name": name, "pandas_type": kind, "numpy_type": kind,
                         "metadata": None})
        elif v.dtype == object:
            try:
                arrays.append(arrow_array(v))
            except TypeError:  # None or other objects: pandas infers another dtype than str
                return None
            meta.append({"name": name, "field_name": name, "pandas_type": "object",
                         "numpy_type": "str", "metadata": None})
            continue
        else:
            return None
        arrays.append(arrow_array(v))
    return arrays, meta


def pandas_version() -> str:
    """pandas.__version__ without importing pandas: the installed distribution's version."""
    return importlib.metadata.version("pandas")


def pandas_schema_metadata(meta: list[dict[str, Any]]) -> dict[bytes, bytes]:
    """The b"pandas" schema metadata pyarrow gives a DataFrame without its index."""
    import pyarrow as pa

    return {b"pandas": json.dumps({
        "index_columns": [], "column_indexes": [], "columns": meta, "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": pandas_version()}).encode("utf8")}


def arrow_schema(columns: dict[str, np.ndarray]):
    """The arrow schema (pandas metadata included) Table.from_pandas(DataFrame(columns),
    preserve_index=False) gives, for int64 / float64 columns; None for other kinds."""
    made = _arrow_columns({c: np.zeros(0, v.dtype) for c, v in columns.items()})
    if made is None:
        return None
    return _schema(columns, *made)


def write_parquet(path: str | Path, columns: dict[str, np.ndarray]) -> None:
    """pandas.DataFrame(columns).to_parquet(path, index=False), byte for byte: the same arrow
    table written by pyarrow with the same options (snappy); pandas itself for an empty
    table or a column of another kind."""
    made = _arrow_columns(columns) if columns and len(next(iter(columns.values()))) else None
    if made is None:
        Table(columns).to_pandas().to_parquet(path, index=False)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    arrays, meta = made
    pq.write_table(pa.Table.from_arrays(arrays, schema=_schema(columns, arrays, meta)), str(path),
                   compression="snappy")


def _schema(names: Iterable[str], arrays: list, meta: list[dict[str, Any]]):
    """The arrow schema of these columns with the pandas metadata Table.from_pandas adds."""
    import pyarrow as pa

    return pa.schema([pa.field(c, a.type) for c, a in zip(names, arrays)],
                     metadata=pandas_schema_metadata(meta))
