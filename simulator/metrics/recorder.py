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


class MetricsRecorder:
    def __init__(self, total_slots: int) -> None:
        self.total_slots = total_slots
        self._rows: list[tuple] = []
        self._gap_values: list[np.ndarray] = []
        self._gap_counts: list[np.ndarray] = []
        self._gap_buffer: list[np.ndarray] = []
        self._gap_buffered = 0
        self.requests: list[Request] = []  # finished and rejected, in the order they ended

    def record(self, step: StepRecord) -> None:
        """One engine step (StepRecord's fields; its token gaps join the gap counts)."""
        self._rows.append(_ROW(step))
        if step.token_gaps is not None:
            self.add_token_gaps(step.token_gaps)

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
        rows = self._rows
        columns = list(zip(*rows)) if rows else [()] * (len(ITER_COLUMNS) + len(_OPTIONAL))
        cols = {c: np.asarray(columns[k]) for k, c in enumerate(ITER_COLUMNS)}
        for k, (name, _, is_total) in enumerate(_OPTIONAL, start=len(ITER_COLUMNS)):
            values = columns[k]
            missing = values.count(None)
            if missing == len(values):  # not kept by this engine (or no steps at all)
                continue
            if missing:
                raise ValueError(f"iteration column {name} is missing on {missing} of "
                                 f"{len(values)} steps; record it on every step or never")
            values = np.asarray(values)
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
