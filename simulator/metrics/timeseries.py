"""Gauges and counters over simulated time, under vLLM's Prometheus names, and their
OpenMetrics text export.

Semantics (docs/metrics.md has the full definitions):
- A gauge is a right-continuous step function that changes only at the end of an engine step
  (vLLM records its scheduler stats after each step) and holds that value until the next step
  ends. It is 0 before the first step ends; idle gaps keep the last value.
- A counter counts events, each dated when it happens: per-step events (preemptions, tokens of
  a step) at the end of that step, per-request events at the request's own time
  (first token, finish), which is always a step end.
- A sample at time t reads the last update at or before t, as an instantaneous scrape would.
  The time series samples every series at t = 0, dt, 2 dt, ... up to the first grid point at or
  after the run's end, so the last sample holds every counter's final value.
Everything here is derived from iterations.parquet + requests.parquet alone, so that plots,
reports and exports can be rebuilt from a run directory.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.errors import ConfigError
from simulator.metrics.steps import StepColumns, as_steps
from simulator.metrics.table import column

if TYPE_CHECKING:
    import pandas as pd


# vLLM's histogram buckets (vllm/v1/metrics/loggers.py); kept verbatim so that dashboards built
# for vLLM (histogram_quantile over these buckets) read simulated runs the same way.
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                             50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True, slots=True)
class StepFunction:
    """value(t) = values[i] for times[i] <= t < times[i+1]; `initial` before times[0]."""

    times: np.ndarray  # non-decreasing
    values: np.ndarray
    initial: float = 0.0

    def at(self, t: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.times, t, side="right") - 1
        out = np.where(idx >= 0, self.values[np.maximum(idx, 0)] if len(self.values) else 0.0,
                       self.initial)
        return out.astype(np.float64)

    def segments(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, lengths, values) of the constant pieces over [t0, t1]; lengths may be 0."""
        edges = np.concatenate([[t0], np.clip(self.times, t0, t1), [t1]])
        values = np.concatenate([[self.initial], self.values]).astype(np.float64)
        return edges[:-1], np.diff(edges), values


Iterations = "pd.DataFrame | StepColumns"  # an iterations table, or its compact columns (steps.py)
Requests = "pd.DataFrame | Table"  # a requests table (metrics/table.py: a run's, without pandas)


def step_ends(iterations: Iterations) -> np.ndarray:
    """End time of every engine step: when its gauges update and its counters advance."""
    return as_steps(iterations).ends


def run_window(requests: Requests, iterations: Iterations) -> tuple[float, float]:
    """[first arrival, max(last step end, last arrival)]: the span every rate and time-weighted
    mean is taken over (the last step end is also the last finish)."""
    if not len(requests):
        ends = step_ends(iterations)
        return (0.0, float(ends[-1])) if len(ends) else (0.0, 0.0)
    arrival = column(requests, "arrival_s")
    t0 = float(arrival.min())
    t1 = float(arrival.max())
    ends = step_ends(iterations)
    if len(ends):
        t1 = max(t1, float(ends[-1]))
    return t0, t1


def gauge(iterations: Iterations, column: str) -> StepFunction:
    steps = as_steps(iterations)
    return StepFunction(steps.ends, steps.f64(column))


def _gauge_at(steps: StepColumns, column: str, t: np.ndarray) -> np.ndarray:
    """gauge(steps, column).at(t), the steps read at the times first: no float64 column of the
    steps' length (a coded column's codes looked up there, an integer one converted there)."""
    idx = np.searchsorted(steps.ends, t, side="right") - 1
    if not len(steps):
        return np.zeros(len(t))
    take = np.maximum(idx, 0)
    coded = steps.sort_key(column)
    if coded is not None:
        codes, table = coded
        picked = table[codes[take]]
    else:
        picked = steps[column][take]
    return np.where(idx >= 0, picked.astype(np.float64, copy=False), 0.0).astype(np.float64)


def time_weighted(fn: StepFunction, t0: float, t1: float) -> dict[str, float | None]:
    """Time-weighted mean and p95 over [t0, t1] (p95: the smallest value the gauge is at or
    below for >= 95 % of the time), and the largest value ever recorded (max)."""
    w = segment_lengths(fn.times, t0, t1)
    return weighted_stats(with_initial(fn.values, fn.initial), w, float(w.sum()))


