"""Outputs whose memory does not grow with the run: iterations streamed to parquet in row groups,
requests as column chunks, the summary and monitoring from compact columns. Each path must give
the same files (or the same table contents) as building everything in memory at the end."""

from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import simulator.metrics.recorder as recorder_mod
import simulator.metrics.steps as steps_mod
import simulator.metrics.timeseries as ts_mod
from simulator.config.schema import build_config
from simulator.engine.run import run
from simulator.errors import ConfigError
from simulator.metrics.alerts import AlertRule, firings
from simulator.metrics.steps import StreamedSteps, as_steps
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


def test_a_short_run_writes_its_last_row_group_in_the_background(tmp_path, monkeypatch):
    """One row group: finish() hands the write to a thread; every reader of the file waits for
    it (the file is whole), and an error the thread meets is raised in the caller's thread."""
    started = []
    real = recorder_mod.IterationsWriter._close

    def slow_close(self):
        started.append(threading.current_thread().name)
        time.sleep(0.2)  # still writing when the summary is made
        real(self)
    monkeypatch.setattr(recorder_mod.IterationsWriter, "_close", slow_close)
    res = run(_config(), iterations_path=tmp_path / "it.parquet")
    assert started == ["iterations.parquet"]  # not the caller's thread
    out = res.write(tmp_path / "run")
    rows = pq.ParquetFile(out / "iterations.parquet").metadata.num_rows
    assert rows == res.summary["batch"]["num_iterations"] > 0

    def failing_close(self):
        raise OSError("disk full")
    monkeypatch.setattr(recorder_mod.IterationsWriter, "_close", failing_close)
    res = run(_config(), iterations_path=tmp_path / "it2.parquet")  # the summary is made meanwhile
    with pytest.raises(OSError, match="disk full"):
        res.recorder.iterations_file()


class _InlineThread:
    """threading.Thread that runs its target at start(): the writes in the caller's order."""

    def __init__(self, target, args=(), name=None):
        self._run = lambda: target(*args)

    def start(self):
        self._run()

    def join(self):
        pass


def test_row_groups_are_written_by_a_thread_one_at_a_time(tmp_path, monkeypatch):
    """A long run's row groups are widened, encoded and written by a thread (beside the
    simulation), one at a time and in order: the file's bytes are those of writing each group
    inline; a write that fails raises in the caller's thread, and again at every later call."""
    monkeypatch.setattr(recorder_mod, "_CHUNK_ROWS", 7)
    monkeypatch.setattr(recorder_mod, "ROW_GROUP_ROWS", 10)
    threads, active, most = [], [0], [0]
    lock = threading.Lock()
    real = recorder_mod.IterationsWriter._write_table

    def spy(self, *args):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        threads.append(threading.current_thread().name)
        time.sleep(0.002)  # long enough for a second group to start, were it allowed to
        real(self, *args)
        with lock:
            active[0] -= 1
    monkeypatch.setattr(recorder_mod.IterationsWriter, "_write_table", spy)
    run(_config(), iterations_path=tmp_path / "it.parquet")
    groups = pq.ParquetFile(tmp_path / "it.parquet").metadata.num_row_groups
    assert len(threads) == groups > 2 and most[0] == 1
    assert set(threads[:-1]) == {"iterations.parquet row group"}
    monkeypatch.setattr(recorder_mod.IterationsWriter, "_write_table", real)
    monkeypatch.setattr(recorder_mod.threading, "Thread", _InlineThread)
    run(_config(), iterations_path=tmp_path / "inline.parquet")
    assert (tmp_path / "it.parquet").read_bytes() == (tmp_path / "inline.parquet").read_bytes()
    monkeypatch.undo()

    monkeypatch.setattr(recorder_mod, "_CHUNK_ROWS", 7)
    monkeypatch.setattr(recorder_mod, "ROW_GROUP_ROWS", 10)
    calls = []
    real_write = pq.ParquetWriter.write_table

    def failing(self, table, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        real_write(self, table, *args, **kwargs)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing)
    writer = recorder_mod.IterationsWriter(tmp_path / "w.parquet")
    chunk = {c: np.zeros(10) for c in ("start_s", "duration_s")}
    writer.write(chunk)
    writer.write(chunk)  # the second group fails in its thread
    for again in (lambda: writer.write(chunk), writer.close, writer.wait):
        with pytest.raises(OSError, match="disk full"):
            again()


