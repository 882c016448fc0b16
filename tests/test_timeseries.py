"""Time series under vLLM's names and the OpenMetrics export: exact samples on the hand-built
two-request run (tests/test_metrics.py), the export parsed by prometheus_client, and imported
by promtool when it is installed."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.metrics.timeseries import StepFunction, build_timeseries, grid, time_weighted, to_openmetrics
from tests.test_metrics import fixed_step, run_two  # noqa: F401  (fixture)

parser = pytest.importorskip("prometheus_client.openmetrics.parser")


def test_step_function_time_weighting():
    fn = StepFunction(np.array([1.0, 2.0, 4.0]), np.array([3.0, 1.0, 7.0]))
    # over [0, 5]: 0 for 1 s, 3 for 1 s, 1 for 2 s, 7 for 1 s -> mean 12 / 5
    assert time_weighted(fn, 0.0, 5.0) == {"mean": 12 / 5, "p95": 7.0, "max": 7.0}
    # over [0, 4]: the last value lasts 0 s; 95 % of the time the gauge is <= 3
    assert time_weighted(fn, 0.0, 4.0) == {"mean": 5 / 4, "p95": 3.0, "max": 7.0}
    assert fn.at(np.array([0.0, 1.0, 1.5, 4.0, 9.0])).tolist() == [0, 3, 3, 7, 7]


def test_grid_and_interval_validation():
    assert grid(1.0, 0.25).tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    assert grid(1.1, 0.5).tolist() == [0, 0.5, 1.0, 1.5]
    with pytest.raises(ConfigError, match="interval_s must be a number >= 0.001.*got 0"):
        grid(1.0, 0)


def test_timeseries_of_hand_built_run(fixed_step):  # noqa: F811
    res = run_two()
    ts = build_timeseries(res.requests, res.iterations, 0.25)
    blocks = res.summary["kv_cache"]["total_slots"] // 16
    assert ts.time_s.tolist() == [0, 0.25, 0.5, 0.75, 1.0]
    assert ts["vllm:num_requests_running"].tolist() == [0, 1, 1, 1, 0]
    assert ts["vllm:num_requests_waiting"].tolist() == [0, 0, 1, 0, 0]
    assert ts["vllm:kv_cache_usage_perc"].to_numpy() * blocks == pytest.approx([0, 2, 2, 1, 0])
    assert ts["vllm:num_preemptions_total"].tolist() == [0] * 5
    # prompt tokens count when the prefill completes (first token): r0 at .25, r1 at .75
    assert ts["vllm:prompt_tokens_total"].tolist() == [0, 20, 20, 30, 30]
    # output tokens: r0 at .25 .5 .75, r1 at .75 1.0
    assert ts["vllm:generation_tokens_total"].tolist() == [0, 1, 2, 4, 5]
    assert ts["vllm:request_success_total"].tolist() == [0, 0, 0, 1, 2]
    assert ts["vllm:prefix_cache_queries_total"].tolist() == [0, 20, 20, 30, 30]
    assert ts["vllm:prefix_cache_hits_total"].tolist() == [0] * 5
    assert ts["vllm:time_to_first_token_seconds_sum"].tolist() == [0, 0.25, 0.25, 0.625, 0.625]
    assert ts["vllm:iteration_tokens_total_count"].tolist() == [0, 1, 2, 3, 4]


def test_openmetrics_parses_with_vllm_names(fixed_step):  # noqa: F811
    res = run_two()
    text = to_openmetrics(res.requests, res.iterations, interval_s=0.25,
                          labels={"model_name": 'meta-llama/Llama "3"'})
    assert text.endswith("# EOF\n")
    # prometheus_client's parser drops all but the first sample of a histogram series after the
    # first timestamp (its duplicate check ignores timestamps), so histograms are checked one
    # point at a time below and the gauges and counters as one exposition.
    blocks = text.removesuffix("# EOF\n").split("# HELP ")[1:]
    plain = "".join("# HELP " + b for b in blocks if not b.split("\n", 2)[1].endswith(" histogram"))
    fams = {f.name: f for f in parser.text_string_to_metric_families(plain + "# EOF\n")}
    assert set(fams) == {"vllm:num_requests_running", "vllm:num_requests_waiting",
                         "vllm:kv_cache_usage_perc", "vllm:num_preemptions", "vllm:prompt_tokens",
                         "vllm:generation_tokens", "vllm:request_success",
                         "vllm:prefix_cache_queries", "vllm:prefix_cache_hits"}
    run_fam = fams["vllm:num_requests_running"]
    assert run_fam.type == "gauge"
    assert [(float(s.timestamp), s.value) for s in run_fam.samples] == [
        (0.0, 0), (0.25, 1), (0.5, 1), (0.75, 1), (1.0, 0)]
    assert run_fam.samples[0].labels == {"model_name": 'meta-llama/Llama "3"'}
    gen = fams["vllm:generation_tokens"]
    assert gen.type == "counter" and [s.name for s in gen.samples] == ["vllm:generation_tokens_total"] * 5
    assert [s.value for s in gen.samples] == [0, 1, 2, 4, 5]
    hist = [b for b in blocks if b.split("\n", 2)[1].endswith(" histogram")]
    assert len(hist) == 4
    for b in hist:
        lines = ("# HELP " + b).strip().split("\n")
        meta = [line for line in lines if line.startswith("#")]
        samples = [line for line in lines if not line.startswith("#")]
        stamps = [float(line.rsplit(" ", 1)[1]) for line in samples]
        assert stamps == sorted(stamps)  # each point's samples contiguous, points time-ordered
        for t in sorted(set(stamps)):
            point = [line for line, ts in zip(samples, stamps) if ts == t]
            (fam,) = parser.text_string_to_metric_families("\n".join(meta + point + ["# EOF", ""]))
            assert fam.type == "histogram" and fam.samples[-2].name.endswith("_count")
    ttft_last = [line for line in text.splitlines()
                 if line.startswith("vllm:time_to_first_token_seconds_count")][-1]
    assert ttft_last.endswith(" 2 1.000")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_imports_the_export(fixed_step, tmp_path):  # noqa: F811
    res = run_two()
    path = tmp_path / "openmetrics.txt"
    path.write_text(to_openmetrics(res.requests, res.iterations, interval_s=0.25,
                                   labels={"model_name": "m"}))
    out = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(path),
                          str(tmp_path / "tsdb")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # 3 gauges + 6 counters + 4 histograms x (buckets + +Inf + count + sum), 5 samples each
    num_series = 9 + (22 + 3) + 2 * (21 + 3) + (13 + 3)
    row = [line for line in out.stdout.splitlines() if line[:1].isalnum() and "BLOCK" not in line]
    assert row and row[0].split()[-4:-1] == [str(5 * num_series), str(num_series), str(num_series)]


def _counter_reference(times, increments, grid):
    """_counter as one whole-length cumulative sum (its definition)."""
    if len(times) > 1 and not (times[1:] >= times[:-1]).all():
        order = np.argsort(times, kind="stable")
        times, increments = times[order], increments[order]
    cum = np.zeros(len(increments) + 1)
    np.cumsum(increments, dtype=np.float64, out=cum[1:])
    return cum[np.searchsorted(times, grid, side="right")]


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
@pytest.mark.parametrize("kind", ["int16", "float", "bool", "unsorted", "empty", "late"])
def test_counter_by_blocks_is_one_cumulative_sum(monkeypatch, block, kind):
    """The running total made a block at a time gives the bits of one np.cumsum over it all."""
    from simulator.metrics import timeseries as ts

    monkeypatch.setattr(ts, "_BLOCK", block)
    rng = np.random.default_rng(block)
    n = 0 if kind == "empty" else 500
    times = np.sort(rng.random(n) * 50) + (30 if kind == "late" else 0)
    inc = {"int16": rng.integers(0, 300, n).astype(np.int16), "bool": rng.random(n) < 0.3}.get(
        kind, rng.random(n) * 1e3)
    if kind == "unsorted":
        times = rng.random(n) * 50
    grid = np.arange(0, 81, 0.5)
    for g in (grid, grid[::-1]):
        got, want = ts._counter(times, inc, g), _counter_reference(times, inc, g)
        assert got.dtype == want.dtype and np.array_equal(got.view(np.int64), want.view(np.int64))


def test_gauge_at_is_gauge_at():
    """sample's gauges read at the grid first: the values gauge(...).at(grid) gives."""
    from simulator.metrics.steps import StepColumns
    from simulator.metrics.timeseries import _gauge_at, gauge

    rng = np.random.default_rng(5)
    ends = np.sort(rng.random(300) * 40) + 1
    table = np.array([0.0, 0.125, 0.5, 0.75])
    steps = StepColumns(ends, {"num_running": rng.integers(0, 9, 300).astype(np.int8)},
                        {"kv_usage": (rng.integers(0, 4, 300).astype(np.uint16), table)})
    grid = np.arange(0, 45, 0.25)
    for col in ("num_running", "kv_usage"):
        got, want = _gauge_at(steps, col, grid), gauge(steps, col).at(grid)
        assert got.dtype == want.dtype == np.float64 and np.array_equal(got, want)
    empty = StepColumns(np.zeros(0), {"num_running": np.zeros(0)})
    assert np.array_equal(_gauge_at(empty, "num_running", grid), gauge(empty, "num_running").at(grid))