def segment_lengths(times: np.ndarray, t0: float, t1: float) -> np.ndarray:
    """StepFunction.segments' lengths (one array, no temporaries of the same size)."""
    edges = np.empty(len(times) + 2)
    edges[0], edges[-1] = t0, t1
    np.clip(times, t0, t1, out=edges[1:-1])
    return np.diff(edges)


def with_initial(values: np.ndarray, initial: float = 0.0) -> np.ndarray:
    """[initial, *values] as float64 (StepFunction.segments' values), one allocation."""
    v = np.empty(len(values) + 1)
    v[0] = initial
    v[1:] = values
    return v


_ORDER_CHUNK = 1 << 20
# pieces above which a code key is visited by ranges (no whole-array order: memory); below, one
# radix-sorted order is faster (W1's 517,000 steps: 24 -> 12 ms a p95)
_RANGES_ABOVE = 1 << 22


def weighted_stats(v: np.ndarray, w: np.ndarray, total: float,
                   key: np.ndarray | None = None) -> dict[str, float | None]:
    """time_weighted over the pieces (values v, lengths w, total = float(w.sum())). The p95 is
    the value where the weights, cumulated in the stable order of v, reach 95 %: the cumulative
    sum runs chunk by chunk (each continuing the last exactly, as one np.cumsum would), and
    `key`, when given, is an integer array ordered as v (equal keys: equal values), whose p95
    is found from each key's total (_p95_by_key_totals), else by a radix sort for small ranges
    (codes of a long run by ranges, _p95_by_code_ranges)."""
    top = float(v.max())
    if total <= 0:
        return {"mean": None, "p95": None, "max": top}
    target = 0.95 * total
    pos = None
    if key is not None and len(key) and key.dtype.kind in "iu" and np.can_cast(key.dtype, np.intp) \
            and 0 <= int(key.min()) and (top_key := int(key.max())) < 1 << 16:
        pos = _p95_by_key_totals(w, key, target, top_key + 1)
        if pos is None and len(key) > _RANGES_ABOVE:
            pos = _p95_by_code_ranges(w, key, target)
    if pos is None:
        order = stable_order(v if key is None else key)
        carry = np.zeros(1)
        for lo in range(0, len(v), _ORDER_CHUNK):
            cum = np.cumsum(np.concatenate([carry, w[order[lo:lo + _ORDER_CHUNK]]]))[1:]
            if cum[-1] >= target:
                pos = int(order[lo + int(np.searchsorted(cum, target, side="left"))])
                break
            carry[0] = cum[-1]
        if pos is None:  # never reached (rounding): the last piece in the order
            pos = int(order[-1])
        del order
    return {"mean": dot(v, w) / total, "p95": float(v[pos]), "max": top}


def _p95_by_key_totals(w: np.ndarray, key: np.ndarray, target: float, size: int) -> int | None:
    """A piece of the key where w, cumulated in the stable order of `key` (0 .. size - 1),
    first reaches target, found from each key's total weight (bincount, a block at a time):
    every piece of a key has the same value, so any of its pieces gives the p95. None when a
    weight is negative or NaN, or the key totals' cumulative sum lies within `slack` of target
    at a key boundary (the caller then cumulates the pieces in order).
    NOTE: both sums add the same n non-negative terms (one in the stable order, one by key
    totals), each within (n + size) 2^-53 of the exact sum (floating-point summation in any
    order): the key where this one passes target + slack, with the key before it under target
    - slack, is the key where the ordered cumulative sum first reaches target."""
    n = len(key)
    if not float(w.min()) >= 0.0:
        return None
    sums = np.zeros(size)
    for lo in range(0, n, _ORDER_CHUNK):
        sums += np.bincount(key[lo:lo + _ORDER_CHUNK], w[lo:lo + _ORDER_CHUNK], minlength=size)
    cum = np.cumsum(sums)
    slack = 4.0 * (n + size) * 2.0 ** -53 * float(cum[-1])
    if not math.isfinite(slack):
        return None
    k = int(np.searchsorted(cum, target + slack, side="left"))
    if k >= size or (k and not cum[k - 1] < target - slack):
        return None
    for lo in range(0, n, _ORDER_CHUNK):
        hit = np.flatnonzero(key[lo:lo + _ORDER_CHUNK] == k)
        if len(hit):
            return lo + int(hit[0])
    return None  # (not reached: key k has weight, so it has pieces)