def test_a_failed_run_leaves_no_partial_iterations_file(tmp_path, monkeypatch):
    """The simulation raises while a row group is in flight: the group is joined, the writer
    closed and the partial file removed; the run's own error is what the caller sees."""
    monkeypatch.setattr(recorder_mod, "_CHUNK_ROWS", 7)
    monkeypatch.setattr(recorder_mod, "ROW_GROUP_ROWS", 10)
    real = recorder_mod.MetricsRecorder._seal
    calls = []

    def seal(self):  # the 4th chunk of 7 steps: two row groups of 10 gone to the writer
        calls.append(1)
        if len(calls) == 4:
            raise RuntimeError("boom")
        real(self)
    monkeypatch.setattr(recorder_mod.MetricsRecorder, "_seal", seal)
    path = tmp_path / ".it.parquet.partial"
    with pytest.raises(RuntimeError, match="boom"):
        run(_config(), iterations_path=path)
    assert len(calls) == 4 and not path.exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("iterations.parquet")]


def test_a_short_streamed_run_keeps_its_compact_columns(tmp_path):
    res = run(_config(), iterations_path=tmp_path / "it.parquet")
    assert not isinstance(res.steps, StreamedSteps)
    _same_steps(run(_config()).steps, res.steps)
    assert np.array_equal(res.steps["duration_s"], res.iterations.duration_s.to_numpy())


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
    # (the mean by the summary's own dot: a @ b sums in BLAS's order, not numpy's pairwise one)
    return {"mean": ts_mod.dot(v, w) / total, "p95": p95, "max": float(recorded.max())}


@pytest.mark.parametrize("path", ["key totals", "ranges", "order"])
@pytest.mark.parametrize("seed", range(6))
def test_lean_time_weighting_equals_the_definition(seed, path, monkeypatch):
    """Chunked cumulative sums, integer keys by their totals, radix-sorted, or visited by code
    ranges (as a long run's) or in one order: the same p95, bit for bit."""
    monkeypatch.setattr(ts_mod, "_ORDER_CHUNK", 97)
    monkeypatch.setattr(ts_mod, "_RANGES_ABOVE", 0 if path == "ranges" else 1 << 40)
    if path != "key totals":
        monkeypatch.setattr(ts_mod, "_p95_by_key_totals", lambda *a: None)
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


@pytest.mark.parametrize("seed", range(4))
def test_p95_by_key_totals_defers_at_a_key_boundary(seed, monkeypatch):
    """Where 95 % of the time falls on the boundary between two keys (or within rounding of
    it), the key totals cannot tell which key the ordered sum reaches it in: they defer (None)
    and the p95 is the ordered cumulation's, as the definition gives; elsewhere they find it."""
    monkeypatch.setattr(ts_mod, "_ORDER_CHUNK", 61)
    rng = np.random.default_rng(seed)
    n = 400
    key = rng.integers(0, 5, n)
    w = rng.uniform(0, 1, n)
    w[key == 4] *= 0.05 * w[key != 4].sum() / (0.95 * w[key == 4].sum())  # the top key: 5 %
    total = float(w.sum())
    order = np.argsort(key, kind="stable")
    cum = np.cumsum(w[order])
    want = float(key[order][min(int(np.searchsorted(cum, 0.95 * total, side="left")), n - 1)])
    assert weighted_stats(key.astype(np.float64), w, total, key)["p95"] == want
    # a boundary exactly at 95 %: 95 parts of the weight on key 0, 5 on key 1
    w2, k2 = np.array([95.0, 2.0, 3.0]), np.array([0, 1, 1])
    assert ts_mod._p95_by_key_totals(w2, k2, 0.95 * float(w2.sum()), 2) is None
    assert weighted_stats(k2.astype(np.float64), w2, float(w2.sum()), k2)["p95"] == 0.0
    assert ts_mod._p95_by_key_totals(np.array([90.0, 2.0, 8.0]), k2, 95.0, 2) == 1
    assert ts_mod._p95_by_key_totals(np.array([-1.0, 2.0, 8.0]), k2, 8.55, 2) is None  # negative


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
    # a window cutting the times (clipped), around them, and from the first to the last
    for t0, t1 in ((1.0, 49.0), (-1.0, 51.0), (float(times[0]), float(times[-1]))):
        for for_s in (0.0, 0.3, 2.0):
            rule = AlertRule("r", "pending", 2.0, for_s=for_s)
            got = [(f.start_s, f.end_s, f.peak, f.peak_s, f.resolved) for f in firings(rule, fn, t0, t1)]
            assert got == _firings_reference(rule, fn, t0, t1), (t0, t1, for_s)