def _bucket_counts_reference(times, values, bounds, grid):
    """_bucket_counts by one binary search per event (its first version)."""
    if len(times) > 1 and not (times[1:] >= times[:-1]).all():
        order = np.argsort(times, kind="stable")
        times, values = times[order], values[order]
    pos = np.searchsorted(times, grid, side="right")
    edges = np.asarray(bounds, dtype=np.float64)
    width = len(edges) + 1
    hist = np.zeros((len(grid) + 1) * width, np.int64)
    if len(pos) and pos[-1]:
        first = np.searchsorted(pos, np.arange(int(pos[-1])), side="right")
        bucket = np.searchsorted(edges, values[:int(pos[-1])], side="left")
        hist += np.bincount(first * width + bucket, minlength=len(hist))
    counts = np.cumsum(np.cumsum(hist.reshape(len(grid) + 1, width), axis=0), axis=1)[:-1]
    return [counts[:, j].astype(np.float64) for j in range(width)]


@pytest.mark.parametrize("block", [7, 1 << 20])
@pytest.mark.parametrize("kind", ["int16", "negative", "float", "nan", "unsorted"])
def test_bucket_counts_is_one_search_per_event(monkeypatch, block, kind):
    from simulator.metrics import timeseries as ts

    monkeypatch.setattr(ts, "_EVENT_BLOCK", block)
    rng = np.random.default_rng(block)
    n = 400
    times = rng.random(n) * 30 if kind == "unsorted" else np.sort(rng.random(n) * 30)
    values = {"int16": rng.integers(0, 300, n).astype(np.int16),
              "negative": rng.integers(-50, 50, n)}.get(kind, rng.random(n) * 3)
    if kind == "nan":
        values[::7] = np.nan
    bounds = (1, 8, 16, 32, 64, 128) if kind in ("int16", "negative") else (0.1, 0.5, 1.0, 2.5)
    grid = np.arange(0, 35, 0.5)
    for g in (grid, grid[::-1]):
        got = ts._bucket_counts(times, values, bounds, g)
        want = _bucket_counts_reference(times, values, bounds, g)
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
