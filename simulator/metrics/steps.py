"""StepColumns: the per-step columns the summary, the time series and the alerts read.

A run's iterations table has one row per engine step (recorder.ITER_COLUMNS and the optional
columns); the metrics derived from it only need the step ends and a few columns, so the
recorder keeps those as compact numpy arrays (counts in the narrowest integer dtype that holds
them) and streams the full table to iterations.parquet. `as_steps` gives the same view of a
DataFrame read back from a run directory, so every derived figure is computed by the same code
over the same float64 values, whichever it starts from (an integer column read as int16 or as
int64 gives the same float64 values).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.workload.arrowio import numpy_column

if TYPE_CHECKING:
    import pandas as pd

# what the summary, time series, OpenMetrics and alerts read (decode_tokens only without
# num_sampled; the optional ones when present)
DERIVED_COLUMNS = ("duration_s", "num_seqs", "num_tokens", "decode_tokens", "num_preempted",
                   "num_running", "num_waiting", "kv_used_slots", "kv_usage", "kv_tokens_stored",
                   "num_sampled", "prefix_cache_queries", "prefix_cache_hits",
                   "kv_external_frag_slots")
EMPTY_COLUMNS = ("duration_s", "num_seqs", "num_tokens", "decode_tokens", "num_preempted",
                 "num_running", "num_waiting", "kv_used_slots", "kv_usage", "kv_tokens_stored")


class StepColumns:
    """Step ends (float64, start_s + duration_s per step) and the DERIVED_COLUMNS present, as
    numpy arrays; `len` is the number of steps, `in` and [] look a column up by name. A float
    column with few distinct values (kv_usage: one per free-block count) may be kept as codes
    into its sorted table of values (`coded`, 2 bytes a step): [] decodes it (a new array)."""

    __slots__ = ("ends", "columns", "coded", "memo")

    def __init__(self, ends: np.ndarray, columns: dict[str, np.ndarray],
                 coded: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.ends = ends
        self.columns = columns
        self.coded = coded or {}  # name -> (codes, sorted distinct values)
        # results derived from these steps, kept for a second caller (alerts.evaluate: the
        # summary and alerts.json read the same firings)
        self.memo: dict = {}

    def __len__(self) -> int:
        return len(self.ends)

    def __contains__(self, name: str) -> bool:
        return name in self.columns or name in self.coded

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.coded:
            codes, table = self.coded[name]
            return table[codes]
        return self.columns[name]

    def f64(self, name: str) -> np.ndarray:
        """A column as float64 (a view when it already is)."""
        return self[name].astype(np.float64, copy=False)

    def sort_key(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(codes, table) of a coded column: codes order as the values do (ties alike)."""
        return self.coded.get(name)


CACHE_BYTES = 128 << 20  # columns read back kept in memory (most recently used first)