# --- streamed runs read their StepColumns back from iterations.parquet ------------------------


def _same_steps(a, b):
    assert np.array_equal(a.ends, b.ends) and len(a) == len(b)
    for name in a.columns:
        if name == "duration_s" and isinstance(b, StreamedSteps):  # busy_s sums it from the file
            assert name not in b
            continue
        assert name in b
        assert b[name].dtype == a[name].dtype and np.array_equal(a[name], b[name]), name
    for name, (codes, table) in a.coded.items():
        got = b.sort_key(name)
        assert got is not None and got[0].dtype == codes.dtype, name
        assert np.array_equal(got[0], codes) and np.array_equal(got[1], table), name


@pytest.mark.parametrize("codes,keep_steps", [(True, 0), (True, 20), (False, 0)])
def test_streamed_steps_are_the_in_memory_compact_columns(tmp_path, monkeypatch, codes, keep_steps):
    """A streamed run past _KEEP_STEPS (at once, or after a few chunks) reads its columns back:
    several chunks and row groups, a cache too small to keep a column (every access reads the
    file again), kv_usage codable or not: the same arrays, dtypes and summary."""
    monkeypatch.setattr(recorder_mod, "_KEEP_STEPS", keep_steps)
    monkeypatch.setattr(recorder_mod, "_CHUNK_ROWS", 7)
    monkeypatch.setattr(recorder_mod, "ROW_GROUP_ROWS", 10)
    if not codes:
        monkeypatch.setattr(recorder_mod, "_MAX_CODES", 3)
    cfg = _config(["engine.enable_prefix_caching=true"])
    mem = run(cfg)
    monkeypatch.setattr(steps_mod, "CACHE_BYTES", 16)
    res = run(cfg, iterations_path=tmp_path / "it.parquet")
    assert isinstance(res.steps, StreamedSteps) and not isinstance(mem.steps, StreamedSteps)
    assert res.recorder._steps == {} and res.recorder._ends == []  # nothing per step kept
    assert pq.ParquetFile(tmp_path / "it.parquet").metadata.num_row_groups > 1
    assert (res.steps.sort_key("kv_usage") is None) == (not codes)
    _same_steps(mem.steps, res.steps)
    assert set(mem.steps.columns) | set(mem.steps.coded) == {
        n for n in steps_mod.DERIVED_COLUMNS if n in res.steps} | {"duration_s"}
    assert json.dumps(res.summary, sort_keys=True) == json.dumps(mem.summary, sort_keys=True)
    a, b = mem.write(tmp_path / "mem"), res.write(tmp_path / "stream")
    for name in FILES:  # (row groups of 10 rows: the same table in another file layout)
        if name != "iterations.parquet":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert res.iterations.equals(mem.iterations)


def test_streamed_steps_follow_the_file_when_it_moves(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_mod, "_KEEP_STEPS", 0)
    out = tmp_path / "run"
    out.mkdir()
    res = run(_config(), iterations_path=out / ".partial")
    _ = res.summary  # read back once from the partial file
    res.write(out)  # moved to iterations.parquet
    steps = res.steps
    steps._cache.clear()  # the next read goes to the file again, at its new place
    assert np.array_equal(steps["num_running"], as_steps(pd.read_parquet(out / "iterations.parquet"))
                          ["num_running"])


# --- OpenMetrics text and histogram counts as arrays ------------------------------------------
def _num_reference(v: float) -> str:
    """Shortest exact text, integers without a decimal point (inf and nan as repr writes them)."""
    f = float(v)
    if math.isfinite(f) and f == int(f) and abs(f) < 2**53:
        return str(int(f))
    return repr(f)