def _p95_by_code_ranges(w: np.ndarray, key: np.ndarray, target: float) -> int:
    """The piece where w, cumulated in the stable order of `key` (codes 0 .. 2^16 - 1), first
    reaches target, without a whole-array order: the codes are cut into ranges of at most
    ~1/8 of the pieces (a code above that is a range of its own), and each range's pieces are
    visited in the stable order (by code, then position), the cumulative sum continuing
    exactly from one range to the next. A range of one code is visited by blocks of positions."""
    n = len(key)
    counts = np.bincount(key)
    limit = max(n // 8, 1)
    ranges: list[tuple[int, int]] = []
    lo = 0
    acc = 0
    for code in np.flatnonzero(counts).tolist():
        c = int(counts[code])
        if acc and (acc + c > limit or c > limit):
            ranges.append((lo, code))
            lo, acc = code, 0
        acc += c
        if c > limit:
            ranges.append((lo, code + 1))
            lo, acc = code + 1, 0
    if acc:
        ranges.append((lo, len(counts)))
    carry = np.zeros(1)
    last = -1
    for a, b in ranges:
        if b - a == 1:  # one code: its pieces in position order, a block at a time
            for s in range(0, n, _ORDER_CHUNK):
                sel = np.flatnonzero(key[s:s + _ORDER_CHUNK] == a)
                if not len(sel):
                    continue
                cum = np.cumsum(np.concatenate([carry, w[s:s + _ORDER_CHUNK][sel]]))[1:]
                if cum[-1] >= target:
                    return s + int(sel[np.searchsorted(cum, target, side="left")])
                carry[0] = cum[-1]
                last = s + int(sel[-1])
            continue
        sel = np.flatnonzero((key >= a) & (key < b))
        sel = sel[np.argsort(key[sel], kind="stable")]
        cum = np.cumsum(np.concatenate([carry, w[sel]]))[1:]
        if cum[-1] >= target:
            return int(sel[np.searchsorted(cum, target, side="left")])
        carry[0] = cum[-1]
        last = int(sel[-1])
    return last


def stable_order(x: np.ndarray) -> np.ndarray:
    """np.argsort(x, kind="stable"); integer keys with a range under 2^16 as uint16 (a radix
    sort, the same order)."""
    if x.dtype.kind in "iu" and len(x):
        lo, hi = int(x.min()), int(x.max())
        if hi - lo < 1 << 16:
            return np.argsort((x - lo).astype(np.uint16), kind="stable")
    return np.argsort(x, kind="stable")


_DOT_CHUNK = 1 << 16  # elements multiplied (into one buffer) and summed at a time by dot


def dot(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a * b) of two 1-D arrays of one length, the same on every machine: numpy's pairwise
    sum of the products (float64 for floats, exact for integers), a fixed chunk at a time, the
    chunks' sums added exactly (math.fsum; in order where one is not finite).
    NOTE: not `a @ b`: BLAS splits a dot product of > ~10,000 elements over its threads, so
    its last digits depend on the number of cores (OPENBLAS_NUM_THREADS 1 and 2 differed in ~6
    fields of a W1 summary.json)."""
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"dot: two 1-D arrays of one length, got shapes {a.shape} and {b.shape}")
    dtype = np.result_type(a, b)
    if dtype.kind == "f":
        dtype = np.dtype(np.float64)
    n = len(a)
    if n <= _DOT_CHUNK:
        return float(np.multiply(a, b, dtype=dtype).sum())
    buf = np.empty(_DOT_CHUNK, dtype)
    sums = []
    for lo in range(0, n, _DOT_CHUNK):
        hi = min(lo + _DOT_CHUNK, n)
        sums.append(float(np.multiply(a[lo:hi], b[lo:hi], out=buf[:hi - lo]).sum()))
    return math.fsum(sums) if all(map(math.isfinite, sums)) else float(np.sum(sums))


def integral(fn: StepFunction, t0: float, t1: float) -> float:
    return dot(with_initial(fn.values, fn.initial), segment_lengths(fn.times, t0, t1))


# --- counters ----------------------------------------------------------------------------------
_BLOCK = 1 << 20  # events summed (or compared) at a time by _counter and _is_sorted


def _is_sorted(times: np.ndarray) -> bool:
    """times[1:] >= times[:-1] everywhere, a block at a time (no temporary of the events' size)."""
    for lo in range(0, len(times) - 1, _BLOCK):
        hi = min(lo + _BLOCK, len(times) - 1)
        if not (times[lo + 1:hi + 1] >= times[lo:hi]).all():
            return False
    return True


def _counter(times: np.ndarray, increments: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """The running total of `increments` (any numeric or bool dtype: summed as float64 in time
    order, one after the other) at each grid time.
    NOTE: the running total (cum[i]: the first i increments) is made a block at a time, each
    block's cumulative sum starting from the last total (np.cumsum adds one after the other:
    the same floats as one np.cumsum over all of them), and only read where the grid needs it:
    no float64 array of the events' size (a long run's per-step counters: 8 bytes a step)."""
    if len(times) > 1 and not _is_sorted(times):  # step ends are sorted already
        order = np.argsort(times, kind="stable")
        times, increments = times[order], increments[order]
    pos = np.searchsorted(times, grid, side="right")  # cum[pos]: the total at each grid time
    if not _is_sorted(pos):  # a grid out of order (not sample's): the whole running total
        cum = np.zeros(len(increments) + 1)
        np.cumsum(increments, dtype=np.float64, out=cum[1:])
        return cum[pos]
    out = np.zeros(len(grid))  # cum[0] = 0.0
    n = len(increments)
    buf = np.empty(min(n, _BLOCK) + 1)
    buf[0] = 0.0
    first = int(np.searchsorted(pos, 0, side="right"))  # grid points before any event: 0.0
    for lo in range(0, n, _BLOCK):
        hi = min(lo + _BLOCK, n)
        part = buf[:hi - lo + 1]
        part[1:] = increments[lo:hi]
        np.cumsum(part, out=part)  # part[j] = cum[lo + j]
        last = int(np.searchsorted(pos, hi, side="right"))  # grid points reading cum[lo + 1 .. hi]
        out[first:last] = part[pos[first:last] - lo]
        first = last
        buf[0] = part[-1]  # cum[hi], the next block's start
    return out


def _count(times: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """_counter(times, ones, grid): a float running count of ones is the count itself."""
    if len(times) > 1 and not (times[1:] >= times[:-1]).all():
        times = np.sort(times, kind="stable")
    return np.searchsorted(times, grid, side="right").astype(np.float64)


_EVENT_BLOCK = 1 << 20  # events binned at a time by _bucket_counts


def _bucket_counts(times: np.ndarray, values: np.ndarray, bounds: tuple[float, ...],
                   grid: np.ndarray) -> list[np.ndarray]:
    """[_counter(times, values <= b, grid) for b in bounds] + [_count(times, grid)] in one
    pass over the events: each event's grid point and bucket binned, then cumulated over both
    (integer counts, exact as the float running counts of ones they equal); the events a
    block at a time."""
    if len(times) > 1 and not (times[1:] >= times[:-1]).all():
        order = np.argsort(times, kind="stable")
        times, values = times[order], values[order]
    pos = np.searchsorted(times, grid, side="right")  # events counted at each grid point
    edges = np.asarray(bounds, dtype=np.float64)
    width = len(edges) + 1  # bucket j <=> value <= bounds[j]; past the last (or NaN): +Inf
    hist = np.zeros((len(grid) + 1) * width, np.int64)
    ordered = _is_sorted(pos)  # (a grid in time order, as sample's)
    lut = None  # integer values: each value's bucket looked up (the searchsorted of them all)
    if values.dtype.kind in "iu" and len(values):
        vmin, vmax = int(values.min()), int(values.max())
        if vmax - vmin < _BLOCK:
            lut = np.searchsorted(edges, np.arange(vmin, vmax + 1), side="left")
    for lo in range(0, int(pos[-1]) if len(pos) else 0, _EVENT_BLOCK):
        hi = min(lo + _EVENT_BLOCK, int(pos[-1]))
        if ordered:  # first grid point counting event e: #{pos <= e}, counted up from lo
            a, b = (int(x) for x in np.searchsorted(pos, [lo, hi - 1], side="right"))
            first = np.cumsum(np.bincount(pos[a:b] - lo, minlength=hi - lo)) + a
        else:
            first = np.searchsorted(pos, np.arange(lo, hi), side="right")
        if lut is not None:
            bucket = lut[values[lo:hi].astype(np.int64) - vmin]
        else:
            bucket = np.searchsorted(edges, values[lo:hi], side="left")
        hist += np.bincount(first * width + bucket, minlength=len(hist))
    counts = np.cumsum(np.cumsum(hist.reshape(len(grid) + 1, width), axis=0), axis=1)[:-1]
    return [counts[:, j].astype(np.float64) for j in range(width)]


def generation_token_events(requests: Requests, iterations: Iterations) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """(times, counts) of sampled output tokens. Exact with a `num_sampled` iteration column;
    without it, decode tokens + first tokens per step, which misses the token a preempted
    request samples when its recompute finishes (docs/metrics.md)."""
    steps = as_steps(iterations)
    ends = steps.ends
    if "num_sampled" in steps:
        return ends, steps.f64("num_sampled")
    first = column(requests, "first_token_s").astype(np.float64, copy=False)
    first = first[np.isfinite(first)]
    return (np.concatenate([ends, first]),
            np.concatenate([steps.f64("decode_tokens"), np.ones(len(first))]))


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kind: str  # gauge | counter | histogram
    help: str
    unit: str = ""


GAUGES = {
    "vllm:num_requests_running": ("num_running", "Number of requests in model execution batches."),
    "vllm:num_requests_waiting": ("num_waiting", "Number of requests waiting to be processed."),
    "vllm:kv_cache_usage_perc": ("kv_usage", "KV-cache usage. 1 means 100 percent usage."),
}
COUNTERS = {
    "vllm:num_preemptions": "Cumulative number of preemptions from the engine.",
    "vllm:prompt_tokens": "Number of prefill tokens processed.",
    "vllm:generation_tokens": "Number of generation tokens processed.",
    "vllm:request_success": "Count of successfully processed requests.",
    "vllm:prefix_cache_queries": "Prefix cache queries, in terms of number of queried tokens.",
    "vllm:prefix_cache_hits": "Prefix cache hits, in terms of number of cached tokens.",
}
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.",
                                         TTFT_BUCKETS_S),
    "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.",
                                         REQUEST_LATENCY_BUCKETS_S),
    "vllm:request_queue_time_seconds": ("Histogram of time spent in WAITING phase for request.",
                                        REQUEST_LATENCY_BUCKETS_S),
    "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.",
                                    ITERATION_TOKEN_BUCKETS),
}


