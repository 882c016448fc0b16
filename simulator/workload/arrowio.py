"""numpy <-> arrow without pandas: pyarrow imports pandas (~0.45 s of CPU) the first time it
converts to or from numpy or Python objects (pa.array, Array.to_numpy: its pandas shim), so
a run's arrays are made from, and read as, their buffers here, which it does not. Used by the
trace readers (workload/) and the parquet writers (metrics/table.py, the recorder).
"""

from __future__ import annotations

import numpy as np


def arrow_array(values: np.ndarray, *, from_pandas: bool = True):
    """pa.array(values, from_pandas=from_pandas) of an int64 / float64 array (from_pandas:
    NaN is a null), or pa.array(values, type=pa.large_string()) of an object array of str,
    made from buffers."""
    import pyarrow as pa

    n = len(values)
    if values.dtype == object:
        strings = values.tolist()
        joined = "\0".join(strings)  # (a TypeError unless every value is a str)
        offsets = np.zeros(n + 1, np.int64)
        if n and joined.isascii() and joined.count("\0") == n - 1:
            # ASCII without NULs: the strings' ends are where the NULs are, no Python per string
            raw = np.frombuffer(joined.encode("ascii"), np.uint8)
            offsets[1:n] = np.flatnonzero(raw == 0) + 1 - np.arange(1, n)
            offsets[n] = len(raw) - (n - 1)
            data = "".join(strings).encode("ascii")
        else:
            encoded = [v.encode() for v in strings]
            np.cumsum(np.fromiter(map(len, encoded), np.int64, n), out=offsets[1:])
            data = b"".join(encoded)
        return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets),
                                                            pa.py_buffer(data)])
    if values.dtype not in (np.int64, np.float64):
        return pa.array(values, from_pandas=from_pandas)
    data = np.ascontiguousarray(values)
    kind = pa.int64() if data.dtype == np.int64 else pa.float64()
    if from_pandas and data.dtype.kind == "f":
        missing = np.isnan(data)
        if missing.any():
            valid = pa.py_buffer(np.packbits(~missing, bitorder="little"))
            return pa.Array.from_buffers(kind, n, [valid, pa.py_buffer(data)],
                                         null_count=int(missing.sum()))
    return pa.Array.from_buffers(kind, n, [None, pa.py_buffer(data)], null_count=0)


def numpy_column(col) -> np.ndarray:
    """col.to_numpy() of an arrow (chunked) array; an int64 / double one without nulls read
    from its buffers (a read-only view when it is one chunk)."""
    import pyarrow as pa

    if col.null_count or not (pa.types.is_int64(col.type) or pa.types.is_float64(col.type)):
        return col.to_numpy()
    dtype = np.dtype(np.int64 if pa.types.is_int64(col.type) else np.float64)
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    parts = [np.frombuffer(c.buffers()[1], dtype, len(c), c.offset * dtype.itemsize)
             for c in chunks]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)
