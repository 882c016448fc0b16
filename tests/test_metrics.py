"""Hand-built scenarios whose every metric is computed by hand below.

Scenario (fixed step time 0.25 s, so all times are exact binary fractions; block_size 16):
  r0 arrives 0.000, prompt 20, output 3;  r1 arrives 0.375, prompt 10, output 2.

  step  time        scheduled            after the step (what the gauges show)
  1     0.00-0.25   r0 prefill 20        r0 first token; running 1, waiting 0; 2 blocks, 20 stored
  2     0.25-0.50   r0 decode 1          r1 arrived at .375: running 1, waiting 1; 2 blocks, 21 stored
  3     0.50-0.75   r0 decode, r1 pf 10  r0 finishes, frees; r1 first token; running 1; 1 block, 10 stored
  4     0.75-1.00   r1 decode 1          r1 finishes; everything 0

Gauges hold their post-step value until the next step ends (0 before the first):
  [0, .25) 0   [.25, .5) 32 slots / 20 stored / 0 waiting   [.5, .75) 32 / 21 / 1   [.75, 1) 16 / 10 / 0
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config.schema import build_config
from simulator.engine.costmodel import CostModel
from simulator.engine.run import run
from simulator.errors import ConfigError
from simulator.metrics.recorder import MetricsRecorder, StepRecord
from simulator.metrics.summary import histogram, resolve_slo
from simulator.workload.generators import RequestArrays

STEP_S = 0.25


def two_requests() -> RequestArrays:
    return RequestArrays(np.array([0.0, 0.375]), np.array([20, 10], np.int64),
                         np.array([3, 2], np.int64), np.zeros(2, np.int64))


@pytest.fixture
def fixed_step(monkeypatch):
    monkeypatch.setattr(CostModel, "step_time", lambda self, shape: STEP_S)


def run_two(**extra):
    # the step table above is synchronous scheduling's (async: tests/test_scheduler_async.py)
    extra = {"slo": {"ttft_s": 0.3, "tpot_s": 0.25}, "engine.async_scheduling": False, **extra}
    return run(build_config(None, [], extra), two_requests())


def test_latency_throughput_and_slo_by_hand(fixed_step):
    s = run_two().summary
    # r0: TTFT .25, TPOT (.75-.25)/2 = .25, E2E .75, queue 0
    # r1: TTFT .75-.375 = .375, TPOT .25, E2E 1.0-.375 = .625, queue .5-.375 = .125
    lat = s["latency_s"]
    assert lat["ttft"] == {"mean": 0.3125, "p50": 0.3125, "p90": 0.25 + 0.9 * 0.125,
                           "p99": 0.25 + 0.99 * 0.125, "max": 0.375}
    assert lat["tpot"] == {"mean": 0.25, "p50": 0.25, "p90": 0.25, "p99": 0.25, "max": 0.25}
    assert lat["itl"] == {"mean": 0.25, "p50": 0.25, "p90": 0.25, "p99": 0.25, "max": 0.25}
    assert lat["e2e"]["mean"] == 0.6875 and lat["e2e"]["max"] == 0.75
    assert lat["queue"]["mean"] == 0.0625 and lat["queue"]["max"] == 0.125
    assert s["window"] == {"start_s": 0.0, "end_s": 1.0} and s["makespan_s"] == 1.0
    assert s["busy_s"] == 1.0
    assert s["throughput"] == {"requests_per_s": 2.0, "input_tokens_per_s": 30.0,
                               "output_tokens_per_s": 5.0}
    # SLO ttft <= .3 and tpot <= .25: r0 meets both, r1 misses TTFT (.375)
    assert s["slo"] == {"ttft_s": 0.3, "tpot_s": 0.25, "met": 1, "share": 0.5,
                        "goodput_requests_per_s": 1.0}


def test_gauges_fragmentation_and_batches_by_hand(fixed_step):
    s = run_two().summary
    blocks = s["kv_cache"]["total_slots"] // 16  # vLLM: usage = used blocks / usable blocks
    kv = s["kv_cache"]
    # used slots: 32, 32, 16 over three quarter-seconds -> (32 + 32 + 16) / 4 = 20
    assert kv["used_slots_mean"] == 20.0
    assert kv["usage_mean"] == pytest.approx((2 + 2 + 1) * 0.25 / blocks, rel=1e-12)
    assert kv["usage_p95"] == kv["usage_max"] == pytest.approx(2 / blocks, rel=1e-12)
    # waiting is 1 only over [.5, .75): mean .25; at or below 0 for 75 % of the time -> p95 = 1
    assert s["queue"] == {"pending_mean": 0.25, "pending_p95": 1.0, "pending_max": 1.0,
                          "running_mean": 0.75}
    # internal = allocated - stored = 12, 11, 6 -> mean (12 + 11 + 6) / 4 = 7.25;
    # share of allocated 7.25 / 20; token states (20 + 21 + 10) / 4 / 20 = .6375; paged: no external
    assert s["fragmentation"] == {"internal_slots_mean": 7.25, "internal_slots_max": 12.0,
                                  "internal_share_of_allocated": 0.3625, "external_slots_mean": 0.0,
                                  "token_state_share": 0.6375,
                                  "token_state_share_of_allocated": 0.6375}
    # batches: seqs 1, 1, 2, 1; tokens 20, 1, 11, 1
    b = s["batch"]
    assert b["num_iterations"] == 4 and b["max_running"] == 1
    assert b["num_seqs"]["mean"] == 1.25 and b["num_seqs"]["p50"] == 1.0
    assert b["num_seqs"]["p90"] == pytest.approx(1.7) and b["num_seqs"]["max"] == 2.0
    assert b["num_seqs"]["histogram"] == {"upper_bounds": [1, 2], "counts": [3, 1]}
    assert b["num_tokens"]["mean"] == 8.25 and b["num_tokens"]["p50"] == 6.0  # (1 + 11) / 2
    assert b["num_tokens"]["p90"] == pytest.approx(11 + 0.7 * 9)
    assert b["num_tokens"]["histogram"] == {"upper_bounds": [1, 2, 4, 8, 16, 32],
                                            "counts": [2, 0, 0, 0, 1, 1]}
    assert s["preemptions"] == {"total": 0, "per_s": 0.0, "requests_share": 0.0, "rate": 0.0}
    # prefix caching on (vLLM's default), nothing shared: every prompt token queried, none hit
    assert s["prefix_cache"] == {"queries": 30, "hits": 0, "hit_rate": 0.0, "request_hit_rate": 0.0,
                                 "prefill_tokens_saved": 0, "evictions": 0,
                                 "evicted_idle_s": {"mean": None, "p50": None, "p99": None}}
    assert s["alerts"]["fired"] == []


def test_contiguous_oracle_fragmentation_by_hand(fixed_step):
    # oracle reserves prompt + output: r0 23 slots, r1 12. Allocated 23, 23, 12; stored 20, 21, 10
    s = run_two(**{"engine.kv_allocator": "contiguous",
                   "engine.contiguous_reserve": "oracle"}).summary
    fr = s["fragmentation"]
    assert s["kv_cache"]["used_slots_mean"] == (23 + 23 + 12) / 4
    assert fr["internal_slots_mean"] == (3 + 2 + 2) / 4
    assert fr["token_state_share_of_allocated"] == pytest.approx(51 / 58, rel=1e-12)
    # external = free slots outside the largest hole: 0 while r0 [0, 23) and r1 [23, 35) are
    # placed; 23 over the last quarter-second, once r0 has left a hole below r1 -> 23 / 4
    assert fr["external_slots_mean"] == 23 / 4
    # PagedAttention Fig 2: token states / (allocated + external) = 12.75 / (14.5 + 5.75)
    assert fr["token_state_share"] == pytest.approx(51 / 81, rel=1e-12)


def test_prefix_cache_hit_rate_by_hand(fixed_step):
    # both prompts are 20 tokens whose first 16 (one block) are the same content (chunk id 7);
    # r0 computes and caches that block in step 1; r1, admitted at .5, finds it: 16 of its 20
    # tokens hit, so step 3 runs r0's decode + r1's last 4 prompt tokens.
    wl = RequestArrays(np.array([0.0, 0.375]), np.array([20, 20], np.int64),
                       np.array([3, 2], np.int64), np.zeros(2, np.int64), prefix=[[7], [7]],
                       prefix_block_tokens=16)
    res = run(build_config(None, ["engine.async_scheduling=false"]), wl)
    pc = res.summary["prefix_cache"]
    assert (pc["queries"], pc["hits"], pc["hit_rate"]) == (40, 16, 0.4)
    # per request: r1's 16 cached tokens over the two finished prompts' 40 tokens
    assert (pc["prefill_tokens_saved"], pc["request_hit_rate"], pc["evictions"]) == (16, 0.4, 0)
    assert res.requests.num_cached_tokens.tolist() == [0, 16]
    assert res.iterations.num_tokens.tolist() == [20, 1, 5, 1]


def test_alert_on_hand_built_run(fixed_step):
    # waiting > 0 holds over [.5, .75); sustained 0.2 s -> fires over [.7, .75), peak 1
    s = run_two(alerts={"pending_high": {"threshold": 0, "for_s": 0.2}}).summary
    rule = s["alerts"]["rules"]["pending_high"]
    assert s["alerts"]["fired"] == ["pending_high"]
    assert rule["num_firings"] == 1 and rule["peak"] == 1.0
    assert rule["first_start_s"] == pytest.approx(0.7) and rule["firing_s"] == pytest.approx(0.05)


def test_optional_iteration_columns_are_used():
    rec = MetricsRecorder(total_slots=64)
    base = (0.0, 1.0, 1, 8, 8, 0, 0, 1, 1, 0, 16, 0.25, 8)
    rec.record(StepRecord(*base, prefix_queries_total=8, prefix_hits_total=0))
    rec.record(StepRecord(1.0, 1.0, 1, 8, 8, 0, 0, 1, 1, 0, 16, 0.25, 8,
                          prefix_queries_total=16, prefix_hits_total=6))
    it = rec.iterations_frame()  # running totals are stored as per-step increments
    assert it.prefix_cache_queries.tolist() == [8, 8] and it.prefix_cache_hits.tolist() == [0, 6]
    assert "num_sampled" not in it and "swap_s" not in it
    rec2 = MetricsRecorder(total_slots=64)
    rec2.record(StepRecord(*base, num_sampled=1))
    rec2.record(StepRecord(*base))
    with pytest.raises(ValueError, match="num_sampled is missing on 1 of 2 steps"):
        rec2.iterations_frame()
    rec3 = MetricsRecorder(total_slots=64)  # the other way round: missing on the first step
    rec3.record(StepRecord(*base))
    rec3.record(StepRecord(*base, num_sampled=1))
    with pytest.raises(ValueError, match="num_sampled is missing on 1 of 2 steps"):
        rec3.iterations_frame()
    rec4 = MetricsRecorder(total_slots=64)  # a float where counts go
    rec4.record(StepRecord(*base))
    rec4.record(StepRecord(0.0, 1.0, 1.5, *base[3:]))
    with pytest.raises(ValueError, match="num_seqs got float64 values, expected integers"):
        rec4.iterations_frame()


def test_histogram_buckets():
    assert histogram(np.array([1, 2, 3, 4, 5, 9])) == {"upper_bounds": [1, 2, 4, 8, 16],
                                                       "counts": [1, 1, 2, 1, 1]}
    assert histogram(np.zeros(0)) == {"upper_bounds": [], "counts": []}


def test_slo_validation():
    assert resolve_slo(None).ttft_s == 2.0 and resolve_slo({"tpot_s": None}).tpot_s is None
    with pytest.raises(ConfigError, match=r"slo.ttft_s must be a number of seconds > 0.*-1"):
        resolve_slo({"ttft_s": -1})
    with pytest.raises(ConfigError, match="did you mean 'tpot_s'"):
        build_config(None, ["slo.tpot=0.1"])


@pytest.mark.parametrize("streamed", [False, True])
def test_recorder_scalar_columns_and_merges_match_per_step_records(monkeypatch, tmp_path, streamed):
    """Blocks of steps with constant columns as numpy scalars, narrow ints in memory, sealed
    into chunks every few steps (and streamed to parquet in row groups of 7 rows): the same
    iterations table (values and int64/float64 dtypes) as one record per step."""
    import simulator.metrics.recorder as recorder_mod
    monkeypatch.setattr(recorder_mod, "_CHUNK_ROWS", 5)
    monkeypatch.setattr(recorder_mod, "ROW_GROUP_ROWS", 7)
    a = MetricsRecorder(100)
    b = MetricsRecorder(100, iterations_path=tmp_path / "it.parquet" if streamed else None)
    rows = [StepRecord(0.1 * i, 0.1, 2, 2, 0, 2, 0, 0, 2, 1, 10 + i, 0.1 + i / 100, 8 + i, 2,
                       swap_s=0.0) for i in range(12)]
    for r in rows:
        a.record(r)
    for lo in range(0, 12, 3):
        part = rows[lo:lo + 3]
        cols = {"start_s": np.array([r.start_s for r in part]), "duration_s": np.full(3, 0.1),
                "num_seqs": np.int64(2), "num_tokens": np.int64(2), "prefill_tokens": np.int64(0),
                "decode_tokens": np.int64(2), "num_preempted": np.int64(0), "num_admitted": np.int64(0),
                "num_running": np.int64(2), "num_waiting": np.int64(1),
                "kv_used_slots": np.array([r.kv_used_slots for r in part]),
                "kv_usage": np.array([r.kv_usage for r in part]),
                "kv_tokens_stored": np.array([r.kv_tokens_stored for r in part]),
                "num_sampled": np.int64(2), "prefix_queries_total": None, "prefix_hits_total": None,
                "evictions_total": None, "swap_s": np.float64(0.0), "kv_external_frag_slots": None}
        b.record_many(cols, np.zeros(0), 0)
    fa, fb = a.iterations_frame(), b.iterations_frame()
    assert list(fa.columns) == list(fb.columns) and "swap_s" in fb
    assert (fa.dtypes == fb.dtypes).all() and fb.num_seqs.dtype == np.int64
    assert fa.equals(fb)


def test_no_iterations_and_streamed_openmetrics(tmp_path):
    from simulator.metrics.timeseries import to_openmetrics
    cfg = build_config(overrides=["workload.num_requests=30"])
    res = run(cfg)
    full = res.write(tmp_path / "full")
    assert (full / "iterations.parquet").is_file()
    assert (full / "openmetrics.txt").read_text() == to_openmetrics(
        res.requests, res.iterations, labels={"model_name": res.setup.model.name})
    (tmp_path / "full" / "iterations.parquet").write_bytes(b"stale")
    res.write(tmp_path / "full", iterations=False)
    assert not (tmp_path / "full" / "iterations.parquet").exists()


def test_summary_percentiles_are_numpys_bit_for_bit():
    """summary.percentiles (numpy's linear method written out) gives np.percentile's values,
    bits included, for any size, ties, signs and spreads."""
    from simulator.metrics.summary import PCTS, percentiles

    rng = np.random.default_rng(0)
    arrays = [np.array([3.5]), np.array([-0.0, 0.0]), np.array([1e300, -1e300, 5.0])]
    for n in [*range(1, 60), 99, 100, 101, 1000, 12345]:
        arrays += [rng.normal(0, 1, n), rng.exponential(2.0, n) * 10.0 ** rng.integers(-6, 6),
                   rng.integers(0, 5, n).astype(np.float64)]
    for x in arrays:
        got, want = percentiles(x.copy()), np.percentile(x, PCTS)
        assert [v.hex() for v in got.tolist()] == [v.hex() for v in want.tolist()], len(x)


def test_distinct_is_np_unique():
    """steps.distinct (one sort) gives np.unique's array: ints, floats, ties, NaN and signed
    zeros (left to np.unique), empty."""
    from simulator.metrics.steps import distinct

    rng = np.random.default_rng(0)
    cases = [np.zeros(0), np.array([2.0]), np.array([0.0, -0.0, 1.0]), np.array([-0.0, 0.0]),
             np.array([np.nan, 1.0, np.nan]), np.array([-0.0, -0.0, 3.0])]
    for n in (1, 2, 10, 1000, 100_000):
        cases += [rng.integers(-5, 50, n), rng.integers(0, 3, n).astype(np.int8),
                  rng.random(n).round(2), np.sort(rng.exponential(1.0, n))]
    for x in cases:
        got, want = distinct(x), np.unique(x)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), x[:5]


def test_record_row_is_step_record_fields_in_order():
    """Replica._record hands MetricsRecorder.record_row StepRecord's fields as a tuple (no record
    object a step): the recorder's row order must be StepRecord's, token_gaps apart."""
    import dataclasses

    from simulator.metrics import recorder

    fields = [f.name for f in dataclasses.fields(recorder.StepRecord)]
    assert list(recorder._NAMES) == [f for f in fields if f != "token_gaps"]
    assert fields[-1] == "token_gaps"


def test_batch_stats_from_counts_are_the_float_columns_bit_for_bit(monkeypatch):
    """The batch-size figures of an integer column taken from its value counts (no float copy,
    no partition) are those of the column as float64 (mean, p50/p90/p99, max, histogram), bits
    included: any size, ties, zeros, compact dtypes; past the exact-sum bound (lowered here),
    the float path itself."""
    import simulator.metrics.summary as summary_mod

    def by_floats(x):
        return {**summary_mod._stats(x.astype(np.float64)), "histogram": summary_mod.histogram(x)}

    def hexed(d):
        return {k: v.hex() if isinstance(v, float) else v for k, v in d.items()}
    rng = np.random.default_rng(4)
    arrays = [np.array([0], np.uint8), np.array([7], np.int64), np.array([1, 1], np.uint16)]
    for n in [*range(1, 40), 99, 100, 101, 1000, 4097]:
        for dt, hi in ((np.uint8, 3), (np.uint16, 300), (np.int32, 70_000), (np.int64, 5)):
            arrays.append(rng.integers(0, hi, n).astype(dt))
    monkeypatch.setattr(summary_mod, "_COUNT_CHUNK", 64)  # several bincount chunks
    for x in arrays:
        assert hexed(summary_mod._batch_stats(x)) == hexed(by_floats(x)), (x.dtype, len(x))
    monkeypatch.setattr(summary_mod, "_EXACT_SUM", 10)
    calls = []
    monkeypatch.setattr(summary_mod, "_counted_stats", lambda *a: calls.append(a))
    for x in arrays[-8:]:
        assert hexed(summary_mod._batch_stats(x)) == hexed(by_floats(x))
    assert not calls  # max * n >= the bound: never from the counts
    assert summary_mod._batch_stats(np.zeros(0, np.int64))["mean"] is None
