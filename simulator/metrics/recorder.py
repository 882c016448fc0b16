"""MetricsRecorder: what a run leaves behind, appended step by step.

The engine hands over one StepRecord per engine step (the replica fills it from the step's
Batch and the scheduler's stats after commit) and every request that ends (finished or
rejected). The recorder only appends; the tables are built when asked for:
- iterations: one row per step, ITER_COLUMNS always, then OPTIONAL_ITER_COLUMNS present when
  the engine keeps them (a record field is None on every step, or on none);
- requests: one row per request, in req_id order;
- token gaps: every inter-token gap, kept as (value, count).
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


_FLUSH_ROWS = 4096  # rows buffered as tuples before they become typed column arrays


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
        block.append(np.asarray(values))
    return block


class MetricsRecorder:
    """Per-step rows live as typed numpy column blocks (a short tuple buffer in front), so the
    memory per step is ~8 bytes a column, not Python objects; `record_many` appends a block of
    steps at once (the event-level advance)."""

    def __init__(self, total_slots: int) -> None:
        self.total_slots = total_slots
        self._rows: list[tuple] = []
        self._blocks: list[list[np.ndarray | None]] = []
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
            self._blocks.append(_as_block(list(zip(*self._rows))))
            self._rows = []

    def record_many(self, columns: dict[str, np.ndarray | None], gaps: np.ndarray,
                    gaps_per_step: np.ndarray) -> None:
        """k engine steps at once: `columns` maps every ITER_COLUMNS name and every optional
        record field (StepRecord's names: prefix_queries_total, ...) to k values (None: not
        kept); `gaps` are the steps' token gaps in step order, `gaps_per_step` how many each
        step has. Same tables and gap counts as k `record` calls."""
        self._flush()
        names = (*ITER_COLUMNS, *(f for _, f, _ in _OPTIONAL))
        block = [columns[name] for name in names]
        k = len(block[0])
        self._blocks.append(block)
        self.num_steps += k
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
        blocks = self._blocks
        if not blocks:
            return pd.DataFrame({c: np.asarray(()) for c in ITER_COLUMNS})
        cols = {c: np.concatenate([blk[k] for blk in blocks]) for k, c in enumerate(ITER_COLUMNS)}
        for k, (name, _, is_total) in enumerate(_OPTIONAL, start=len(ITER_COLUMNS)):
            parts = [blk[k] for blk in blocks]
            missing = sum(len(blk[0]) for blk, p in zip(blocks, parts) if p is None)
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
