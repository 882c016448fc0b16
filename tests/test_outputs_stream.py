"""Outputs whose memory does not grow with the run: iterations streamed to parquet in row groups,
requests as column chunks, the summary and monitoring from compact columns. Each path must give
the same files (or the same table contents) as building everything in memory at the end."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import simulator.metrics.recorder as recorder_mod
import simulator.metrics.timeseries as ts_mod
from simulator.config.schema import build_config
from simulator.engine.run import run
from simulator.metrics.alerts import AlertRule, firings
from simulator.metrics.steps import as_steps
from simulator.metrics.timeseries import (
    StepFunction,
    auto_interval,
    stable_order,
    time_weighted,
    weighted_stats,
    with_initial,
)

SMALL = ["workload.num_requests=60", "workload.arrival.rate=30"]
FILES = ("summary.json", "requests.parquet", "iterations.parquet", "timeseries.parquet",
         "openmetrics.txt", "alerts.json")


def _config(extra=()):
    return build_config(None, [*SMALL, *extra])


def test_streamed_run_writes_the_same_files_as_the_in_memory_one(tmp_path):
    """run(iterations_path=...) streams the table while the run goes; Result.write moves it in:
    every file byte-identical to the in-memory run's (one row group, as to_parquet writes)."""
    mem = run(_config()).write(tmp_path / "mem")
    out = tmp_path / "stream"
    out.mkdir()
    res = run(_config(), iterations_path=out / ".partial")
    res.write(out)
    assert not (out / ".partial").exists()
    for name in FILES:
        assert (mem / name).read_bytes() == (out / name).read_bytes(), name
    assert res.iterations.equals(pd.read_parquet(mem / "iterations.parquet"))


