"""MetricsRecorder: what a run leaves behind, appended step by step.

The engine hands over one StepRecord per engine step (the replica fills it from the step's
Batch and the scheduler's stats after commit) and every request that ends (finished or
rejected). The recorder only appends; the tables are built when asked for:
- iterations: one row per step, ITER_COLUMNS always, then OPTIONAL_ITER_COLUMNS present when
  the engine keeps them (a record field is None on every step, or on none);
- requests: one row per request, in req_id order;
- token gaps: every inter-token gap, kept as (value, count).
Memory per step does not hold Python objects: rows are flushed every 4096 steps into typed
column blocks (counts as int32 when they fit, running totals and times as 64-bit), and a
column that is constant over a block of steps (a decode run's batch size, zeros) is kept as
one numpy scalar; the tables restore the int64 / float64 columns as written before.
KV counters arrive as the manager's running totals (StepRecord.*_total) and are stored as
per-step increments, as vLLM's counters are reported.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.workload.request import Request

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


_NAMES = (*ITER_COLUMNS, *(f for _, f, _ in _OPTIONAL))
_COLUMN_OF = {f: c for c, f, _ in _OPTIONAL}  # record field -> iteration column
_FLUSH_ROWS = 4096  # rows buffered as tuples before they become typed column arrays


_I32 = np.iinfo(np.int32)


def _compact(values: np.ndarray) -> np.ndarray:
    """int64 counts as int32 when every value fits (iterations_frame widens them back)."""
    if values.dtype == np.int64 and len(values) and _I32.min <= values.min() and values.max() <= _I32.max:
        return values.astype(np.int32)
    return values


def _as_block(columns: list) -> list[np.ndarray | None]:
    """Per-step values of each column as one typed array (None: not kept in these steps)."""
    block: list[np.ndarray | None] = []
    for name, values in zip((*ITER_COLUMNS, *(c for c, _, _ in _OPTIONAL)), columns):
        missing = values.count(None) if isinstance(values, tuple) else 0
        if missing == len(values) and isinstance(values, tuple):
            block.append(None)
            continue
        if missing:
            raise ValueError(f"iteration column {name} is missing on {missing} of "
                             f"{len(values)} steps; record it on every step or never")
        block.append(_compact(np.asarray(values)))
    return block


def _expand(value: np.ndarray | np.generic, k: int) -> np.ndarray:
    """A block's column as k values: a numpy scalar stands for k equal values (same dtype);
    int32 blocks widen back to int64 (the dtype the tables have always had)."""
    if isinstance(value, np.generic):
        return np.full(k, value)
    return value.astype(np.int64) if value.dtype == np.int32 else value


def _merge(blocks: list[list], sizes: list[int]) -> list[np.ndarray | None]:
    """Several column blocks as one compact block (scalars expanded, counts as int32)."""
    merged: list[np.ndarray | None] = []
    for k, name in enumerate(_NAMES):
        parts = [blk[k] for blk in blocks]
        missing = sum(n for n, p in zip(sizes, parts) if p is None)
        if missing == sum(sizes):
            merged.append(None)
            continue
        if missing:
            raise ValueError(f"iteration column {_COLUMN_OF.get(name, name)} is missing on {missing} "
                             f"of {sum(sizes)} steps; record it on every step or never")
        merged.append(_compact(np.concatenate([_expand(p, n) for p, n in zip(parts, sizes)])))
    return merged


_MERGE_ROWS = 1 << 16  # recent blocks are merged into one compact block every ~65k steps


class MetricsRecorder:
    """Per-step rows live as typed numpy column blocks (a short tuple buffer in front), so the
    memory per step is ~4-8 bytes a column, not Python objects; `record_many` appends a block
    of steps at once (the event-level advance); recent blocks (one per decode run) are merged
    every ~65k steps, so a run's block costs no Python objects for long either."""

    def __init__(self, total_slots: int) -> None:
        self.total_slots = total_slots
        self._rows: list[tuple] = []
        self._blocks: list[list[np.ndarray | None]] = []  # merged
        self._recent: list[list] = []  # blocks since the last merge (arrays or numpy scalars)
        self._recent_rows = 0
        self.num_steps = 0
        self._gap_values: list[np.ndarray] = []
        self._gap_counts: list[np.ndarray] = []
        self._gap_buffer: list[np.ndarray] = []
        self._gap_buffered = 0
        self.requests: list[Request] = []  # finished and rejected, in the order they ended

    def record(self, step: StepRecord) -> None:
        """One engine step (StepRecord's fields; its token gaps join the gap counts)."""
        rows = self._rows
        rows.append(_ROW(step))
        self.num_steps += 1
        if len(rows) >= _FLUSH_ROWS:
            self._flush()
        if step.token_gaps is not None:
            self.add_token_gaps(step.token_gaps)

    def _flush(self) -> None:
        if self._rows:
            self._add_block(_as_block(list(zip(*self._rows))), len(self._rows))
            self._rows = []

    def _add_block(self, block: list, k: int) -> None:
        self._recent.append(block)
        self._recent_rows += k
        if self._recent_rows >= _MERGE_ROWS:
            self._merge_recent()

    def _merge_recent(self) -> None:
        if self._recent:
            recent = self._recent
            self._blocks.append(recent[0] if len(recent) == 1 and not any(
                isinstance(v, np.generic) for v in recent[0]) else
                _merge(recent, [len(blk[0]) for blk in recent]))
            self._recent, self._recent_rows = [], 0

    def record_many(self, columns: dict[str, np.ndarray | np.generic | None], gaps: np.ndarray,
                    gaps_per_step: np.ndarray | int) -> None:
        """k engine steps at once: `columns` maps every ITER_COLUMNS name and every optional
        record field (StepRecord's names: prefix_queries_total, ...) to k values, a numpy
        scalar (the same value on all k steps, its dtype the column's) or None (not kept);
        start_s is always k values. `gaps` are the steps' token gaps in step order,
        `gaps_per_step` how many each step has (an int: the same on every step). Same tables
        and gap counts as k `record` calls."""
        self._flush()
        block = [columns[name] for name in _NAMES]
        k = len(block[0])
        self._add_block(block, k)
        self.num_steps += k
        if isinstance(gaps_per_step, int):
            gaps_per_step = np.full(k, gaps_per_step, np.int64)
        # NOTE: the gap buffer is compressed at the same step boundaries as step by step
        # (the compressed chunks feed float sums, so their boundaries are part of the result)
        limit = 1 << 16
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

    def add_token_gaps(self, gaps: np.ndarray) -> None:
        # Most gaps in a step are equal (one step duration): they are kept as (value, count),
        # compressed in batches because np.unique per step costs more than the step's own numpy.
        self._gap_buffer.append(gaps)
        self._gap_buffered += len(gaps)
        if self._gap_buffered >= 1 << 16:
            self._compress_gaps()

    def _compress_gaps(self) -> None:
        if self._gap_buffer:
            values, counts = np.unique(np.concatenate(self._gap_buffer), return_counts=True)
            self._gap_values.append(values)
            self._gap_counts.append(counts)
            self._gap_buffer, self._gap_buffered = [], 0

    def request_ended(self, req: Request) -> None:
        self.requests.append(req)

    # --- tables ---------------------------------------------------------------------------
    def iterations_frame(self) -> pd.DataFrame:
        self._flush()
        self._merge_recent()
        blocks = self._blocks
        if not blocks:
            return pd.DataFrame({c: np.asarray(()) for c in ITER_COLUMNS})
        sizes = [len(blk[0]) for blk in blocks]
        cols = {c: np.concatenate([_expand(blk[k], n) for blk, n in zip(blocks, sizes)])
                for k, c in enumerate(ITER_COLUMNS)}
        for k, (name, _, is_total) in enumerate(_OPTIONAL, start=len(ITER_COLUMNS)):
            parts = [None if blk[k] is None else _expand(blk[k], n) for blk, n in zip(blocks, sizes)]
            missing = sum(n for n, p in zip(sizes, parts) if p is None)
            if missing == self.num_steps:  # not kept by this engine
                continue
            if missing:
                raise ValueError(f"iteration column {name} is missing on {missing} of "
                                 f"{self.num_steps} steps; record it on every step or never")
            values = np.concatenate(parts)
            cols[name] = np.diff(values, prepend=0) if is_total else values
        return pd.DataFrame(cols)

    def requests_frame(self) -> pd.DataFrame:
        reqs = sorted(self.requests, key=lambda r: r.req_id)
        f = lambda attr, dt: np.fromiter(map(operator.attrgetter(attr), reqs), dtype=dt, count=len(reqs))  # noqa: E731
        df = pd.DataFrame({
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
        })
        for col in ("first_scheduled_s", "first_token_s", "finish_s"):
            df.loc[df[col] < 0, col] = np.nan
        for attr in ("tenant", "tier"):  # only when the workload sets them
            values = [str(v or "") for v in map(operator.attrgetter(attr), reqs)]
            if any(values):
                df[attr] = values
        return df

    def token_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """(sorted gap values, how many gaps had each value)."""
        self._compress_gaps()
        if not self._gap_values:
            return np.zeros(0), np.zeros(0, np.int64)
        v = np.concatenate(self._gap_values)
        c = np.concatenate(self._gap_counts)
        order = np.argsort(v, kind="stable")
        return v[order], c[order]
