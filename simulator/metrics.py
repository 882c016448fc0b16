"""MetricsRecorder: per-request rows, per-iteration rows, token gaps; and the run summary.

Definitions (summary.json, schema_version 1):
- ttft_s = first token time - arrival; tpot_s = (finish - first token) / (outputs - 1), for
  requests with > 1 output token; e2e_s = finish - arrival; queue_s = first scheduled - arrival.
- itl_s: every gap between consecutive output tokens of a request (weighted samples).
- throughput: finished requests (and their prompt / output tokens) over the makespan
  (first arrival to last finish).
- kv_usage: vLLM's gauge after each step, time-weighted by step duration for the mean.
- Percentiles: numpy's default (linear interpolation) for per-request values; inverted CDF
  for the weighted token gaps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from simulator.request import Request

SCHEMA_VERSION = 1
PCTS = (50, 90, 99)

ITER_COLUMNS = ("start_s", "duration_s", "num_seqs", "num_tokens", "prefill_tokens",
                "decode_tokens", "num_preempted", "num_admitted", "num_running", "num_waiting",
                "kv_used_slots", "kv_usage", "kv_tokens_stored")


class MetricsRecorder:
    def __init__(self, total_slots: int) -> None:
        self.total_slots = total_slots
        self._iters: dict[str, list] = {c: [] for c in ITER_COLUMNS}
        self._append = [self._iters[c].append for c in ITER_COLUMNS]
        self._gap_values: list[np.ndarray] = []
        self._gap_counts: list[np.ndarray] = []
        self.requests: list[Request] = []  # finished and rejected, in the order they ended

    def add_token_gaps(self, gaps: np.ndarray) -> None:
        # Most gaps in a step are equal (one step duration): store them as (value, count).
        values, counts = np.unique(gaps, return_counts=True)
        self._gap_values.append(values)
        self._gap_counts.append(counts)

    def iteration(self, *row) -> None:
        for append, value in zip(self._append, row):
            append(value)

    def request_ended(self, req: Request) -> None:
        self.requests.append(req)

    # --- tables ---------------------------------------------------------------------------
    def iterations_frame(self) -> pd.DataFrame:
        return pd.DataFrame({c: np.asarray(v) for c, v in self._iters.items()})

    def requests_frame(self) -> pd.DataFrame:
        reqs = sorted(self.requests, key=lambda r: r.req_id)
        f = lambda attr, dt: np.fromiter((getattr(r, attr) for r in reqs), dtype=dt, count=len(reqs))  # noqa: E731
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
        return df

    def token_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._gap_values:
            return np.zeros(0), np.zeros(0, np.int64)
        v = np.concatenate(self._gap_values)
        c = np.concatenate(self._gap_counts)
        order = np.argsort(v, kind="stable")
        return v[order], c[order]


def _stats(x: np.ndarray) -> dict[str, float | None]:
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    out = {"mean": float(x.mean())}
    out.update({f"p{p}": float(v) for p, v in zip(PCTS, np.percentile(x, PCTS))})
    out["max"] = float(x.max())
    return out


def _weighted_stats(values: np.ndarray, counts: np.ndarray) -> dict[str, float | None]:
    if len(values) == 0:
        return {"mean": None, **{f"p{p}": None for p in PCTS}, "max": None}
    cum = np.cumsum(counts)
    total = cum[-1]
    out = {"mean": float(values @ counts / total)}
    for p in PCTS:
        out[f"p{p}"] = float(values[np.searchsorted(cum, p / 100 * total, side="left")])
    out["max"] = float(values[-1])
    return out


def summarize(recorder: MetricsRecorder, num_arrived: int) -> dict[str, Any]:
    reqs = recorder.requests_frame()
    iters = recorder.iterations_frame()
    done = reqs[reqs.status == "finished"]
    rejected = reqs[reqs.status == "rejected"]
    first_arrival = float(reqs.arrival_s.min()) if len(reqs) else 0.0
    last_finish = float(done.finish_s.max()) if len(done) else first_arrival
    makespan = last_finish - first_arrival
    dur = iters.duration_s.to_numpy() if len(iters) else np.zeros(0)
    busy = float(dur.sum())
    multi = done[done.output_tokens > 1]
    gv, gc = recorder.token_gaps()

    def rate(x: float) -> float:
        return x / makespan if makespan > 0 else 0.0

    kv_usage = iters.kv_usage.to_numpy() if len(iters) else np.zeros(0)
    return {
        "schema_version": SCHEMA_VERSION,
        "requests": {
            "arrived": int(num_arrived),
            "finished": int(len(done)),
            "rejected": int(len(rejected)),
            "rejected_by_reason": {k: int(v) for k, v in
                                   sorted(rejected.reject_reason.value_counts().items())},
            "preempted_at_least_once": int((done.num_preemptions > 0).sum()),
        },
        "makespan_s": makespan,
        "throughput": {
            "requests_per_s": rate(len(done)),
            "input_tokens_per_s": rate(float(done.prompt_tokens.sum())),
            "output_tokens_per_s": rate(float(done.output_tokens.sum())),
        },
        "latency_s": {
            "ttft": _stats((done.first_token_s - done.arrival_s).to_numpy()),
            "tpot": _stats(((multi.finish_s - multi.first_token_s) / (multi.output_tokens - 1)).to_numpy()),
            "itl": _weighted_stats(gv, gc),
            "e2e": _stats((done.finish_s - done.arrival_s).to_numpy()),
            "queue": _stats((done.first_scheduled_s - done.arrival_s).to_numpy()),
        },
        "kv_cache": {
            "total_slots": int(recorder.total_slots),
            "usage_mean": float(kv_usage @ dur / busy) if busy > 0 else 0.0,
            "usage_max": float(kv_usage.max()) if len(kv_usage) else 0.0,
        },
        "batch": {
            "num_iterations": int(len(iters)),
            "num_seqs": _stats(iters.num_seqs.to_numpy(np.float64)) if len(iters) else _stats(np.zeros(0)),
            "num_tokens": _stats(iters.num_tokens.to_numpy(np.float64)) if len(iters) else _stats(np.zeros(0)),
            "max_running": int(iters.num_running.max()) if len(iters) else 0,
        },
        "preemptions": {
            "total": int(reqs.num_preemptions.sum()),
            "per_s": rate(float(reqs.num_preemptions.sum())),
        },
        "busy_s": busy,
    }


def clean_floats(obj: Any) -> Any:
    """NaN/inf -> None so that summary.json is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_floats(v) for v in obj]
    return obj