class StreamedSteps(StepColumns):
    """The StepColumns of a streamed run, read back from its iterations.parquet when asked for,
    so that nothing per step but the step ends is held between the run and its outputs. A
    column is read row group by row group into the compact dtype the in-memory recorder would
    have kept (`dtypes`: the narrowest integer dtype of every chunk, promoted), a coded column
    as uint16 codes into `tables[name]` (the merged table of every chunk's distinct values):
    the same arrays, so every derived figure is the same. Columns read are kept, most recent
    first, up to CACHE_BYTES (a run of a few million steps keeps them all; a longer one
    reads a column again when it was dropped)."""

    __slots__ = ("_path", "_dtypes", "_tables", "_cache", "_cached")

    def __init__(self, ends: np.ndarray, path: Callable[[], Path], dtypes: dict[str, np.dtype],
                 tables: dict[str, np.ndarray]) -> None:
        super().__init__(ends, {}, {})
        self._path = path  # the file's current place (Result.write moves it)
        self._dtypes = dtypes
        self._tables = tables
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cached = 0

    def __contains__(self, name: str) -> bool:
        return name in self._dtypes

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._tables:
            return self._tables[name][self._read(name)]
        return self._read(name)

    def sort_key(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        table = self._tables.get(name)
        return None if table is None else (self._read(name), table)

    def _read(self, name: str) -> np.ndarray:
        """1. a cached column as it is; 2. else one array of the compact dtype filled row group
        by row group (codes: positions in the table, exact as the recorder checked); 3. kept
        if it fits CACHE_BYTES with the most recent others."""
        col = self._cache.get(name)
        if col is not None:
            self._cache.move_to_end(name)
            return col
        table = self._tables.get(name)
        col = np.empty(len(self.ends), np.uint16 if table is not None else self._dtypes[name])

        def fill(pos: int, group) -> None:
            part = numpy_column(group.column(0))
            col[pos:pos + len(part)] = part if table is None else positions_in(table, part)
        read_row_groups(self._path(), [name], fill)
        release_arrow_memory()
        if col.nbytes <= CACHE_BYTES:
            self._cache[name] = col
            self._cached += col.nbytes
            while self._cached > CACHE_BYTES:
                _, old = self._cache.popitem(last=False)
                self._cached -= old.nbytes
        return col


def distinct(values: np.ndarray) -> np.ndarray:
    """np.unique(values) (the sorted distinct values) by one sort.
    NOTE: numpy 2's np.unique hashes them (~2x slower from ~10^6 values: a million requests'
    event times) and imports numpy.ma (~20 ms of a run's start-up); floats with NaN or both
    signed zeros, whose representatives it picks by its own rules, are left to it."""
    s = np.sort(values)
    if s.dtype.kind == "f" and len(s):
        zeros = s[np.searchsorted(s, 0.0, side="left"):np.searchsorted(s, 0.0, side="right")]
        if np.isnan(s[-1]) or np.signbit(zeros).any():
            return np.unique(values)
    if len(s) < 2:
        return s
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


_BUCKETS_PER_VALUE = 4  # positions_in's buckets per table entry


def positions_in(table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """np.searchsorted(table, values) (`table` sorted, distinct floats), ~4x faster when the
    values are table entries (a coded column read back): each value's bucket of equal width
    over [table[0], table[-1]] gives the first entry of its bucket (the same float operations
    on the same bits: a table entry falls in its own bucket), which is its position when it
    equals the value; any other value (a later entry of a crowded bucket, or one not in the
    table) is searched as before."""
    n = len(table)
    lo, hi = (float(table[0]), float(table[-1])) if n else (0.0, 0.0)
    buckets = _BUCKETS_PER_VALUE * n
    scale = buckets / (hi - lo) if hi > lo else math.inf
    if not math.isfinite(scale) or not len(values):
        return np.searchsorted(table, values)

    def bucket(x: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # NaN / inf: any bucket, searched below
            b = ((x - lo) * scale).astype(np.int64)
        return np.clip(b, 0, buckets - 1, out=b)
    # first[b]: the first entry whose bucket is >= b (buckets are non-decreasing in the value)
    first = np.searchsorted(bucket(table), np.arange(buckets), side="left")
    pos = first[bucket(values)]
    np.minimum(pos, n - 1, out=pos)
    miss = np.flatnonzero(table[pos] != values)
    if len(miss):
        pos[miss] = np.searchsorted(table, values[miss])
    return pos


def read_ends_and_durations(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(start_s + duration_s, duration_s) of every step of an iterations.parquet, the sums
    made row group by row group (element-wise: the same floats as over the whole columns)."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as f:
        n = f.metadata.num_rows
    ends, durations = np.empty(n), np.empty(n)

    def fill(pos: int, group) -> None:
        k = group.num_rows
        durations[pos:pos + k] = numpy_column(group.column(1))
        np.add(numpy_column(group.column(0)), durations[pos:pos + k], out=ends[pos:pos + k])
    read_row_groups(path, ["start_s", "duration_s"], fill)
    release_arrow_memory()
    return ends, durations


_READERS = 2  # threads reading a file's row groups (read_row_groups)


def read_row_groups(path: Path, columns: list[str], fill: Callable[[int, Any], None]) -> None:
    """fill(first row, the group's table of `columns`) for every row group of a parquet file,
    by _READERS threads, each with its own handle on the file and every _READERS-th group:
    pyarrow reads, decompresses and decodes without the GIL, so a long run's columns are
    read back on both cores (a million requests' summary: ~2.7 s of reads, one core).
    `fill` writes each group's own rows only: any order gives the same arrays. An error in
    either thread is raised here, after both have stopped."""
    import pyarrow.parquet as pq

    with pq.ParquetFile(path) as f:
        meta = f.metadata
        sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    firsts = [0]
    for k in sizes[:-1]:
        firsts.append(firsts[-1] + k)
    failed: list[BaseException] = []

    def read(first_group: int) -> None:
        try:
            with pq.ParquetFile(path) as f:
                for i in range(first_group, len(sizes), _READERS):
                    if failed:
                        return
                    fill(firsts[i], f.read_row_group(i, columns=columns))
        except BaseException as e:  # noqa: BLE001 (raised in the caller's thread)
            failed.append(e)
    threads = [threading.Thread(target=read, args=(k,), name="parquet row groups")
               for k in range(1, min(_READERS, len(sizes)))]
    for t in threads:
        t.start()
    read(0)
    for t in threads:
        t.join()
    if failed:
        raise failed[0]


def release_arrow_memory() -> None:
    """Hand pyarrow's freed buffers back to the system (its pool keeps them otherwise, on top
    of what numpy allocates next)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()


TRIM_STEPS = 1 << 20  # runs of more steps than this hand their freed heap back (release_memory)
_malloc_trim = None  # glibc's malloc_trim, once looked up (False: not glibc)


def release_memory(num_steps: int) -> None:
    """After a long run's large frees (num_steps > TRIM_STEPS; a no-op below): pyarrow's
    pool, then glibc's free heap pages back to the system (`malloc_trim(0)`).
    NOTE: a long run's small arrays (65,536-step chunks, token-gap parts, the row groups'
    columns under glibc's 32 MB mmap threshold) come from the heap; freed, they stay in the
    process between live ones (~27 bytes a step of W4 at the summary, measured) unless
    trimmed. Nothing computed depends on it (no output changes)."""
    global _malloc_trim
    if num_steps <= TRIM_STEPS:
        return
    release_arrow_memory()
    if _malloc_trim is None:
        try:
            import ctypes

            _malloc_trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
            _malloc_trim = False
    if _malloc_trim:
        _malloc_trim(0)


def empty_steps() -> StepColumns:
    """A run without steps: the columns of an empty iterations table (no optional ones)."""
    return StepColumns(np.zeros(0), {c: np.zeros(0) for c in DERIVED_COLUMNS if c in EMPTY_COLUMNS})


def as_steps(iterations: pd.DataFrame | StepColumns) -> StepColumns:
    """The StepColumns of an iterations table (itself when it already is one)."""
    if isinstance(iterations, StepColumns):
        return iterations
    if not len(iterations):
        ends = np.zeros(0)
    else:
        ends = (iterations.start_s + iterations.duration_s).to_numpy(np.float64)
    return StepColumns(ends, {c: iterations[c].to_numpy() for c in iterations.columns})
