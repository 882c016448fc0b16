"""MetricsRecorder: what a run leaves behind, appended step by step.

The engine hands over one StepRecord per engine step (the replica fills it from the step's
Batch and the scheduler's stats after commit), or k steps at once as columns (`record_many`,
the event-level advance), and every request that ends (finished or rejected). The recorder only
appends; the tables are built when asked for:
- iterations: one row per step, ITER_COLUMNS always, then OPTIONAL_ITER_COLUMNS present when
  the engine keeps them (a record field is None on every step, or on none);
- requests: one row per request, in req_id order;
- token gaps: every inter-token gap, kept as (value, count).
Memory per step holds no Python objects and, for a streamed run, only what the summary needs:
- steps are gathered into chunks of _CHUNK_ROWS rows (record's rows as tuples, record_many's
  blocks as arrays or numpy scalars, one typed array per column when the chunk is sealed);
- each sealed chunk gives the StepColumns the summary, time series and alerts read (steps.py:
  step ends, durations, gauges, counts in the narrowest integer dtype), and the full row
  either to an iterations.parquet being written (`iterations_path`: row groups of
  ROW_GROUP_ROWS rows, pyarrow's default, so the file is the one DataFrame.to_parquet writes,
  byte for byte) or, without a path, kept compact for iterations_frame() (`keep_iterations`);
- requests become typed columns every _REQUEST_CHUNK ended requests (the Request objects go).
KV counters arrive as the manager's running totals (StepRecord.*_total) and are stored as
per-step increments, as vLLM's counters are reported.
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.metrics.steps import (
    DERIVED_COLUMNS,
    StepColumns,
    StreamedSteps,
    distinct,
    empty_steps,
    read_ends_and_durations,
    release_arrow_memory,
    release_memory,
)
from simulator.metrics.table import Table, arrow_schema
from simulator.workload.arrowio import arrow_array
from simulator.workload.request import Request

if TYPE_CHECKING:
    import pandas as pd

ITER_COLUMNS = ("start_s", "duration_s", "num_seqs", "num_tokens", "prefill_tokens",
                "decode_tokens", "num_preempted", "num_admitted", "num_running", "num_waiting",
                "kv_used_slots", "kv_usage", "kv_tokens_stored")
# In table order: output tokens sampled in the step; the prefix-cache token counters of the step
# (vLLM's prefix_cache_queries / _hits) and cached blocks evicted in it; swap seconds charged to
# it; free slots no request could use after it (an allocator's external fragmentation). The
# summary uses them when present and reports null otherwise.
OPTIONAL_ITER_COLUMNS = ("num_sampled", "prefix_cache_queries", "prefix_cache_hits", "kv_evictions",
                         "swap_s", "kv_external_frag_slots")


@dataclass(slots=True)
class StepRecord:
    """One engine step as the metrics layer stores it: what ran, and the gauges after commit."""

    start_s: float
    duration_s: float
    num_seqs: int
    num_tokens: int
    prefill_tokens: int
    decode_tokens: int
    num_preempted: int
    num_admitted: int
    num_running: int
    num_waiting: int
    kv_used_slots: int
    kv_usage: float
    kv_tokens_stored: int
    num_sampled: int | None = None
    prefix_queries_total: int | None = None  # running totals; None: no prefix cache
    prefix_hits_total: int | None = None
    evictions_total: int | None = None
    swap_s: float | None = None  # None: no swap space
    kv_external_frag_slots: int | None = None  # None: every free slot is usable
    token_gaps: np.ndarray | None = None  # inter-token gaps sampled at the step's end


# (column, record field, stored as per-step increments of a running total)
_OPTIONAL = (("num_sampled", "num_sampled", False),
             ("prefix_cache_queries", "prefix_queries_total", True),
             ("prefix_cache_hits", "prefix_hits_total", True),
             ("kv_evictions", "evictions_total", True),
             ("swap_s", "swap_s", False),
             ("kv_external_frag_slots", "kv_external_frag_slots", False))
# NOTE: one C call reads a whole record into a row tuple: the per-step cost stays ~1 us
_ROW = operator.attrgetter(*ITER_COLUMNS, *(f for _, f, _ in _OPTIONAL))

_NAMES = (*ITER_COLUMNS, *(f for _, f, _ in _OPTIONAL))  # record fields, in row order
_TABLE = (*ITER_COLUMNS, *(c for c, _, _ in _OPTIONAL))  # their iteration-table columns
_IS_TOTAL = tuple(name in {f for _, f, t in _OPTIONAL if t} for name in _NAMES)
_BLOCK = operator.itemgetter(*_NAMES)  # a record_many's columns in row order (one C call)
_FLOATS = frozenset({"start_s", "duration_s", "kv_usage", "swap_s"})  # float64; the rest int64
_NUM_OPTIONAL = len(_OPTIONAL)

_CHUNK_ROWS = 1 << 16  # steps gathered before they become typed columns
_GAP_BATCH = 1 << 16  # token gaps buffered before they are compressed to (value, count)
ROW_GROUP_ROWS = 1024 * 1024  # pyarrow's default row group length (DataFrame.to_parquet's)
# a streamed run keeps its StepColumns in memory up to this many steps (~30 bytes a step), then
# drops them and reads them back from its file at the end (StreamedSteps)
_KEEP_STEPS = 1 << 22
_REQUEST_CHUNK = 4096  # ended requests kept as objects before they become typed columns
_INT_TYPES = (np.int8, np.int16, np.int32)


def _narrow(values: np.ndarray) -> np.ndarray:
    """int64 counts in the narrowest integer dtype holding them (exact; float64 as it is)."""
    if values.dtype.kind != "i" or not len(values):
        return values
    lo, hi = int(values.min()), int(values.max())
    for t in _INT_TYPES:
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return values.astype(t)
    return values


def _widen(parts: list[np.ndarray], dtype) -> np.ndarray:
    """Compact chunk arrays as one array of the table's dtype."""
    if len(parts) == 1:
        return parts[0].astype(dtype, copy=False)
    out = np.empty(sum(len(p) for p in parts), dtype)
    pos = 0
    for p in parts:
        out[pos:pos + len(p)] = p
        pos += len(p)
    return out