def test_number_text_matches_the_definition():
    rng = np.random.default_rng(7)
    special = [0.0, -0.0, 1.0, -1.0, 9.0, 10.0, 99.0, 100.0, -100.0, 2.0**53 - 1, 2.0**53, -2.0**53,
               1e300, -1e-300, 0.1, 1e16, 5e-324, 123456789.5, np.inf, -np.inf, np.nan]
    values = np.concatenate([special, rng.integers(-10**12, 10**12, 300).astype(np.float64),
                             rng.normal(0, 1e3, 300), rng.random(50).round(2)])
    small = rng.integers(0, 9, 40).astype(np.float64)  # looked up in the table of small integers
    grows = rng.integers(0, 1 << 16, 40).astype(np.float64)  # the table grown, and past it
    for chunk in (values, values[:3], values[3:4], small, grows, values[:0]):
        assert [t.decode() for t in ts_mod._num_texts(chunk)] == [_num_reference(v) for v in chunk]


@pytest.mark.parametrize("seed", range(4))
def test_bucket_counts_equal_the_running_counts(seed, monkeypatch):
    monkeypatch.setattr(ts_mod, "_EVENT_BLOCK", 13)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 500))
    times = rng.uniform(0, 20, n).round(1)  # unsorted, with ties
    values = rng.exponential(2.0, n)
    values[rng.random(n) < 0.05] = np.nan
    if seed % 2:
        values = rng.integers(0, 3000, n).astype(np.int16)
    bounds = ts_mod.TTFT_BUCKETS_S if not seed % 2 else ts_mod.ITERATION_TOKEN_BUCKETS
    g = ts_mod.grid(18.0, 0.5)
    want = [ts_mod._counter(times, values <= b, g) for b in bounds] + [ts_mod._count(times, g)]
    got = ts_mod._bucket_counts(times, values, bounds, g)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def _openmetrics_reference(requests, iterations, interval_s, labels, start_unix_s):
    """The text line by line, as it was written before the byte-matrix version."""
    steps = as_steps(iterations)
    _, t1 = ts_mod.run_window(requests, steps)
    g = ts_mod.grid(t1, interval_s)
    lab = ",".join(f'{k}="{ts_mod._escape(str(v))}"' for k, v in sorted(labels.items()))
    sel = "{" + lab + "}" if lab else ""
    stamps = [f"{start_unix_s + t:.3f}" for t in g.tolist()]
    out = []
    for name, (col, help_) in ts_mod.GAUGES.items():
        out.append(f"# HELP {name} {help_}\n# TYPE {name} gauge\n")
        vals = ts_mod.gauge(steps, col).at(g)
        out += [f"{name}{sel} {_num_reference(v)} {t}\n" for v, t in zip(vals, stamps)]
    for name, (times, inc) in ts_mod._counter_events(requests, steps):
        out.append(f"# HELP {name} {ts_mod.COUNTERS[name]}\n# TYPE {name} counter\n")
        vals = ts_mod._counter(times, inc, g)
        out += [f"{name}_total{sel} {_num_reference(v)} {t}\n" for v, t in zip(vals, stamps)]
    pre = lab + "," if lab else ""
    for name, (times, values) in ts_mod._histogram_observations(requests, steps):
        help_, buckets = ts_mod.HISTOGRAMS[name]
        out.append(f"# HELP {name} {help_}\n# TYPE {name} histogram\n")
        if name.endswith("_seconds"):
            out.append(f"# UNIT {name} seconds\n")
        counts = [ts_mod._counter(times, values <= b, g) for b in buckets] + [ts_mod._count(times, g)]
        sums = ts_mod._counter(times, values, g)
        les = [ts_mod._le(b) for b in buckets] + ["+Inf"]
        for k, t in enumerate(stamps):
            out += [f'{name}_bucket{{{pre}le="{le}"}} {_num_reference(c[k])} {t}\n'
                    for le, c in zip(les, counts)]
            out += [f"{name}_count{sel} {_num_reference(counts[-1][k])} {t}\n",
                    f"{name}_sum{sel} {_num_reference(sums[k])} {t}\n"]
    out.append("# EOF\n")
    return "".join(out)