def grid(t1: float, interval_s: float) -> np.ndarray:
    """0, dt, 2 dt, ... up to the first point >= t1 (inclusive)."""
    check_interval(interval_s)
    n = int(math.ceil(t1 / interval_s - 1e-9)) if t1 > 0 else 0
    return np.arange(n + 1, dtype=np.float64) * interval_s


AUTO_MAX_SAMPLES = 20_000  # grid points of an automatic interval (5.5 h of a run at 1 s)
_NICE = (1, 2, 5)


def auto_interval(t1: float) -> float:
    """The sampling interval that suits a run ending at t1: 1 s when that gives at most
    AUTO_MAX_SAMPLES samples, else the smallest 1-2-5 multiple of 1 s that does (a 200-hour
    run samples every 50 s): the time series and the OpenMetrics text stay a few MB."""
    scale = 1
    while True:
        for nice in _NICE:
            dt = float(nice * scale)
            if t1 / dt <= AUTO_MAX_SAMPLES:
                return dt
        scale *= 10


def check_interval(interval_s: float) -> None:
    if (isinstance(interval_s, bool) or not isinstance(interval_s, (int, float))
            or not math.isfinite(interval_s) or interval_s < 0.001):
        raise ConfigError(f"time-series interval_s must be a number >= 0.001 (Prometheus stores "
                          f"milliseconds), got {interval_s!r}")


