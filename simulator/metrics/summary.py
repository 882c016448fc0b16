"""The run summary, from a MetricsRecorder's tables (recorder.py).

summary.json, schema_version 2; docs/metrics.md defines every field. In short:
- latency: ttft = first token - arrival; tpot = (finish - first token) / (outputs - 1) for
  requests with > 1 output; itl = every gap between consecutive output tokens (one sample per
  gap); e2e = finish - arrival; queue = first scheduled - arrival. mean, p50/p90/p99 (numpy's
  linear interpolation; inverted CDF for the weighted token gaps), max, over finished requests.
- window: [first arrival, max(last step end, last arrival)]; makespan_s is its length and
  every rate (throughput, preemptions/s, goodput) is per second of it.
- gauges (KV usage, pending queue, fragmentation) are step functions updated at the end of
  each engine step (timeseries.py); their means and p95 are time-weighted over the window.
- batch sizes are per engine step (each step counts once), in sequences and in tokens.
Invariants: the recorder only appends; everything else is derived from its tables, so a run
directory's parquet files reproduce every gauge, alert and plot.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np

from simulator.config.sections import SloConfig
from simulator.metrics.alerts import evaluate, resolve_rules, summarize_alerts
from simulator.metrics.recorder import MetricsRecorder
from simulator.metrics.steps import StepColumns, distinct, release_memory
from simulator.metrics.table import column, write_parquet
from simulator.metrics.timeseries import (
    Iterations,
    Requests,
    dot,
    run_window,
    segment_lengths,
    weighted_stats,
    with_initial,
)

SCHEMA_VERSION = 3
PCTS = (50, 90, 99)


# --- SLO -------------------------------------------------------------------------------------
SloTargets = SloConfig  # ttft_s / tpot_s, None: not checked (config/sections.py)
SLO_KEYS = tuple(SloConfig.model_fields)


def resolve_slo(spec: SloConfig | dict[str, Any] | None) -> SloConfig:
    """The SLO targets: the config's section as is, or raw YAML data validated (defaults
    2 s TTFT, 0.1 s TPOT)."""
    return spec if isinstance(spec, SloConfig) else SloConfig.from_section(spec)


# --- statistics ------------------------------------------------------------------------------
def _stats(x: np.ndarray) -> dict[str, float | None]:
    finite = np.isfinite(x)
    if not finite.all():
        x = x[finite]
    del finite
    if len(x) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    out = {"mean": float(x.mean())}
    out.update({f"p{p}": float(v) for p, v in zip(PCTS, percentiles(x))})
    out["max"] = float(x.max())
    return out


_QUANTILES = np.true_divide(PCTS, 100)  # as np.percentile makes them


def percentiles(x: np.ndarray) -> np.ndarray:
    """np.percentile(x, PCTS) of a non-empty float64 array without NaN, bit for bit: numpy's
    linear method (virtual index (n - 1) q, its neighbours' order statistics by one partition,
    numpy's lerp), written out because np.percentile's np.unique of the partition points
    imports numpy.ma (~20 ms of every run's start-up) (tests/test_metrics.py compares them)."""
    if x.dtype != np.float64:
        return np.percentile(x, PCTS)
    virtual, prev, after = _points(len(x))
    # the partition points np.percentile gives (its np.unique of them, as a sorted set)
    part = np.partition(x, sorted({0, -1, *prev.tolist(), *after.tolist()}))
    return _lerp(part[prev], part[after], virtual, prev)


def _points(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """np.percentile's virtual indices of PCTS over n values and their two neighbours' order
    statistics (intp; -1 for the last value, as numpy takes it)."""
    virtual = (n - 1) * _QUANTILES
    prev = np.floor(virtual)
    after = prev + 1
    last = virtual >= n - 1  # (numpy: the last value, as index -1)
    prev[last] = -1
    after[last] = -1
    return virtual, prev.astype(np.intp), after.astype(np.intp)


def _lerp(a: np.ndarray, b: np.ndarray, virtual: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """numpy's lerp between the neighbours a and b of each virtual index (float64)."""
    gamma = virtual - prev
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


def _weighted_stats(values: np.ndarray, counts: np.ndarray) -> dict[str, float | None]:
    if len(values) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    mean_num = dot(values, counts)  # NOTE: before the cumulative counts: one temporary at a time
    cum = np.cumsum(counts)
    total = cum[-1]
    out = {"mean": float(mean_num / total)}
    for p in PCTS:
        out[f"p{p}"] = float(values[np.searchsorted(cum, p / 100 * total, side="left")])
    out["max"] = float(values[-1])
    return out


def histogram(x: np.ndarray) -> dict[str, list[int]]:
    """Counts in power-of-two buckets: bucket k holds (upper_bounds[k-1], upper_bounds[k]]
    (the first holds values <= 1), up to the first bound >= max."""
    if len(x) == 0:
        return {"upper_bounds": [], "counts": []}
    if x.dtype.kind in "iu" and int(x.min()) >= 0:  # counts by value, then by bucket (exact)
        return _histogram_of_counts(_value_counts(x, int(x.max())))
    bounds = _bucket_bounds(int(math.ceil(float(x.max()))))
    counts = np.bincount(np.searchsorted(bounds, x, side="left"), minlength=len(bounds))
    return {"upper_bounds": bounds.tolist(), "counts": counts.tolist()}


def _bucket_bounds(top: int) -> np.ndarray:
    """The histogram's upper bounds 1, 2, 4, ... up to the first >= top."""
    return 1 << np.arange(int(math.ceil(math.log2(max(1, top)))) + 1, dtype=np.int64)


def _histogram_of_counts(per_value: np.ndarray) -> dict[str, list[int]]:
    """histogram of non-negative integers given by their counts (`_value_counts`; the last
    counted: the largest value)."""
    bounds = _bucket_bounds(len(per_value) - 1)
    bucket = np.searchsorted(bounds, np.arange(len(per_value)), side="left")
    counts = np.zeros(len(bounds), np.int64)
    np.add.at(counts, bucket, per_value)
    return {"upper_bounds": bounds.tolist(), "counts": counts.tolist()}


def _value_counts(x: np.ndarray, top: int) -> np.ndarray:
    """np.bincount of non-negative integers up to `top`, a block at a time (bincount makes an
    intp copy of its input: a long run's column would be copied whole)."""
    per_value = np.zeros(top + 1, np.int64)
    for lo in range(0, len(x), _COUNT_CHUNK):
        per_value += np.bincount(x[lo:lo + _COUNT_CHUNK], minlength=top + 1)
    return per_value


def _batch_stats(x: np.ndarray) -> dict[str, Any]:
    # (top * n bounds every partial sum: below _EXACT_SUM numpy's float sum is exact)
    if (x.dtype.kind in "iu" and len(x) and int(x.min()) >= 0 and (top := int(x.max())) < _COUNTED_MAX
            and top * len(x) < _EXACT_SUM):
        return _counted_stats(_value_counts(x, top), len(x))
    return {**_stats(x.astype(np.float64)), "histogram": histogram(x)}


_COUNTED_MAX = 1 << 24  # integer batch columns up to this are summarised from their counts
_COUNT_CHUNK = 1 << 22
_EXACT_SUM = 1 << 53  # integer sums below this are exact in float64, in any order


def _counted_stats(per_value: np.ndarray, n: int) -> dict[str, Any]:
    """_batch_stats of n non-negative integers given as how many of each value there are
    (np.bincount): the same figures as over the values as float64, bits included, with no
    float copy and no partition of the column (tens of millions of steps in a long run):
    - mean: every partial sum of integers is exact below 2^53 (the caller's bound: max * n),
      so numpy's pairwise sum is the exact sum whatever its order, and the same division follows;
    - percentiles: each order statistic is the value whose cumulative count passes its rank,
      and numpy's lerp between them (_lerp, as `percentiles`);
    - max: the largest value counted; the histogram from the same counts."""
    total = int(per_value @ np.arange(len(per_value), dtype=np.int64))
    mean = float(np.float64(total) / n)
    virtual, prev, after = _points(n)
    cum = np.cumsum(per_value)

    def order_statistic(rank: np.ndarray) -> np.ndarray:
        return np.searchsorted(cum, np.where(rank < 0, n + rank, rank), side="right").astype(np.float64)
    pct = _lerp(order_statistic(prev), order_statistic(after), virtual, prev)
    out: dict[str, Any] = {"mean": mean}
    out.update({f"p{p}": float(v) for p, v in zip(PCTS, pct)})
    out["max"] = float(len(per_value) - 1)
    out["histogram"] = _histogram_of_counts(per_value)
    return out


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


# --- the summary -----------------------------------------------------------------------------
def summarize(recorder: MetricsRecorder, num_arrived: int, *, slo: dict | None = None,
              alerts: dict | None = None, kv_allocator: str = "paged") -> dict[str, Any]:
    """The run summary (schema_version 2, docs/metrics.md). `slo` and `alerts` are the YAML
    sections (None: the defaults); `kv_allocator` says whether external fragmentation is 0 by
    construction (paged: any free block is usable) or must come from a recorded column.
    NOTE: in the order that keeps the peak memory low: the token gaps first (then released),
    then the tables, then one gauge at a time (_Gauges)."""
    gv, gc = recorder.token_gaps(release=True)
    itl = _weighted_stats(gv, gc)
    del gv, gc
    busy = recorder.busy_s()
    # NOTE: one replica's table as numpy columns (no pandas in a run); a cluster's DataFrame
    reqs = recorder.requests_table()
    iters = recorder.step_columns()
    release_memory(len(iters))  # the token gaps' parts, freed
    targets = resolve_slo(slo)
    rules = resolve_rules(alerts)
    t0, t1 = run_window(reqs, iters)
    makespan = t1 - t0

    def rate(x: float) -> float:
        return x / makespan if makespan > 0 else 0.0

    # 1. what the requests give (their columns dropped before the per-step columns are read)
    status = column(reqs, "status")
    fin = status == "finished"
    done = _Done(reqs, fin)
    num_done = len(done)
    out = done["output_tokens"]
    ttft = done["first_token_s"] - done["arrival_s"]
    tpot_all = (done["finish_s"] - done["first_token_s"]) / np.maximum(out - 1, 1)
    met = np.ones(num_done, bool)
    if targets.ttft_s is not None:
        met &= ttft <= targets.ttft_s
    if targets.tpot_s is not None:
        met &= (out <= 1) | (tpot_all <= targets.tpot_s)
    num_met = int(met.sum())
    del tpot_all, met

    total_preempt = int(column(reqs, "num_preemptions").sum())
    rejected = status == "rejected"
    # NOTE: as pandas' value_counts: missing reasons (None, NaN) are not counted
    reasons = Counter(r for r in column(reqs, "reject_reason")[rejected].tolist()
                      if r is not None and r == r)
    preempted = int((done["num_preemptions"] > 0).sum())
    requests = {
        "arrived": int(num_arrived),
        "finished": int(num_done),
        "rejected": int(rejected.sum()),
        "rejected_by_reason": {k: int(v) for k, v in sorted(reasons.items())},
        "preempted_at_least_once": preempted,
    }
    del status, rejected, reasons
    throughput = {
        "requests_per_s": rate(num_done),
        "input_tokens_per_s": rate(float(done["prompt_tokens"].sum())),
        "output_tokens_per_s": rate(float(out.sum())),
    }
    multi = out > 1
    latency = {
        "ttft": _stats(ttft),
        "tpot": _stats((done["finish_s"][multi] - done["first_token_s"][multi]) / (out[multi] - 1)),
        "itl": itl,
        "e2e": _stats(done["finish_s"] - done["arrival_s"]),
        "queue": _stats(done["first_scheduled_s"] - done["arrival_s"]),
    }
    preemptions = {
        "total": total_preempt,
        "per_s": rate(float(total_preempt)),
        "requests_share": _ratio(float(preempted), num_done),
        "rate": _ratio(total_preempt, total_preempt + num_done),
    }
    prefix = _prefix_section(iters, done)
    groups = _groups_section(reqs, done)
    del done, fin, multi, ttft, out
    # 2. what the steps give, one column at a time
    batch = {
        "num_iterations": int(len(iters)),
        "num_seqs": _batch_stats(iters["num_seqs"] if len(iters) else np.zeros(0)),
        "num_tokens": _batch_stats(iters["num_tokens"] if len(iters) else np.zeros(0)),
        "max_running": int(iters["num_running"].max()) if len(iters) else 0,
    }
    release_memory(len(iters))  # the request sections' frames, freed
    gauges = _Gauges(iters, t0, t1)
    kv_cache = _kv_section(recorder.total_slots, gauges)
    fragmentation = _fragmentation_section(gauges, kv_allocator)
    queue = _queue_section(gauges)
    del gauges
    return {
        "schema_version": SCHEMA_VERSION,
        "requests": requests,
        "window": {"start_s": t0, "end_s": t1},
        "makespan_s": makespan,
        "busy_s": busy,
        "throughput": throughput,
        "latency_s": latency,
        "slo": {
            "ttft_s": targets.ttft_s,
            "tpot_s": targets.tpot_s,
            "met": num_met,
            "share": _ratio(num_met, num_arrived),
            "goodput_requests_per_s": rate(num_met),
        },
        "kv_cache": kv_cache,
        "prefix_cache": prefix,
        "fragmentation": fragmentation,
        "batch": batch,
        "queue": queue,
        "preemptions": preemptions,
        "alerts": summarize_alerts(rules, evaluate(rules, reqs, iters)),
        "groups": groups,
    }


class _Done:
    """The finished requests' columns (rows of `fin`), each taken once when first read."""

    def __init__(self, reqs: Requests, fin: np.ndarray) -> None:
        self.reqs, self.fin = reqs, fin
        self.cols: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return int(self.fin.sum())

    def __getitem__(self, name: str) -> np.ndarray:
        col = self.cols.get(name)
        if col is None:
            col = self.cols[name] = column(self.reqs, name)[self.fin]
        return col


def _group_keys(values: np.ndarray) -> list:
    """The distinct values of a column, sorted, missing ones (None, NaN) left out: the groups
    of pandas' groupby(sort=True), in their order."""
    if values.dtype != object:
        keys = distinct(values)
        return keys[~np.isnan(keys)].tolist() if keys.dtype.kind == "f" else keys.tolist()
    return sorted({v for v in values.tolist() if v is not None and v == v})


def _groups_section(reqs: Requests, done: _Done) -> dict[str, Any] | None:
    """Latency and preemptions per tier (else per priority, else per tenant) when the run has
    more than one: the starvation view of a scheduling policy (queue wait max and p99);
    `done`: the finished requests' columns."""
    for key in ("tier", "priority", "tenant"):
        if key in reqs:
            values = done[key]
            keys = _group_keys(values)
            if len(keys) > 1:
                break
    else:
        return None
    groups = {}
    for value in keys:
        g = values == value
        finish, first = done["finish_s"][g], done["first_token_s"][g]
        arrival, out = done["arrival_s"][g], done["output_tokens"][g]
        preempted = done["num_preemptions"][g]
        multi = out > 1
        groups[str(value)] = {
            "finished": int(g.sum()),
            "ttft_s": _stats(first - arrival),
            "tpot_s": _stats((finish[multi] - first[multi]) / (out[multi] - 1)),
            "e2e_s": _stats(finish - arrival),
            "queue_s": _stats(done["first_scheduled_s"][g] - arrival),
            "preemptions": int(preempted.sum()),
            "preempted_share": _ratio(float((preempted > 0).sum()), int(g.sum())),
        }
    return {"key": key, "groups": groups}


class _Gauges:
    """The gauges' time weighting over the run window [t0, t1] (timeseries.time_weighted and
    integral, the same float operations): the pieces' lengths are computed once for all of
    them, each gauge's values are made when asked for and dropped after, and only the gauges
    whose p95 is reported are sorted."""

    def __init__(self, steps: StepColumns, t0: float, t1: float) -> None:
        self.steps = steps
        self.w = segment_lengths(steps.ends, t0, t1)
        self.total = float(self.w.sum())

    def values(self, column: str) -> np.ndarray:
        coded = self.steps.sort_key(column)
        if coded is None:
            return with_initial(self.steps[column])
        codes, table = coded
        v = np.empty(len(codes) + 1)
        v[0] = 0.0
        # NOTE: mode="clip" (codes are valid positions): numpy buffers `out` under the default
        # mode="raise" (~2x slower)
        np.take(table, codes, out=v[1:], mode="clip")
        return v

    def stats(self, v: np.ndarray, key: np.ndarray | None = None, *,
              p95: bool = True) -> dict[str, float | None]:
        if p95:
            return weighted_stats(v, self.w, self.total, key)
        top = float(v.max())
        if self.total <= 0:
            return {"mean": None, "p95": None, "max": top}
        return {"mean": dot(v, self.w) / self.total, "p95": None, "max": top}

    def integral(self, v: np.ndarray) -> float:
        return dot(v, self.w)

    def key(self, column: str) -> np.ndarray | None:
        """The sort key of [0, column...]: the values themselves for an integer gauge, codes
        that order as the values for a coded one (2 c + 1 for code c, the initial 0 between
        or on them), None for other floats."""
        coded = self.steps.sort_key(column)
        if coded is not None:
            codes, table = coded
            pos = int(np.searchsorted(table, 0.0, side="left"))
            on = pos < len(table) and table[pos] == 0.0
            key = np.empty(len(codes) + 1, np.uint16 if len(table) < 1 << 15 else np.int32)
            key[0] = 2 * pos + (1 if on else 0)
            np.multiply(codes, 2, out=key[1:], casting="unsafe")
            key[1:] += 1
            return key
        col = self.steps[column]
        if col.dtype.kind not in "iu":
            return None
        key = np.empty(len(col) + 1, col.dtype)
        key[0] = 0
        key[1:] = col
        return key


def _kv_section(total_slots: int, gauges: _Gauges) -> dict[str, Any]:
    usage = gauges.stats(gauges.values("kv_usage"), gauges.key("kv_usage"))
    used = gauges.stats(gauges.values("kv_used_slots"), p95=False)
    return {"total_slots": int(total_slots), "usage_mean": usage["mean"], "usage_p95": usage["p95"],
            "usage_max": usage["max"], "used_slots_mean": used["mean"]}


def _prefix_section(iters: Iterations, done: _Done) -> dict[str, Any]:
    """vLLM's counters (every lookup, retries of a request that did not fit included) and the
    per-request view: tokens found when each finished request was first admitted."""
    if "prefix_cache_queries" not in iters or "prefix_cache_hits" not in iters:
        return {"queries": None, "hits": None, "hit_rate": None, "request_hit_rate": None,
                "prefill_tokens_saved": None}
    q = int(iters["prefix_cache_queries"].astype(np.int64).sum())
    h = int(iters["prefix_cache_hits"].astype(np.int64).sum())
    saved = int(np.maximum(done["num_cached_tokens"], 0).sum())
    return {"queries": q, "hits": h, "hit_rate": _ratio(h, q),
            "request_hit_rate": _ratio(saved, int(done["prompt_tokens"].sum())),
            "prefill_tokens_saved": saved}


_PIECE = 1 << 20


def _internal_slots(used: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """with_initial(used.astype(int64) - stored): the int64 differences made a piece at a time
    into the float64 array (no whole-length int64 temporaries)."""
    v = np.empty(len(used) + 1)
    v[0] = 0.0
    for lo in range(0, len(used), _PIECE):
        v[1 + lo:1 + lo + _PIECE] = used[lo:lo + _PIECE].astype(np.int64) - stored[lo:lo + _PIECE]
    return v


def _fragmentation_section(gauges: _Gauges, kv_allocator: str) -> dict[str, Any]:
    steps = gauges.steps
    # NOTE: each column read once (a streamed run's cache may hold only one of them)
    used, stored = steps["kv_used_slots"], steps["kv_tokens_stored"]
    used_int = gauges.integral(with_initial(used))
    stored_int = gauges.integral(with_initial(stored))
    internal = _internal_slots(used, stored)
    del used, stored
    internal_int = gauges.integral(internal)
    tw = gauges.stats(internal, p95=False)
    del internal
    if "kv_external_frag_slots" in steps:
        external: np.ndarray | None = gauges.values("kv_external_frag_slots")
    elif kv_allocator == "paged":
        external = np.zeros(len(steps) + 1)  # every free block is usable
    else:
        external = None
    ext_int = gauges.integral(external) if external is not None else None
    ext_mean = gauges.stats(external, p95=False)["mean"] if external is not None else None
    del external
    return {
        "internal_slots_mean": tw["mean"],
        "internal_slots_max": tw["max"],
        "internal_share_of_allocated": _ratio(internal_int, used_int),
        "external_slots_mean": ext_mean,
        "token_state_share": (_ratio(stored_int, used_int + ext_int) if ext_int is not None
                              else None),
        "token_state_share_of_allocated": _ratio(stored_int, used_int),
    }


def _queue_section(gauges: _Gauges) -> dict[str, Any]:
    pending = gauges.stats(gauges.values("num_waiting"), gauges.key("num_waiting"))
    running = gauges.stats(gauges.values("num_running"), p95=False)
    return {"pending_mean": pending["mean"], "pending_p95": pending["p95"],
            "pending_max": pending["max"], "running_mean": running["mean"]}


def clean_floats(obj: Any) -> Any:
    """NaN/inf -> None so that summary.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_floats(v) for v in obj]
    return obj


# --- several seeds ---------------------------------------------------------------------------

def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom (two-sided 95 %)."""
    if df < 1:
        raise ValueError(f"t quantile needs df >= 1, got {df}")
    # NOTE: imported here, not at the top: scipy.stats adds ~1 s to `import simulator.metrics.summary`
    # (0.6 s), which every run pays, and only --seeds needs a quantile.
    from scipy.stats import t

    return float(t.ppf(0.975, df))


_NOT_AGGREGATED = ("schema_version", "config", "window", "requests.rejected_by_reason")


def flatten(summary: dict[str, Any], prefix: str = "") -> dict[str, float | None]:
    """Numeric leaves of a summary as {"latency_s.ttft.p99": value}; booleans as 0/1; lists
    (histograms, fired rule names) and run identity (config, window) are left out."""
    out: dict[str, float | None] = {}
    for key, value in summary.items():
        path = f"{prefix}{key}"
        if path in _NOT_AGGREGATED or key == "histogram":
            continue
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        elif isinstance(value, bool):
            out[path] = float(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[path] = float(value) if math.isfinite(value) else None
        elif value is None:
            out[path] = None
    return out


def aggregate_seeds(seeds: list[int], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and two 95 % Student t intervals over seeds of every summary metric, s being the
    sample standard deviation over the n seeds whose value is not null:
    - ci95: where the metric's expected value lies, mean +- t975(n - 1) * s / sqrt(n); it
      shrinks like 1 / sqrt(n);
    - pi95: where one more seed's value falls, mean +- t975(n - 1) * s * sqrt(1 + 1 / n); it
      shrinks with n towards +- 1.96 sigma, the seed-to-seed spread itself.
    With n < 2 both are null."""
    flat = [flatten(s) for s in summaries]
    paths = list(dict.fromkeys(p for f in flat for p in f))
    metrics: dict[str, Any] = {}
    for path in paths:
        values = [f.get(path) for f in flat]
        x = np.array([v for v in values if v is not None], dtype=np.float64)
        n = len(x)
        entry: dict[str, Any] = {"n": n, "values": values, "mean": float(x.mean()) if n else None,
                                 "std": None, "ci95_low": None, "ci95_high": None,
                                 "ci95_half_width": None, "pi95_low": None, "pi95_high": None}
        if n >= 2:
            mean, sd, t = float(x.mean()), float(x.std(ddof=1)), t975(n - 1)
            half = t * sd / math.sqrt(n)
            pred = t * sd * math.sqrt(1 + 1 / n)
            entry.update(std=sd, ci95_low=mean - half, ci95_high=mean + half, ci95_half_width=half,
                         pi95_low=mean - pred, pi95_high=mean + pred)
        metrics[path] = entry
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "multi_seed",
        "seeds": list(seeds),
        "interval": "ci95: 95% Student t interval of the mean over seeds; pi95: 95% prediction "
                    "interval for one more seed",
        "alerts_fired_in": {name: sum(name in s.get("alerts", {}).get("fired", []) for s in summaries)
                            for name in dict.fromkeys(n for s in summaries
                                                      for n in s.get("alerts", {}).get("rules", {}))},
        "metrics": metrics,
    }


# --- run-directory outputs -------------------------------------------------------------------
MONITORING_FILES = ("timeseries.parquet", "openmetrics.txt", "alerts.json")


def write_monitoring(out_dir, requests: Requests, iterations: Iterations, *,
                     alerts: dict | None = None, interval_s: float | None = None,
                     labels: dict[str, str] | None = None) -> None:
    """Write MONITORING_FILES: the sampled gauges/counters (vLLM names), the same as
    OpenMetrics text, and every alert firing with the resolved rules. `interval_s` None:
    timeseries.auto_interval of the run's length (1 s up to AUTO_MAX_SAMPLES samples)."""
    import json
    from pathlib import Path

    from simulator.metrics.alerts import alerts_document
    from simulator.metrics.steps import as_steps
    from simulator.metrics.timeseries import auto_interval, sample, timeseries_columns, write_openmetrics

    out = Path(out_dir)
    steps = as_steps(iterations)
    release_memory(len(steps))
    if interval_s is None:
        interval_s = auto_interval(run_window(requests, steps)[1])
    rules = resolve_rules(alerts)
    samples = sample(requests, steps, interval_s)  # one pass over the steps for both files
    # NOTE: the bytes build_timeseries(...).to_parquet(index=False) writes, without pandas
    write_parquet(out / "timeseries.parquet", timeseries_columns(samples))
    write_openmetrics(out / "openmetrics.txt", requests, None, interval_s=interval_s,
                      labels=labels, samples=samples)
    del samples
    doc = alerts_document(rules, evaluate(rules, requests, steps))
    doc["interval_s"] = interval_s
    (out / "alerts.json").write_text(json.dumps(clean_floats(doc), indent=2, sort_keys=True) + "\n")