@pytest.mark.parametrize("labels", [{}, {"model_name": 'Llama "é" 7b\\x', "b": "2"}])
def test_openmetrics_text_matches_the_line_by_line_definition(tmp_path, monkeypatch, labels):
    monkeypatch.setattr(ts_mod, "_CHUNK_SAMPLES", 5)
    monkeypatch.setattr(ts_mod, "_JOIN_PIECES", 7)
    res = run(_config(["engine.enable_prefix_caching=true"]))
    want = _openmetrics_reference(res.requests, res.steps, 0.25, labels, 1.7e9)
    assert ts_mod.to_openmetrics(res.requests, res.steps, interval_s=0.25, labels=labels,
                                 start_unix_s=1.7e9) == want
    path = tmp_path / "om.txt"
    ts_mod.write_openmetrics(path, res.requests, res.iterations, interval_s=0.25, labels=labels,
                             start_unix_s=1.7e9)
    assert path.read_bytes() == want.encode()
    with pytest.raises(ConfigError, match="NUL"):
        ts_mod.to_openmetrics(res.requests, res.steps, labels={"model_name": "a\0b"})


@pytest.mark.parametrize("signed", [False, True])
def test_token_gaps_sort_as_the_floats_do(signed, monkeypatch):
    """The gaps' (value, count) entries in the stable order of the values: sorted by their bits
    when every value is >= +0.0 (equal floats, equal bits), as floats otherwise (-0.0, NaN)."""
    rng = np.random.default_rng(3)
    rec = recorder_mod.MetricsRecorder(100)
    for _ in range(40):  # chunks sharing values (ties across chunks keep their chunk order)
        gaps = rng.choice([0.0, 0.01, 0.02, 0.5, 1e-9], 3000) + rng.integers(0, 3, 3000) * 0.25
        if signed:
            gaps[:3] = (-0.0, -1.0, np.nan)
        rec.add_token_gaps(gaps)
        rec._compress_gaps()  # one (value, count) chunk each
    v = np.concatenate(rec._gap_values)
    c = np.concatenate(rec._gap_counts)
    order = np.argsort(v, kind="stable")
    got_v, got_c = rec.token_gaps()
    assert np.array_equal(got_v.view(np.uint64), v[order].view(np.uint64))
    assert np.array_equal(got_c, c[order])


@pytest.mark.parametrize("seed", range(4))
def test_positions_in_is_searchsorted(seed):
    """A coded column's read-back lookup gives np.searchsorted's positions for table entries
    (evenly spaced as kv_usage's, or crowded into one bucket) and for any other value."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 5000))
    tables = [np.unique(1 - rng.integers(0, 9000, n) / 8999),
              np.unique(np.concatenate([rng.random(n) * 1e-9, rng.random(50), [0.0, 3.0]]))]
    for table in tables:
        values = np.concatenate([table[rng.integers(0, len(table), 20_000)], rng.random(500) * 5 - 1,
                                 [np.nan, np.inf, -np.inf, -0.0, 0.0]])
        for t in (table, table[:1]):
            assert np.array_equal(steps_mod.positions_in(t, values), np.searchsorted(t, values))
    assert steps_mod.positions_in(np.zeros(0), np.array([1.0])).tolist() == [0]


@pytest.mark.parametrize("groups", [1, 2, 7])
def test_read_row_groups_fills_every_row_once_and_raises_a_readers_error(tmp_path, groups):
    """read_row_groups (two threads, alternate groups): every row group handed to fill once at
    its first row, whatever the number of groups; an error in either thread is raised in the
    caller after both stopped."""
    import pyarrow as pa

    n = 5 * groups
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(n) * 3, "y": np.arange(n) * 0.5}), path, row_group_size=5)
    assert pq.ParquetFile(path).metadata.num_row_groups == groups
    x, y = np.full(n, -1), np.full(n, -1.0)
    seen = []

    def fill(pos, group):
        seen.append(pos)
        k = group.num_rows
        x[pos:pos + k] = group.column(0).to_numpy()
        y[pos:pos + k] = group.column(1).to_numpy()
    steps_mod.read_row_groups(path, ["x", "y"], fill)
    assert sorted(seen) == list(range(0, n, 5))
    assert np.array_equal(x, np.arange(n) * 3) and np.array_equal(y, np.arange(n) * 0.5)

    def bad(pos, group):
        if pos == 5 * (groups - 1):  # the last group (the second thread's, from 2 groups)
            raise ValueError(f"bad group at {pos}")
    with pytest.raises(ValueError, match="bad group"):
        steps_mod.read_row_groups(path, ["x"], bad)