def _counter_events(requests: Requests, iterations: StepColumns):
    """(name, (times, increments)) per counter, one at a time (only one counter's columns are
    alive at once); per-step increments are the compact columns as they are (_counter sums
    them as float64)."""
    ends = iterations.ends
    yield "vllm:num_preemptions", (ends, iterations["num_preempted"])
    first = column(requests, "first_token_s").astype(np.float64, copy=False)
    started = np.isfinite(first)
    yield "vllm:prompt_tokens", (first[started],
                                 column(requests, "prompt_tokens")[started].astype(np.float64))
    del first, started
    yield "vllm:generation_tokens", ((ends, iterations["num_sampled"]) if "num_sampled" in iterations
                                     else generation_token_events(requests, iterations))
    done = column(requests, "status") == "finished"
    yield "vllm:request_success", (column(requests, "finish_s")[done].astype(np.float64),
                                   np.ones(int(done.sum())))
    del done
    for name, col in (("vllm:prefix_cache_queries", "prefix_cache_queries"),
                      ("vllm:prefix_cache_hits", "prefix_cache_hits")):
        if col in iterations:
            yield name, (ends, iterations[col])


def _histogram_observations(requests: Requests, iterations: StepColumns):
    """(name, (times, values)) observed per histogram, at the moment vLLM observes them: TTFT
    at the first token, E2E and queue time when the request finishes, tokens per step at its
    end."""
    def f64(name: str, rows: np.ndarray) -> np.ndarray:
        return column(requests, name)[rows].astype(np.float64, copy=False)
    done = column(requests, "status") == "finished"
    first = column(requests, "first_token_s")
    started = np.isfinite(first)
    first = f64("first_token_s", started)
    yield "vllm:time_to_first_token_seconds", (first, first - f64("arrival_s", started))
    finish, arrival = f64("finish_s", done), f64("arrival_s", done)
    yield "vllm:e2e_request_latency_seconds", (finish, finish - arrival)
    yield "vllm:request_queue_time_seconds", (finish, f64("first_scheduled_s", done) - arrival)
    yield "vllm:iteration_tokens_total", (iterations.ends, iterations["num_tokens"])