_CODED = frozenset({"kv_usage"})  # float gauges kept as codes into their distinct values
_MAX_CODES = 1 << 16


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.int64), b.view(np.int64))


def _encode(values: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(sorted distinct values, uint16 codes) of a float chunk, or (None, values) when it has
    too many distinct values or the codes would not give back its exact bits (np.unique
    merges -0.0 with 0.0). np.unique over the runs of equal neighbours (a gauge holds its value
    over several steps), the runs' codes repeated: the same table and codes, ~1/3 the sort."""
    starts, lengths = _equal_runs(values)
    table, run_codes = np.unique(values[starts], return_inverse=True)
    codes = run_codes.repeat(lengths)
    if len(table) > _MAX_CODES or not _same_bits(table[codes], values):
        return None, values
    return table, codes.astype(np.uint16)


def _merge_codes(parts: list[tuple[np.ndarray | None, np.ndarray]]
                 ) -> tuple[np.ndarray | None, np.ndarray]:
    """The chunks' codes into one table (exact: each code stands for one float64 value), or
    the decoded float64 values when they do not fit uint16 codes."""
    if len(parts) == 1:
        return parts[0]
    if all(t is not None for t, _ in parts):
        table = distinct(np.concatenate([t for t, _ in parts]))
        where = [np.searchsorted(table, t) for t, _ in parts]
        if len(table) <= _MAX_CODES and all(_same_bits(table[w], t) for w, (t, _) in zip(where, parts)):
            return table, np.concatenate([w.astype(np.uint16)[c] for w, (_, c) in zip(where, parts)])
    return None, np.concatenate([c if t is None else t[c] for t, c in parts])


def unique_counts(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(a, return_counts=True) for a 1-D array, by its runs of equal neighbours
    first: a step's gaps are mostly one value (the step's duration) and a decode run's repeat
    each step's, so the sort sees the runs' values (~1/20 of W2's gaps), not every gap.
    Same values and counts (a run's value is its first element: equal values are equal here)."""
    starts, lengths = _equal_runs(a)
    values, inverse = np.unique(a[starts], return_inverse=True)
    # (counts as float64 sums of run lengths: exact below 2^53)
    return values, np.bincount(inverse, weights=lengths, minlength=len(values)).astype(np.int64)


def _equal_runs(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal neighbours of a 1-D array starts, and its length."""
    n = len(a)
    edge = np.empty(n, bool)
    edge[:1] = True
    np.not_equal(a[1:], a[:-1], out=edge[1:])
    starts = edge.nonzero()[0]
    return starts, np.diff(starts, append=n)


def _missing_error(name: str, missing: int, total: int) -> ValueError:
    return ValueError(f"iteration column {name} is missing on {missing} of {total} steps; "
                      f"record it on every step or never")


class IterationsWriter:
    """iterations.parquet written as the run goes: row groups of ROW_GROUP_ROWS rows, each
    column contiguous, the schema DataFrame.to_parquet gives the same table (pandas metadata
    included), so the bytes are those of writing the whole DataFrame at the end."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._parts: list[dict[str, np.ndarray]] = []
        self._rows = 0
        self._writer = None
        self._schema = None
        self.num_rows = 0
        self._thread: threading.Thread | None = None  # a background close (close(background=True))
        self._group: threading.Thread | None = None  # the row group being encoded and written
        # a write that failed (in either thread): raised in the caller's thread by every later call
        self._failed: BaseException | None = None

    def write(self, chunk: dict[str, np.ndarray]) -> None:
        """A sealed chunk (table columns in order, compact dtypes); whole row groups go out."""
        self._check()
        self._parts.append(chunk)
        self._rows += len(next(iter(chunk.values())))
        while self._rows >= ROW_GROUP_ROWS:
            self._write_group(ROW_GROUP_ROWS)

    def _write_group(self, n: int) -> None:
        names = list(self._parts[0])
        taken: list[dict[str, np.ndarray]] = []
        need = n
        while need:
            part = self._parts[0]
            k = len(part[names[0]])
            if k <= need:
                taken.append(self._parts.pop(0))
                need -= k
            else:
                taken.append({c: v[:need] for c, v in part.items()})
                self._parts[0] = {c: v[need:] for c, v in part.items()}
                need = 0
        self._rows -= n
        self._join_group()
        # NOTE: widened, encoded and compressed by a thread while the run goes on (numpy's copies
        # and pyarrow's encoding run without the GIL: the second core); one group at a time, in
        # order, so the file's bytes are the same, and its memory is bounded by the group in flight
        self._group = threading.Thread(target=self._write_table, args=(taken, names),
                                       name="iterations.parquet row group")
        self._group.start()
        self.num_rows += n

    def _write_table(self, taken: list[dict[str, np.ndarray]], names: list[str]) -> None:
        """The group's chunks as one table of the file's dtypes, written (the group's thread)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            columns = {c: _widen([t[c] for t in taken], np.float64 if c in _FLOATS else np.int64)
                       for c in names}
            del taken[:]
            if self._writer is None:
                # NOTE: the schema Table.from_pandas gives these columns, made without pandas
                self._schema = arrow_schema(columns)
                self._writer = pq.ParquetWriter(self.path, self._schema, compression="snappy")
            table = pa.Table.from_arrays([arrow_array(v, from_pandas=False) for v in columns.values()],
                                         schema=self._schema)
            del columns
            self._writer.write_table(table)
        except BaseException as e:  # noqa: BLE001 (raised by _join_group, in the caller's thread)
            self._failed = e

    def _join_group(self) -> None:
        """The row group in flight written (its error raised here), its memory handed back."""
        if self._group is None:
            return
        self._group.join()
        self._group = None
        self._check()
        release_memory(self.num_rows)  # the group's columns, freed

    def _check(self) -> None:
        """A failed write fails every later call: the file would miss a row group."""
        if self._failed is not None:
            raise self._failed

    def abort(self) -> None:
        """The run failed: the group in flight joined (its error dropped: the run's own is
        raised), the writer closed and the partial file removed, so nothing writes to it."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._group is not None:
            self._group.join()
            self._group = None
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001, S110 (the run's own error is what is raised)
                pass
            self._writer = None
        self.path.unlink(missing_ok=True)
        self._failed = self._failed or RuntimeError(f"{self.path}: the run failed; not written")

    def close(self, *, background: bool = False) -> None:
        """The last (short) row group and the footer; a run without steps writes the empty
        table as before (ITER_COLUMNS, float64). `background`: written by a thread, beside
        what the caller does next (pyarrow encodes without the GIL: the summary and the
        monitoring files of a short run are made meanwhile); `wait` joins it (every reader
        of the file waits first), and raises what it raised."""
        if not background:
            self._close()
            return

        def close() -> None:
            try:
                self._close()
            except BaseException as e:  # noqa: BLE001 (raised by wait, in the caller's thread)
                self._failed = e
        self._thread = threading.Thread(target=close, name="iterations.parquet")
        self._thread.start()

    def wait(self) -> None:
        """The file complete (a background close joined; its error raised here, and again by
        every later call)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._check()

    def _close(self) -> None:
        self._check()
        if self._rows:
            self._write_group(self._rows)
        self._join_group()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            release_arrow_memory()
        elif not self.num_rows:
            import pandas as pd

            pd.DataFrame({c: np.asarray(()) for c in ITER_COLUMNS}).to_parquet(self.path, index=False)


class MetricsRecorder:
    """Steps are gathered into chunks and sealed into typed columns (module docstring):
    `iterations_path` streams the iterations table to that parquet file as the run goes
    (then iterations_frame() reads it back), else `keep_iterations` keeps it compact in
    memory (False: only what the summary needs, e.g. --no-iterations)."""

    def __init__(self, total_slots: int, *, iterations_path: str | Path | None = None,
                 keep_iterations: bool = True) -> None:
        self.total_slots = total_slots
        self.num_steps = 0
        # the open chunk: record's row tuples and their positions, record_many's blocks
        self._rows: list[tuple] = []
        self._row_at: list[int] = []
        self._blocks: list[tuple[int, int, tuple]] = []
        self._n = 0
        self._present: tuple[bool, ...] | None = None  # which optional columns are kept
        self._seen = [0] * len(_NAMES)  # steps each column was recorded on (presence errors)
        self._totals = [0] * len(_NAMES)  # last running total of the *_total columns
        self._steps: dict[str, list[np.ndarray]] = {}  # StepColumns chunks (compact)
        self._coded: dict[str, list[tuple[np.ndarray | None, np.ndarray]]] = {}  # (table, codes)
        self._ends: list[np.ndarray] = []
        # a streamed run past _KEEP_STEPS keeps no StepColumns: each column's compact dtype
        # and each coded chunk's table of distinct values (None: not codable) let them be
        # read back from its file
        self._dtypes: dict[str, np.dtype] = {}
        self._tables: dict[str, list[np.ndarray | None]] = {}
        self._read_back: tuple[StreamedSteps, float] | None = None
        self._spilled = False  # a streamed run past _KEEP_STEPS steps: no StepColumns kept
        self._step_columns: StepColumns | None = None
        self._full: list[dict[str, np.ndarray]] | None = [] if keep_iterations else None
        self._writer = IterationsWriter(iterations_path) if iterations_path is not None else None
        self._gap_values: list[np.ndarray] = []
        self._gap_counts: list[np.ndarray] = []
        self._gap_buffer: list[np.ndarray] = []
        self._gap_buffered = 0
        self._ended: list[Request] = []  # ended requests not yet columns
        self._req_chunks: list[dict[str, np.ndarray | list]] = []
        self.num_ended = 0  # requests finished or rejected so far
        self._done = False
        self._requests: Table | None = None
        self._frame: pd.DataFrame | None = None

    # --- appending ------------------------------------------------------------------------
    def record(self, step: StepRecord) -> None:
        """One engine step (StepRecord's fields; its token gaps join the gap counts)."""
        self.record_row(_ROW(step), step.token_gaps)

    def record_row(self, row: tuple, gaps: np.ndarray | None) -> None:
        """`record` of a step given as its row: StepRecord's fields in order, less token_gaps
        (`gaps`): what the replica's loop hands over, with no StepRecord made (every step)."""
        n = self._n
        self._rows.append(row)
        self._row_at.append(n)
        self._n = n + 1
        self.num_steps += 1
        if n + 1 >= _CHUNK_ROWS:
            self._seal()
        if gaps is not None:  # add_token_gaps, inlined (every step)
            self._gap_buffer.append(gaps)
            self._gap_buffered += len(gaps)
            if self._gap_buffered >= _GAP_BATCH:
                self._compress_gaps()

    def record_many(self, columns: dict[str, np.ndarray | np.generic | None], gaps: np.ndarray,
                    gaps_per_step: np.ndarray | int) -> None:
        """k engine steps at once: `columns` maps every ITER_COLUMNS name and every optional
        record field (StepRecord's names: prefix_queries_total, ...) to k values, a numpy
        scalar (the same value on all k steps, its dtype the column's) or None (not kept);
        start_s is always k values. `gaps` are the steps' token gaps in step order,
        `gaps_per_step` how many each step has (an int: the same on every step). Same tables
        and gap counts as k `record` calls."""
        block = _BLOCK(columns)
        k = len(block[0])
        self._blocks.append((self._n, k, block))
        self._n += k
        self.num_steps += k
        if self._n >= _CHUNK_ROWS:
            self._seal()
        limit = _GAP_BATCH
        if len(gaps) < limit - self._gap_buffered:  # no step takes the buffer to the limit
            if len(gaps):
                self._gap_buffer.append(gaps)
                self._gap_buffered += len(gaps)
            return
        if isinstance(gaps_per_step, int):
            gaps_per_step = np.full(k, gaps_per_step, np.int64)
        # NOTE: the gap buffer is compressed at the same step boundaries as step by step
        # (the compressed chunks feed float sums, so their boundaries are part of the result)
        pos = 0
        ends = np.cumsum(gaps_per_step)
        step = 0
        while step < k:
            room = limit - self._gap_buffered
            # first step whose end takes the buffer to >= limit
            cross = int(np.searchsorted(ends, pos + room, side="left"))
            if cross >= k:
                if len(gaps) > pos:
                    self._gap_buffer.append(gaps[pos:])
                    self._gap_buffered += len(gaps) - pos
                break
            end = int(ends[cross])
            if end > pos:
                self._gap_buffer.append(gaps[pos:end])
                self._gap_buffered += end - pos
            if self._gap_buffered >= limit:
                self._compress_gaps()
            pos, step = end, cross + 1

    def _seal(self) -> None:
        """The open chunk as one typed array per column (steps in order): the rows' values by
        fancy index at their positions, the blocks' values (arrays concatenated, numpy scalars
        repeated k times) by fancy index at theirs: a few numpy calls per column, whatever the
        number of blocks; then the StepColumns parts and the full row (file or memory)."""
        n = self._n
        if not n:
            return
        rows, at, blocks = self._rows, self._row_at, self._blocks
        by_col = list(zip(*rows)) if rows else None
        row_pos = np.asarray(at, np.intp) if rows else None
        if blocks:
            ks = np.fromiter((k for _, k, _ in blocks), np.intp, len(blocks))
            firsts = np.fromiter((p for p, _, _ in blocks), np.intp, len(blocks))
            run_ends = np.cumsum(ks)
            block_pos = np.arange(int(run_ends[-1])) + np.repeat(firsts - (run_ends - ks), ks)
            by_block = list(zip(*(blk for _, _, blk in blocks)))  # per column: each block's value
        if self._present is None:  # the first step decides which optional columns are kept
            first = rows[0] if rows and (not blocks or at[0] < blocks[0][0]) else None
            if first is not None:
                self._present = tuple(v is not None for v in first)
            else:
                self._present = tuple(v is not None for v in blocks[0][2])
        chunk: dict[str, np.ndarray] = {}
        made: list[tuple[tuple, np.ndarray]] = []  # (a column's block values, them in block order)
        total_steps = self.num_steps  # a chunk is sealed as soon as it is full, or at the end
        for idx, (field, name) in enumerate(zip(_NAMES, _TABLE)):
            kept = self._present[idx]
            seen = 0
            row_vals = None
            if by_col is not None:
                values = by_col[idx]
                if kept:
                    # NOTE: a None makes the array object-typed; only then are the Nones
                    # counted (count(None) compares every number with None: ~1 ms a column)
                    row_vals = np.asarray(values)
                    seen += len(values) - (values.count(None) if row_vals.dtype.kind == "O" else 0)
                else:  # (all None as expected: count(None) matches each by identity)
                    seen += len(values) - values.count(None)
            vals = by_block[idx] if blocks else ()
            types = set(map(type, vals))
            if blocks:
                if type(None) in types:
                    seen += sum(k for v, k in zip(vals, ks.tolist()) if v is not None)
                else:
                    seen += int(run_ends[-1])
            self._seen[idx] += seen
            if seen != (n if kept else 0):
                raise _missing_error(name, total_steps - self._seen[idx], total_steps)
            if not kept:
                continue
            kind = "f" if field in _FLOATS else "i"
            col = np.empty(n, np.float64 if kind == "f" else np.int64)
            if row_vals is not None:
                if row_vals.dtype.kind != kind and not (kind == "f" and row_vals.dtype.kind in "iub"):
                    raise ValueError(f"iteration column {name} got {row_vals.dtype} values, "
                                     f"expected {'floats' if kind == 'f' else 'integers'}")
                col[row_pos] = row_vals
            if blocks:
                # the blocks' values in block order; a column whose blocks hold the very same
                # objects as an earlier one's (a run's num_seqs, num_tokens, decode_tokens and
                # num_sampled are one array) takes its values from it
                flat = next((f for v, f in made if f.dtype.kind == kind and all(map(operator.is_, v, vals))),
                            None)
                if flat is None:
                    if np.ndarray not in types:
                        flat = np.repeat(np.asarray(vals), ks)
                    elif len(types) == 1:
                        flat = np.concatenate(vals)
                    else:  # scalar blocks repeated, then the array blocks laid over their steps
                        is_arr = [type(v) is np.ndarray for v in vals]
                        scalars = [0 if a else v for v, a in zip(vals, is_arr)]
                        flat = np.repeat(np.asarray(scalars, col.dtype), ks)
                        flat[np.repeat(np.asarray(is_arr), ks)] = np.concatenate(
                            [v for v, a in zip(vals, is_arr) if a])
                    made.append((vals, flat))
                col[block_pos] = flat
            if _IS_TOTAL[idx]:  # running totals -> per-step increments
                last = col[-1]
                col = np.diff(col, prepend=self._totals[idx])
                self._totals[idx] = last
            chunk[name] = col
        self._rows, self._row_at, self._blocks, self._n = [], [], [], 0
        streamed = self._writer is not None
        # (one compact array per column, shared by the StepColumns and the full row)
        full = streamed or self._full is not None
        compact = {c: _narrow(v) for c, v in chunk.items()} if full else None
        keep = not self._spilled
        if keep:
            self._ends.append(chunk["start_s"] + chunk["duration_s"])
        for name in DERIVED_COLUMNS:
            if name not in chunk or (name == "decode_tokens" and "num_sampled" in chunk):
                continue
            if name in _CODED:
                coded = _encode(chunk[name])
                if keep:
                    self._coded.setdefault(name, []).append(coded)
                if streamed:
                    self._tables.setdefault(name, []).append(coded[0])
            else:
                if keep:
                    self._steps.setdefault(name, []).append(compact[name] if full else _narrow(chunk[name]))
                if streamed and name != "duration_s":  # read back, busy_s sums it from the file
                    dt = compact[name].dtype
                    self._dtypes[name] = np.result_type(self._dtypes.get(name, dt), dt)
        if streamed:
            self._writer.write(compact)
            if keep and self.num_steps > _KEEP_STEPS:  # from now on read back from the file
                self._spilled = True
                self._steps, self._coded, self._ends = {}, {}, []
                release_memory(self.num_steps)
        elif self._full is not None:
            self._full.append(compact)

    def add_token_gaps(self, gaps: np.ndarray) -> None:
        # Most gaps in a step are equal (one step duration): they are kept as (value, count),
        # compressed in batches because np.unique per step costs more than the step's own numpy.
        self._gap_buffer.append(gaps)
        self._gap_buffered += len(gaps)
        if self._gap_buffered >= _GAP_BATCH:
            self._compress_gaps()

    def _compress_gaps(self) -> None:
        if self._gap_buffer:
            values, counts = unique_counts(np.concatenate(self._gap_buffer))
            self._gap_values.append(values)
            self._gap_counts.append(counts.astype(np.int32))  # <= 2^16 + a step's gaps
            self._gap_buffer, self._gap_buffered = [], 0

    def request_ended(self, req: Request) -> None:
        self._ended.append(req)
        self.num_ended += 1
        if len(self._ended) >= _REQUEST_CHUNK:
            self._seal_requests()

    def _seal_requests(self) -> None:
        reqs = self._ended
        if not reqs:
            return
        f = lambda attr, dt: np.fromiter(map(operator.attrgetter(attr), reqs), dtype=dt, count=len(reqs))  # noqa: E731
        chunk: dict[str, np.ndarray | list] = {
            "req_id": f("req_id", np.int64),
            "arrival_s": f("arrival_s", np.float64),
            "prompt_tokens": f("prompt_tokens", np.int64),
            "output_tokens": f("output_tokens", np.int64),
            "priority": f("priority", np.int64),
            "first_scheduled_s": f("first_scheduled_s", np.float64),
            "first_token_s": f("first_token_s", np.float64),
            "finish_s": f("finish_s", np.float64),
            "num_preemptions": f("num_preemptions", np.int64),
            "num_cached_tokens": f("num_cached_tokens", np.int64),
            "status": [r.status.value for r in reqs],
            "reject_reason": [r.reject_reason for r in reqs],
            "tenant": [str(v or "") for v in map(operator.attrgetter("tenant"), reqs)],
            "tier": [str(v or "") for v in map(operator.attrgetter("tier"), reqs)],
        }
        for name in ("prompt_tokens", "output_tokens", "priority", "num_preemptions", "num_cached_tokens"):
            chunk[name] = _narrow(chunk[name])
        self._req_chunks.append(chunk)
        self._ended = []

    def finish(self) -> None:
        """End of the run: the open chunks sealed, iterations.parquet completed."""
        if self._done:
            return
        self._seal()
        self._seal_requests()
        self._compress_gaps()
        if self._writer is not None:
            # NOTE: a run of one row group (nothing is read back from the file) writes it in
            # the background; a longer one first, so that the summary starts with it freed
            self._writer.close(background=self.num_steps <= ROW_GROUP_ROWS)
        release_memory(self.num_steps)  # the last chunks and row group, freed
        self._done = True

    def abort(self) -> None:
        """The run failed: a streamed iterations file is abandoned (IterationsWriter.abort)."""
        if self._writer is not None:
            self._writer.abort()

    def iterations_file(self) -> Path | None:
        """The parquet file the iterations table was streamed to, complete (None: not
        streamed)."""
        if self._writer is None:
            return None
        self._writer.wait()
        return self._writer.path

    def iterations_moved(self, path: str | Path) -> None:
        """The streamed file now lives at `path` (Result.write moved it)."""
        if self._writer is not None:
            self._writer.wait()
            self._writer.path = Path(path)

    def busy_s(self) -> float:
        """Sum of the step durations (numpy's pairwise sum over the whole column, as the
        summary has always taken it); a streamed run reads the column back from its file."""
        self.finish()
        if not self.num_steps:
            return 0.0
        if self._spilled:
            return self._streamed_steps()[1]
        return float(self.step_columns()["duration_s"].sum())

    def _streamed_steps(self) -> tuple[StreamedSteps, float]:
        """A streamed run's StepColumns (read back from its file) and busy_s: the durations
        are read once, summed whole (the pairwise sum over the column) and added to the
        starts for the step ends; the coded columns' tables merged as _merge_codes merges
        the chunks' (a column that cannot be coded is read as its floats)."""
        if self._read_back is None:
            ends, durations = read_ends_and_durations(self.iterations_file())
            busy = float(durations.sum())
            del durations
            tables = {}
            dtypes = dict(self._dtypes)
            for name, parts in self._tables.items():
                table = None
                if all(t is not None for t in parts):
                    table = parts[0] if len(parts) == 1 else distinct(np.concatenate(parts))
                    if len(table) > _MAX_CODES or not all(
                            _same_bits(table[np.searchsorted(table, t)], t) for t in parts):
                        table = None
                if table is not None:
                    tables[name] = table
                dtypes[name] = np.dtype(np.float64)
            writer = self._writer
            self._read_back = (StreamedSteps(ends, lambda: writer.path, dtypes, tables), busy)
        return self._read_back

    # --- tables ---------------------------------------------------------------------------
    def step_columns(self) -> StepColumns:
        """What the summary, time series and alerts read (steps.py), compact."""
        self.finish()
        if self._spilled:
            return self._streamed_steps()[0]
        if self._step_columns is not None:
            return self._step_columns
        if not self._ends:
            return empty_steps()
        cols = {}
        for name, parts in self._steps.items():
            cols[name] = np.concatenate(parts) if len(parts) > 1 else parts[0]
            self._steps[name] = [cols[name]]
        coded = {}
        for name, parts in self._coded.items():
            merged = _merge_codes(parts)
            if merged[0] is None:
                cols[name] = merged[1]
            else:
                coded[name] = (merged[1], merged[0])
            self._coded[name] = [merged]
        ends = np.concatenate(self._ends) if len(self._ends) > 1 else self._ends[0]
        self._ends = [ends]
        self._step_columns = StepColumns(ends, cols, coded)  # one object: its memo is shared
        return self._step_columns

    def iterations_frame(self) -> pd.DataFrame:
        """The iterations table (int64 / float64 columns): read back from the streamed file,
        or built from the compact chunks kept in memory."""
        import pandas as pd

        self.finish()
        if self._writer is not None:
            return pd.read_parquet(self.iterations_file())
        if self._full is None:
            raise ValueError("this recorder keeps no iterations table (keep_iterations=False)")
        if not self._full:
            return pd.DataFrame({c: np.asarray(()) for c in ITER_COLUMNS})
        return pd.DataFrame({c: _widen([ch[c] for ch in self._full],
                                       np.float64 if c in _FLOATS else np.int64)
                             for c in self._full[0]})

    def requests_frame(self) -> pd.DataFrame:
        """One row per ended request, in req_id order, as a DataFrame (requests_table's)."""
        if self._frame is None:
            self._frame = self.requests_table().to_pandas()
        return self._frame

    def requests_table(self) -> Table:
        """One row per ended request, in req_id order (built once, at the end of the run)."""
        self.finish()
        if self._requests is None:
            self._requests = self._requests_table()
            self._req_chunks = []  # the table holds them now (a million requests: ~0.1 GB)
        return self._requests

    def _requests_table(self) -> Table:
        chunks = self._req_chunks
        names = ("req_id", "arrival_s", "prompt_tokens", "output_tokens", "priority",
                 "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
                 "num_cached_tokens")
        if chunks:
            order = np.argsort(np.concatenate([c["req_id"] for c in chunks]), kind="stable")
        else:
            order = np.zeros(0, np.intp)
        cols: dict[str, np.ndarray] = {}
        for name in names:
            dt = np.float64 if name.endswith("_s") else np.int64
            cols[name] = (_widen([c[name] for c in chunks], dt) if chunks else np.zeros(0, dt))[order]
        for col in ("first_scheduled_s", "first_token_s", "finish_s"):
            cols[col][cols[col] < 0] = np.nan
        for attr in ("status", "reject_reason", "tenant", "tier"):  # str columns, as object arrays
            col = np.empty(len(order), object)
            pos = 0
            for c in chunks:
                col[pos:pos + len(c[attr])] = c[attr]
                pos += len(c[attr])
            col = col[order]
            if attr in ("status", "reject_reason") or any(col.tolist()):  # tenant, tier: when set
                cols[attr] = col
        return Table(cols)

    def token_gaps(self, *, release: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(sorted gap values, how many gaps had each value); `release` drops the recorder's
        own copy (the summary's last use, so that its memory is free for what follows). The
        run is finished first: its last row group is written and freed before the sort.
        NOTE: with `release`, each part is dropped as soon as it is copied (never two copies)."""
        self.finish()
        self._compress_gaps()
        if not self._gap_values:
            return np.zeros(0), np.zeros(0, np.int64)
        values, counts = self._gap_values, self._gap_counts
        if release:
            self._gap_values, self._gap_counts = [], []
        else:
            values, counts = list(values), list(counts)
        n = sum(map(len, values))
        v, c = np.empty(n), np.empty(n, counts[0].dtype)
        pos = 0
        values.reverse()
        counts.reverse()
        while values:
            part, part_counts = values.pop(), counts.pop()
            v[pos:pos + len(part)] = part
            c[pos:pos + len(part)] = part_counts
            pos += len(part)
        del part, part_counts
        # NOTE: gaps are >= +0.0 and not NaN: their bits as uint64 order as the floats do, and
        # equal bits are equal floats (the same stable order, ~25 % faster to sort); else floats
        bits = not (np.signbit(v).any() or np.isnan(v).any())
        key = v.view(np.uint64) if bits else v
        order = np.argsort(key, kind="stable")
        c = c[order]
        # (a gather, not a second sort of the keys: W1's 648,000 values 34 -> 23 ms, 5.4 M
        # values 275 -> 236 ms; one more array of the values until `order` goes)
        v = v[order]
        del order
        return v, c