def test_row_groups_split_a_long_table_without_changing_its_contents(tmp_path, monkeypatch):
    """Chunks of 7 steps, row groups of 10 rows: several row groups, the same table and summary."""
    mem = run(_config())
    monkeypatch.setattr(recorder_mod, "_CHUNK_ROWS", 7)
    monkeypatch.setattr(recorder_mod, "ROW_GROUP_ROWS", 10)
    monkeypatch.setattr(recorder_mod, "_REQUEST_CHUNK", 3)
    res = run(_config(), iterations_path=tmp_path / "it.parquet")
    meta = pq.ParquetFile(tmp_path / "it.parquet").metadata
    assert meta.num_row_groups == -(-len(mem.iterations) // 10) > 1
    assert meta.row_group(0).num_rows == 10
    assert res.iterations.equals(mem.iterations)
    assert res.requests.equals(mem.requests)
    assert json.dumps(res.summary, sort_keys=True) == json.dumps(mem.summary, sort_keys=True)


def test_no_iterations_keeps_no_table_and_the_same_summary(tmp_path):
    full = run(_config())
    lean = run(_config(), keep_iterations=False)
    assert json.dumps(lean.summary, sort_keys=True) == json.dumps(full.summary, sort_keys=True)
    with pytest.raises(ValueError, match="keeps no iterations table"):
        _ = lean.iterations
    out = lean.write(tmp_path / "lean", iterations=False)
    ref = full.write(tmp_path / "full")
    assert not (out / "iterations.parquet").exists()
    for name in ("summary.json", "timeseries.parquet", "openmetrics.txt", "alerts.json"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name


def test_compact_columns_are_the_table_columns():
    res = run(_config(["engine.enable_prefix_caching=true"]))
    steps, table = res.steps, as_steps(res.iterations)
    assert np.array_equal(steps.ends, table.ends)
    for name, col in steps.columns.items():
        assert np.array_equal(col, table[name]), name
        assert col.dtype.itemsize <= table[name].dtype.itemsize
    codes, values = steps.sort_key("kv_usage")  # coded: 2 bytes a step, the exact floats
    assert codes.dtype == np.uint16 and np.array_equal(values[codes], table["kv_usage"])
    assert "prefix_cache_hits" in steps and steps["num_seqs"].dtype != np.int64


def test_cluster_outputs_do_not_stream_but_match(tmp_path):
    cfg = _config(["cluster.replicas=2", "cluster.router=round_robin"])
    a = run(cfg).write(tmp_path / "a")
    b = run(cfg, iterations_path=tmp_path / "ignored.parquet").write(tmp_path / "b")
    assert not (tmp_path / "ignored.parquet").exists()
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_auto_interval_suits_the_run_length():
    assert auto_interval(0.0) == 1.0 and auto_interval(3600.0) == 1.0
    assert auto_interval(ts_mod.AUTO_MAX_SAMPLES * 1.0) == 1.0
    assert auto_interval(ts_mod.AUTO_MAX_SAMPLES * 1.5) == 2.0
    assert auto_interval(714_000.0) == 50.0  # a million requests at 1.4 req/s
    for t1 in (1e3, 5e4, 3e5, 7e6):
        dt = auto_interval(t1)
        assert t1 / dt <= ts_mod.AUTO_MAX_SAMPLES


def _time_weighted_reference(fn: StepFunction, t0: float, t1: float) -> dict:
    """time_weighted as it was written before the lean version (the definition)."""
    _, w, v = fn.segments(t0, t1)
    total = float(w.sum())
    recorded = np.concatenate([[fn.initial], fn.values]) if len(fn.values) else np.array([fn.initial])
    if total <= 0:
        return {"mean": None, "p95": None, "max": float(recorded.max())}
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    p95 = float(v[order][min(int(np.searchsorted(cum, 0.95 * total, side="left")), len(v) - 1)])
    return {"mean": float(v @ w / total), "p95": p95, "max": float(recorded.max())}


@pytest.mark.parametrize("seed", range(6))
def test_lean_time_weighting_equals_the_definition(seed, monkeypatch):
    """Chunked cumulative sums and radix-sorted integer keys: the same p95, bit for bit."""
    monkeypatch.setattr(ts_mod, "_ORDER_CHUNK", 97)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    times = np.cumsum(rng.exponential(0.01, n)) + rng.uniform(0, 1)
    times[rng.random(n) < 0.1] = times[0]  # ties and pieces of length 0
    times.sort()
    ints = rng.integers(0, 40 if seed % 2 else 70000, n)
    for values, key in ((rng.uniform(0, 1, n).round(3), None), (ints.astype(np.float64), ints)):
        fn = StepFunction(times, values)
        t0, t1 = float(times[0]) - 0.5 * seed, float(times[-1]) + 0.1
        want = _time_weighted_reference(fn, t0, t1)
        assert time_weighted(fn, t0, t1) == want
        _, w, _ = fn.segments(t0, t1)
        k = None if key is None else np.concatenate([[0], key])
        assert weighted_stats(with_initial(values), w, float(w.sum()), k) == want
    heavy = np.where(rng.random(n) < 0.7, 0, rng.integers(0, 9, n))  # one code holds most pieces
    fn = StepFunction(times, heavy.astype(np.float64))
    _, w, _ = fn.segments(float(times[0]), float(times[-1]))
    got = weighted_stats(with_initial(fn.values), w, float(w.sum()), np.concatenate([[0], heavy]))
    assert got == _time_weighted_reference(fn, float(times[0]), float(times[-1]))
    keys = rng.integers(-5, 300, 1000).astype(np.int16)
    assert np.array_equal(stable_order(keys), np.argsort(keys, kind="stable"))


def _firings_reference(rule: AlertRule, fn: StepFunction, t0: float, t1: float) -> list:
    starts, lengths, values = fn.segments(t0, t1)
    keep = lengths > 0
    starts, lengths, values = starts[keep], lengths[keep], values[keep]
    above = np.concatenate([[False], values > rule.threshold, [False]])
    first_above = np.flatnonzero(~above[:-1] & above[1:])
    last_above = np.flatnonzero(above[:-1] & ~above[1:]) - 1
    n = len(values)
    end_at_t1 = float(fn.at(np.array([t1]))[0]) > rule.threshold
    out = []
    for i, j in zip(first_above.tolist(), last_above.tolist()):
        a, b = float(starts[i]), float(starts[j] + lengths[j])
        if b - a <= rule.for_s:
            continue
        start = a + rule.for_s
        if start >= b:  # the one change to the definition: it raised here (empty span)
            continue
        ends = starts[i:j + 1] + lengths[i:j + 1]
        first = i + int(np.searchsorted(ends, start, side="right"))
        seg = values[first:j + 1]
        k = int(np.argmax(seg))
        peak_s = max(start, float(starts[first + k]))
        out.append((start, b, float(seg[k]), peak_s, j + 1 < n or not end_at_t1))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_lean_firings_equal_the_definition(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(0, 400))
    times = np.sort(rng.uniform(0, 50, n).round(1))
    values = rng.integers(0, 5, n).astype(np.float64)
    fn = StepFunction(times, values, initial=float(rng.integers(0, 3)))
    for for_s in (0.0, 0.3, 2.0):
        rule = AlertRule("r", "pending", 2.0, for_s=for_s)
        got = [(f.start_s, f.end_s, f.peak, f.peak_s, f.resolved) for f in firings(rule, fn, 1.0, 49.0)]
        assert got == _firings_reference(rule, fn, 1.0, 49.0)