@dataclass(frozen=True, slots=True)
class Samples:
    """Every monitoring series at the grid times: what timeseries.parquet and the OpenMetrics
    text are both made from (sample: one pass over the steps for the two files)."""

    grid: np.ndarray
    gauges: dict[str, np.ndarray]  # family -> value at each grid time
    counters: dict[str, np.ndarray]  # family -> running total (counters with data only)
    # family -> (running count of observations <= each bucket bound, then of all: +Inf), sum
    histograms: dict[str, tuple[list[np.ndarray], np.ndarray]]


def sample(requests: Requests, iterations: Iterations, interval_s: float = 1.0) -> Samples:
    """1. The grid up to the run window's end; 2. each gauge read at it; 3. each counter's
    running total at it (then its events dropped); 4. each histogram's bucket counts, count
    and sum at it."""
    iterations = as_steps(iterations)
    _, t1 = run_window(requests, iterations)
    g = grid(t1, interval_s)
    gauges = {name: _gauge_at(iterations, col, g) for name, (col, _) in GAUGES.items()}
    counters = {name: _counter(times, inc, g)
                for name, (times, inc) in _counter_events(requests, iterations)}
    histograms = {}
    for name, (times, values) in _histogram_observations(requests, iterations):
        histograms[name] = (_bucket_counts(times, values, HISTOGRAMS[name][1], g),
                            _counter(times, values, g))
    return Samples(g, gauges, counters, histograms)


def build_timeseries(requests: Requests, iterations: Iterations | None = None,
                     interval_s: float = 1.0, *, samples: Samples | None = None) -> pd.DataFrame:
    """One row per sample time: `time_s`, each gauge and each counter (vLLM names; counters as
    their `_total` sample), histogram `_count`/`_sum`. Counters without data are left out.
    `samples`: sample(requests, iterations, interval_s) when made already."""
    import pandas as pd

    s = samples if samples is not None else sample(requests, iterations, interval_s)
    return pd.DataFrame(timeseries_columns(s))


def timeseries_columns(s: Samples) -> dict[str, np.ndarray]:
    """build_timeseries' columns, in its order (float64 arrays)."""
    cols: dict[str, np.ndarray] = {"time_s": s.grid, **s.gauges}
    cols.update({f"{name}_total": v for name, v in s.counters.items()})
    for name, (counts, sums) in s.histograms.items():
        cols[f"{name}_count"] = counts[-1]
        cols[f"{name}_sum"] = sums
    return cols


# --- OpenMetrics text --------------------------------------------------------------------------
def _num(v: float) -> str:
    """Shortest exact text for a sample value; integers without a decimal point."""
    f = float(v)
    if f == int(f) and abs(f) < 2**53:
        return str(int(f))
    return repr(f)


