"""Synthetic generators: statistics, determinism, sessions/prefix ids, tenants, config rules."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config.workload import ARRIVAL_PARAMS, LENGTH_PARAMS, WorkloadConfig
from simulator.errors import ConfigError
from simulator.workload.generators import ARRIVALS, LENGTHS, ChunkIds, RequestArrays, sample_lengths
from simulator.workload.load import generate

N = 100_000


def gen(seed=0, **kw) -> RequestArrays:
    return generate(WorkloadConfig(**kw), np.random.SeedSequence(seed))


def arrivals(spec, n=N, duration=None, seed=0):
    cfg = WorkloadConfig(arrival=spec)  # validates and fills defaults
    rng = np.random.default_rng(seed)
    return ARRIVALS.get(cfg.arrival["process"])(rng, cfg.arrival, n, duration)


def rate(t):
    return (len(t) - 1) / (t[-1] - t[0])


def cv(t):
    g = np.diff(t)
    return g.std() / g.mean()


def test_registries_match_config_schemas():
    assert ARRIVALS.names() == sorted(ARRIVAL_PARAMS)
    assert LENGTHS.names() == sorted(LENGTH_PARAMS)


# --- arrival processes reproduce their parameters (100k arrivals) ---------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_poisson_rate_and_cv(seed):
    t = gen(seed, num_requests=N, arrival={"process": "poisson", "rate": 20.0}).arrival_s
    assert len(t) == N and t[0] == 0
    assert rate(t) == pytest.approx(20.0, rel=0.02)
    assert cv(t) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("target_cv", [0.5, 2.0, 4.0])
def test_gamma_cv_and_rate(target_cv):
    for seed in (0, 1):
        t = arrivals({"process": "gamma", "rate": 8.0, "cv": target_cv}, seed=seed)
        assert cv(t) == pytest.approx(target_cv, rel=0.05)
        assert rate(t) == pytest.approx(8.0, rel=0.02 if target_cv <= 2 else 0.05)


def test_duration_bound_gives_expected_count():
    t = arrivals({"process": "gamma", "rate": 50.0, "cv": 3.0}, n=None, duration=2000.0)
    assert t[-1] < 2000.0 and len(t) == pytest.approx(100_000, rel=0.05)
    t = arrivals({"process": "poisson", "rate": 50.0}, n=None, duration=2000.0)
    assert len(t) == pytest.approx(100_000, rel=0.02)


def test_onoff_mean_rate_and_burstiness():
    spec = {"process": "onoff", "rate_on": 10.0, "rate_off": 1.0, "on_s": 5.0, "off_s": 15.0}
    t = arrivals(spec)
    assert rate(t) == pytest.approx((10 * 5 + 1 * 15) / 20, rel=0.02)
    phase = t % 20.0  # fixed periods: on during [0, 5) of every 20 s cycle
    assert np.mean(phase < 5.0) == pytest.approx(50 / 65, abs=0.01)
    assert cv(t) > 1.2
    # exponential periods: a Markov-modulated Poisson process; fewer cycles, looser bound
    t = arrivals({**spec, "periods": "exponential"}, n=400_000)
    assert rate(t) == pytest.approx(3.25, rel=0.05)


def test_diurnal_rate_and_shape():
    spec = {"process": "diurnal", "mean_rate": 20.0, "amplitude": 0.5, "period_s": 1000.0}
    t = arrivals(spec, n=None, duration=10_000.0)
    assert len(t) == pytest.approx(200_000, rel=0.02)
    first_half = np.mean((t % 1000.0) < 500.0)  # sin > 0 in the first half of each period
    expected = (0.5 + 0.5 / np.pi) / 1.0  # (P/2 + a P/pi) / P
    assert first_half == pytest.approx(expected, abs=0.005)
    t = arrivals(spec, n=N)  # count-bounded: same mean rate over whole periods
    assert len(t) == N and rate(t) == pytest.approx(20.0, rel=0.02)


def test_ramp_rate_profile():
    spec = {"process": "ramp", "start_rate": 10.0, "end_rate": 190.0, "ramp_s": 1000.0}
    t = arrivals(spec, n=None, duration=1000.0)
    assert len(t) == pytest.approx(100_000, rel=0.02)
    assert np.mean(t < 500) == pytest.approx(27_500 / 100_000, abs=0.005)
    t = arrivals(spec, n=150_000)  # past the ramp the rate stays at end_rate
    late = t[t > 1100]
    assert rate(late) == pytest.approx(190.0, rel=0.02)
    with pytest.raises(ConfigError, match="integrates to only"):
        arrivals({"process": "ramp", "start_rate": 1.0, "end_rate": 0.0, "ramp_s": 10.0}, n=1000)


# --- lengths ---------------------------------------------------------------------------------
def test_lognormal_mean_and_cv():
    for seed in (0, 1):
        w = gen(seed, num_requests=N, prompt_tokens={"dist": "lognormal", "mean": 500, "cv": 1.0},
                output_tokens={"dist": "lognormal", "mean": 120, "cv": 0.5})
        assert w.prompt_tokens.mean() == pytest.approx(500, rel=0.02)
        assert w.output_tokens.mean() == pytest.approx(120, rel=0.02)
        assert w.prompt_tokens.std() / w.prompt_tokens.mean() == pytest.approx(1.0, rel=0.05)


def test_uniform_constant_zipf_and_clipping():
    rng = np.random.default_rng(0)
    u = sample_lengths(rng, {"dist": "uniform", "low": 3, "high": 7}, N, "x")
    assert set(np.unique(u)) == {3, 4, 5, 6, 7}
    c = sample_lengths(rng, {"dist": "constant", "value": 42}, 10, "x")
    assert set(c) == {42}
    z = sample_lengths(rng, {"dist": "zipf", "s": 1.5, "low": 1, "high": 1000}, N, "x")
    k = np.arange(1, 1001, dtype=float)
    p = k ** -1.5 / np.sum(k ** -1.5)
    assert np.mean(z == 1) == pytest.approx(p[0], abs=0.005)
    assert np.mean(z == 2) == pytest.approx(p[1], abs=0.005)
    assert z.min() >= 1 and z.max() <= 1000
    clipped = sample_lengths(rng, {"dist": "lognormal", "mean": 500, "cv": 2, "min": 20, "max": 600},
                             N, "x")
    assert clipped.min() == 20 and clipped.max() == 600


def test_empirical_lengths_from_file(tmp_path):
    f = tmp_path / "lens.csv"
    f.write_text("a,b\n10,1\n20,2\n30,3\n")
    w = gen(num_requests=1000, prompt_tokens={"dist": "empirical", "file": str(f), "column": "a"},
            output_tokens={"dist": "empirical", "file": str(f), "column": "b"})
    assert set(np.unique(w.prompt_tokens)) == {10, 20, 30}
    # lengths_file keeps the (prompt, output) pairs together
    w = gen(num_requests=1000, lengths_file=str(f), prompt_column="a", output_column="b")
    assert np.array_equal(w.prompt_tokens, w.output_tokens * 10)
    with pytest.raises(ConfigError, match=r"missing column 'zz'"):
        gen(num_requests=10, prompt_tokens={"dist": "empirical", "file": str(f), "column": "zz"})


@pytest.mark.parametrize("name,text,error", [
    ("lens.jsonl", '{"a": 10, "b": 1}\n{"a": 20, "b": 2}\n', None),  # pandas reads it
    ("lens.csv", "a,b\n10,1\n20,x\n", r"row 2 \(line 3\), column 'b': 'x' is not a length >= 1"),
    ("lens.jsonl", '{"a": 10, "b": 1}\n{"a": 20, "b": null}\n',
     r"row 2 \(line 2\), column 'b': missing value \(NaN\)$"),  # (JSONL: no header line)
    ("lens.csv", "a,b\n10,1\n0,2\n", r"row 2 \(line 3\), column 'a': 0 is not a length >= 1$"),
    ("lens.csv", "a,b\n10,1\n20,2.5\n", r"line 3\), column 'b': 2.5 is not a whole number of tokens$"),
    ("lens.csv", "a,b\n10,1\n20,1e20\n", r"line 3\), column 'b': 1e\+20 is above 2,147,483,647 tokens"),
    ("lens.csv", "a,b\n", r"lens.csv: no rows"),
])
def test_lengths_file_through_pyarrow_or_pandas(tmp_path, name, text, error):
    """A lengths file is read once into numpy columns (pyarrow for a plain numeric CSV, else
    pandas); either way a cell that is not a length >= 1 is named by row, line and value."""
    f = tmp_path / name
    f.write_text(text)
    kw = {"num_requests": 100, "lengths_file": str(f), "prompt_column": "a", "output_column": "b"}
    if error is None:
        w = gen(**kw)
        assert np.array_equal(w.prompt_tokens, w.output_tokens * 10) and w.prompt_tokens.dtype == np.int64
    else:
        with pytest.raises(ConfigError, match=error):
            gen(**kw)


# --- determinism and scale -------------------------------------------------------------------
def test_deterministic_per_seed():
    kw = {"num_requests": 2000, "arrival": {"process": "gamma", "rate": 5.0, "cv": 2.0},
          "sessions": {"turns": {"dist": "uniform", "low": 1, "high": 5},
                       "think_time_s": {"dist": "lognormal", "mean": 10, "cv": 1}},
          "system_prompts": {"count": 5, "tokens": {"dist": "constant", "value": 1500}}}
    a, b, c = gen(7, **kw), gen(7, **kw), gen(8, **kw)
    for col in ("arrival_s", "prompt_tokens", "output_tokens", "session_id", "turn"):
        assert np.array_equal(getattr(a, col), getattr(b, col))
    assert np.array_equal(a.prefix.flat, b.prefix.flat)
    assert not np.array_equal(a.arrival_s, c.arrival_s)


def test_default_workload_unchanged_golden():
    """The built-in default (Poisson 20 req/s, ShareGPT-like lognormal lengths) keeps the
    random streams of the first version: these values were produced by it (seed 0)."""
    w = gen(0)
    assert len(w) == 1000 and w.prefix is None and w.tenant is None
    np.testing.assert_allclose(w.arrival_s[:4], [0.0, 0.03815653690749246, 0.10077489303826218,
                                                 0.1120723678785836], rtol=1e-12)
    assert w.arrival_s[-1] == pytest.approx(48.43145706770773, rel=1e-12)
    assert list(w.prompt_tokens[:6]) == [223, 23, 6, 248, 335, 85]
    assert list(w.output_tokens[:6]) == [524, 134, 897, 530, 49, 526]


def test_million_requests_are_columns_not_objects():
    w = gen(num_requests=1_000_000, arrival={"process": "poisson", "rate": 100.0})
    assert len(w) == 1_000_000
    for col in (w.arrival_s, w.prompt_tokens, w.output_tokens, w.priority):
        assert isinstance(col, np.ndarray) and col.dtype != object


# --- sessions, system prompts and prefix ids --------------------------------------------------
SESSIONS = {"turns": {"dist": "uniform", "low": 2, "high": 6},
            "think_time_s": {"dist": "lognormal", "mean": 20, "cv": 1.0}}


def test_sessions_grow_history_and_share_prefix_ids():
    w = gen(3, duration_s=600, arrival={"process": "poisson", "rate": 0.5}, sessions=SESSIONS,
            prefix_block_tokens=64)
    assert w.prefix is not None and w.prefix_block_tokens == 64
    checked = 0
    for sid in np.unique(w.session_id)[:60]:
        rows = np.flatnonzero(w.session_id == sid)
        assert list(w.turn[rows]) == list(range(len(rows)))  # turns arrive in order
        assert np.all(np.diff(w.arrival_s[rows]) > 0)
        for prev, cur in zip(rows[:-1], rows[1:]):
            # prompt_k = prompt_{k-1} + output_{k-1} + new tokens (>= 1)
            assert w.prompt_tokens[cur] >= w.prompt_tokens[prev] + w.output_tokens[prev] + 1
            ids_prev, ids_cur = w.prefix[prev], w.prefix[cur]
            assert np.array_equal(ids_cur[:len(ids_prev)], ids_prev)  # history shared
            checked += 1
        for i in rows:  # ids describe prompt + answer (the next turn resends the answer)
            assert len(w.prefix[i]) == -(-(w.prompt_tokens[i] + w.output_tokens[i]) // 64)
    assert checked > 50
    # different sessions share nothing without system prompts
    a, b = np.flatnonzero(w.session_id == 0)[0], np.flatnonzero(w.session_id == 1)[0]
    assert not set(w.prefix[a]) & set(w.prefix[b])


def test_system_prompts_shared_with_zipf_popularity():
    w = gen(1, num_requests=20_000, arrival={"process": "poisson", "rate": 50.0},
            system_prompts={"count": 10, "zipf_s": 1.0, "tokens": {"dist": "constant", "value": 1100}},
            prompt_tokens={"dist": "constant", "value": 200})
    assert set(w.prompt_tokens) == {1300}
    first = np.array([w.prefix[i][0] for i in range(len(w))])
    second = np.array([w.prefix[i][1] for i in range(len(w))])
    third = np.array([w.prefix[i][2] for i in range(len(w))])
    # 1100 tokens = 2 full chunks of 512 shared; the straddling third chunk is per request
    assert len(np.unique(first)) == 10 and len(np.unique(second)) == 10
    assert len(np.unique(third)) == len(w)
    _, counts = np.unique(first, return_counts=True)
    share = np.sort(counts)[::-1] / len(w)
    h = np.sum(1.0 / np.arange(1, 11))
    assert share[0] == pytest.approx(1 / h, abs=0.015) and share[1] == pytest.approx(0.5 / h, abs=0.015)


def test_chunk_ids_take_truncate_concat():
    ids = ChunkIds.from_lists([[1, 2, 3], [1, 2], [9]])
    assert [list(x) for x in ids.take(np.array([2, 0]))] == [[9], [1, 2, 3]]
    assert [list(x) for x in ids.truncate(np.array([1, 5, 0]))] == [[1], [1, 2], []]
    both = ChunkIds.concat([ids, ChunkIds.from_lists([[1], [1, 2]])])
    assert len(both) == 5 and list(both[0]) == [0, 1, 2] and list(both[3]) == [9]
    assert not set(both.flat[:6]) & set(both.flat[6:])  # parts never share ids
    assert list(ids[-1]) == [9] and len(ids[0:2]) == 2


# --- tenants ---------------------------------------------------------------------------------
def test_tenant_mixture_rates_and_columns():
    tenants = [
        {"name": "a", "arrival": {"process": "poisson", "rate": 6.0}, "priority": 0, "tier": "premium",
         "slo_ttft_s": 1.0, "slo_tpot_s": 0.05, "sessions": SESSIONS},
        {"name": "b", "arrival": {"process": "gamma", "rate": 2.0, "cv": 3.0}, "priority": 2,
         "tier": "batch", "prompt_tokens": {"dist": "constant", "value": 3000}},
    ]
    w = gen(0, duration_s=5000, tenants=tenants)
    a, b = w.tenant == "a", w.tenant == "b"
    assert a.sum() + b.sum() == len(w)
    assert b.sum() / 5000 == pytest.approx(2.0, rel=0.05)
    assert set(w.priority[a]) == {0} and set(w.priority[b]) == {2}
    assert set(w.tier[b]) == {"batch"} and np.all(np.isnan(w.slo_ttft_s[b]))
    assert set(w.slo_ttft_s[a]) == {1.0} and set(w.slo_tpot_s[a]) == {0.05}
    assert set(w.prompt_tokens[b]) == {3000}
    assert np.all(w.session_id[b] == -1) and np.all(w.session_id[a] >= 0)
    ia, ib = np.flatnonzero(a)[0], np.flatnonzero(b)[0]
    assert not set(w.prefix[ia]) & set(w.prefix[ib])
    n = gen(0, num_requests=500, tenants=tenants)
    assert len(n) == 500 and n.arrival_s[0] == 0


# --- config rules ----------------------------------------------------------------------------
@pytest.mark.parametrize("kw, pattern", [
    ({"arrival": {"process": "gamma", "rate": 5}}, r"workload.arrival: missing 'cv'"),
    ({"arrival": {"process": "gama", "rate": 5}},
     r"unknown arrival process 'gama' \(did you mean 'gamma'\?\)"),
    ({"arrival": {"process": "poisson", "rate": -1}}, r"workload.arrival.rate must be > 0, got -1"),
    ({"arrival": {"process": "poisson", "rat": 1}}, r"unknown key 'rat' \(did you mean 'rate'\?\)"),
    ({"arrival": {"process": "diurnal", "mean_rate": 1, "amplitude": 1.5}}, r"amplitude must be in \[0, 1\]"),
    ({"prompt_tokens": {"dist": "lognorm", "mean": 5, "cv": 1}}, r"unknown length distribution 'lognorm'"),
    ({"prompt_tokens": {"dist": "uniform", "low": 9, "high": 3}}, r"uniform high \(3\) < low \(9\)"),
    ({"output_tokens": {"dist": "lognormal", "mean": 5, "cv": 1, "max": 2, "min": 4}},
     r"max \(2\) < min \(4\)"),
    ({"sessions": {"turns": {"dist": "constant", "value": 3}}}, r"workload.sessions: missing 'think_time_s'"),
    ({"tenants": [{"name": "x"}, {"name": "x"}]}, r"duplicate tenant name"),
    ({"tenants": [{"nme": "x"}]}, r"tenants\[0\]: unknown key 'nme' \(did you mean 'name'\?\)"),
    ({"tenants": []}, r"workload.tenants must be a non-empty list"),
    ({"speedup": 2.0, "target_rate": 5.0}, r"set speedup .* or target_rate .*, not both"),
    ({"filter": {"Model": "x"}}, r"workload.filter applies to traces only"),
    ({"timestamp_unit": "days"}, r"timestamp_unit must be one of"),
    ({"on_unsorted": "ignore"}, r"on_unsorted must be one of sort, error"),
    ({"max_model_len": 1}, r"max_model_len must be >= 2"),
    ({"num_requests": 0}, r"num_requests must be a positive integer, got 0"),
    ({"trace": "x.csv", "columns": {"prompt_tokens": "a"}}, r"columns: missing 'output_tokens'"),
    ({"trace": "x.csv", "columns": {"prompt": "a"}}, r"unknown field 'prompt'"),
])
def test_config_errors_name_field_and_value(kw, pattern):
    with pytest.raises(ConfigError, match=pattern):
        WorkloadConfig(**kw)


def test_config_defaults_filled_and_bounds():
    cfg = WorkloadConfig(arrival={"process": "diurnal", "mean_rate": 3, "amplitude": 0.5})
    assert cfg.arrival["period_s"] == 86400.0 and cfg.arrival["phase_s"] == 0.0
    assert WorkloadConfig().num_requests == 1000  # synthetic default
    assert WorkloadConfig(duration_s=5).num_requests is None
    assert WorkloadConfig(trace="x.csv").num_requests is None  # a trace is replayed whole
    t = WorkloadConfig(tenants=[{"name": "a"}])
    assert t.tenants[0]["arrival"] == {"process": "poisson", "rate": 20.0}  # inherited


def test_clipping_a_session_workload_cuts_ids_of_clipped_requests_only():
    full = gen(5, duration_s=900, arrival={"process": "poisson", "rate": 0.5}, sessions=SESSIONS)
    w = gen(5, duration_s=900, arrival={"process": "poisson", "rate": 0.5}, sessions=SESSIONS,
            max_model_len=1500)
    clipped = (w.prompt_tokens != full.prompt_tokens) | (w.output_tokens != full.output_tokens)
    assert 0 < clipped.sum() == w.info["clipped_to_max_model_len"] < len(w)
    assert (w.prompt_tokens + w.output_tokens).max() <= 1500
    for i in range(len(w)):
        n = w.prompt_tokens[i] + (0 if clipped[i] else w.output_tokens[i])
        assert len(w.prefix[i]) == -(-n // 512)
        assert np.array_equal(w.prefix[i], full.prefix[i][:len(w.prefix[i])])