_INT_TEXTS_MAX = 1 << 16  # integers formatted once and looked up below this
_int_texts = np.array([b"%d" % i for i in range(1024)], dtype=object)  # grown on demand


def _num_texts(values: np.ndarray) -> list[bytes]:
    """_num of every value, as bytes: integers (most samples: counts) looked up in a table of
    their texts (small ones), else formatted once per distinct value; the others by repr."""
    global _int_texts
    vals = np.asarray(values, dtype=np.float64)
    if not len(vals):
        return []
    whole = (vals == np.floor(vals)) & (np.abs(vals) < 2**53)
    every = bool(whole.all())
    ints = (vals if every else np.where(whole, vals, 0.0)).astype(np.int64)
    lo, hi = int(ints.min()), int(ints.max())
    if lo >= 0 and hi < _INT_TEXTS_MAX:
        if hi >= len(_int_texts):
            size = min(max(hi + 1, 2 * len(_int_texts)), _INT_TEXTS_MAX)
            _int_texts = np.array([b"%d" % i for i in range(size)], dtype=object)
        texts = _int_texts[ints].tolist()
    else:
        distinct, at = np.unique(ints, return_inverse=True)
        texts = np.array([b"%d" % i for i in distinct.tolist()], dtype=object)[at].tolist()
    if not every:
        for i in np.flatnonzero(~whole).tolist():
            texts[i] = repr(float(vals[i])).encode()
    return texts


def _lines(heads: list[bytes], texts: list[list[bytes]], tails: list[bytes]):
    """Grid point after grid point, one line per series: heads[j] + texts[j][k] + tails[k]
    (texts: _num_texts of each series), as bytes a few grid points at a time.
    NOTE: each bytes.join over at most ~_JOIN_PIECES pieces, laid out by list slices (no Python
    per line; was a NUL-padded byte matrix compressed: 0.5 -> 0.3 s of W1's 913,562 lines, CPU
    time at load 5): join's table of its pieces (80 bytes each) then stays in the cache (one
    join over a 4,096-point histogram chunk was ~30 % slower)."""
    m = len(heads)
    step = max(1, _JOIN_PIECES // (3 * m))
    for lo in range(0, len(tails), step):
        part = tails[lo:lo + step]
        n = len(part)
        pieces = [b""] * (3 * m * n)
        for j, (head, col) in enumerate(zip(heads, texts)):
            pieces[3 * j::3 * m] = [head] * n
            pieces[3 * j + 1::3 * m] = col[lo:lo + step]
            pieces[3 * j + 2::3 * m] = part
        yield b"".join(pieces)


def _le(b: float) -> str:
    f = float(b)
    return f"{f:.1f}" if f == int(f) else repr(f)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def to_openmetrics(requests: Requests, iterations: Iterations, *, interval_s: float = 1.0,
                   labels: dict[str, str] | None = None, start_unix_s: float = 0.0) -> str:
    """OpenMetrics text with one sample per series per grid time, timestamped
    `start_unix_s + t` (simulated seconds; 0 = the Unix epoch keeps files deterministic).
    Each family's samples are contiguous and time-ordered, histogram points complete
    (buckets, _count, _sum per timestamp), ending with `# EOF`, as
    `promtool tsdb create-blocks-from openmetrics` expects. (One string: for a file, use
    write_openmetrics, which streams the same text.)"""
    return "".join(openmetrics_chunks(requests, iterations, interval_s=interval_s, labels=labels,
                                      start_unix_s=start_unix_s))


def write_openmetrics(path: str | Path, requests: Requests, iterations: Iterations | None, *,
                      interval_s: float = 1.0, labels: dict[str, str] | None = None,
                      start_unix_s: float = 0.0, samples: Samples | None = None) -> None:
    """to_openmetrics written to `path` chunk by chunk (never the whole text in memory);
    `samples`: sample(requests, iterations, interval_s) when made already."""
    check_interval(interval_s)  # before the file is opened: a bad interval leaves it as it was
    if samples is None:
        samples = sample(requests, iterations, interval_s)
    with open(path, "wb") as f:
        for chunk in openmetrics_bytes(samples, labels=labels, start_unix_s=start_unix_s):
            f.write(chunk)


_CHUNK_SAMPLES = 4096  # grid points whose numbers are formatted at a time
_JOIN_PIECES = 1 << 14  # pieces of one bytes.join (_lines)


def openmetrics_chunks(requests: Requests, iterations: Iterations, *, interval_s: float = 1.0,
                       labels: dict[str, str] | None = None, start_unix_s: float = 0.0):
    """The text of to_openmetrics as a sequence of chunks (each whole lines ending in a newline)."""
    for chunk in openmetrics_bytes(sample(requests, iterations, interval_s), labels=labels,
                                   start_unix_s=start_unix_s):
        yield chunk.decode()


def openmetrics_bytes(samples: Samples, *, labels: dict[str, str] | None = None,
                      start_unix_s: float = 0.0):
    """The OpenMetrics text of `samples` (UTF-8), a few thousand grid points at a time: each
    family's header, then its lines by _lines (a series a chunk of grid points at a time; a
    histogram's buckets, +Inf, _count and _sum per grid point)."""
    g = samples.grid
    lab = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted((labels or {}).items()))
    if "\0" in lab:
        raise ConfigError(f"OpenMetrics labels must not contain NUL characters, got {lab!r}")
    sel = "{" + lab + "}" if lab else ""
    tails = [f" {start_unix_s + t:.3f}\n".encode() for t in g.tolist()]

    def series(prefix: str, vals: np.ndarray):
        head = [(prefix + " ").encode()]
        for lo in range(0, len(g), _CHUNK_SAMPLES):
            hi = lo + _CHUNK_SAMPLES
            yield from _lines(head, [_num_texts(vals[lo:hi])], tails[lo:hi])
    for name, (_, help_) in GAUGES.items():
        yield f"# HELP {name} {help_}\n# TYPE {name} gauge\n".encode()
        yield from series(f"{name}{sel}", samples.gauges[name])
    for name, totals in samples.counters.items():
        yield f"# HELP {name} {COUNTERS[name]}\n# TYPE {name} counter\n".encode()
        yield from series(f"{name}_total{sel}", totals)
    pre = lab + "," if lab else ""
    for name, (counts, sums) in samples.histograms.items():
        help_, buckets = HISTOGRAMS[name]
        head = f"# HELP {name} {help_}\n# TYPE {name} histogram\n"
        if name.endswith("_seconds"):
            head += f"# UNIT {name} seconds\n"
        yield head.encode()
        les = [_le(b) for b in buckets] + ["+Inf"]
        # per grid point: every bucket (+Inf last), then _count (the +Inf count), then _sum
        heads = [f'{name}_bucket{{{pre}le="{le}"}} '.encode() for le in les]
        heads += [f"{name}_count{sel} ".encode(), f"{name}_sum{sel} ".encode()]
        for lo in range(0, len(g), _CHUNK_SAMPLES):
            hi = lo + _CHUNK_SAMPLES
            texts = [_num_texts(v[lo:hi]) for v in counts]
            texts += [texts[-1], _num_texts(sums[lo:hi])]
            yield from _lines(heads, texts, tails[lo:hi])
    yield b"# EOF\n"


def main(argv: list[str] | None = None) -> int:
    """`python -m simulator.metrics.timeseries RUN_DIR --start-unix-s T`: rewrite a run's OpenMetrics
    export with real timestamps (e.g. now) so that a live Prometheus keeps the imported blocks."""
    p = argparse.ArgumentParser(prog="python -m simulator.metrics.timeseries", description=main.__doc__)
    p.add_argument("run_dir")
    p.add_argument("--start-unix-s", type=float, default=0.0)
    p.add_argument("--interval-s", type=float, default=1.0)
    p.add_argument("-o", "--output", help="default RUN_DIR/openmetrics.txt")
    args = p.parse_args(argv)
    import pandas as pd

    run_dir = Path(args.run_dir)
    try:
        reqs = pd.read_parquet(run_dir / "requests.parquet")
        iters = pd.read_parquet(run_dir / "iterations.parquet")
        model = ""
        cfg = run_dir / "config.yaml"
        if cfg.is_file():
            import yaml
            model = str((yaml.safe_load(cfg.read_text()) or {}).get("model", ""))
        write_openmetrics(Path(args.output or run_dir / "openmetrics.txt"), reqs, iters,
                          interval_s=args.interval_s, labels={"model_name": model} if model else None,
                          start_unix_s=args.start_unix_s)
    except (OSError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
