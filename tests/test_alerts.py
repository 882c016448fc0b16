"""Alert rules: exact firings on hand-built step functions, the rolling preemption rate,
YAML validation, and the seed's three alerts on an overloaded vs a lightly loaded replica."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from simulator.config.schema import build_config
from simulator.engine.run import run
from simulator.errors import ConfigError
from simulator.metrics.alerts import (
    DEFAULT_RULES,
    AlertRule,
    evaluate,
    firings,
    preemption_rate,
    resolve_rules,
)
from simulator.metrics.timeseries import StepFunction


def frames(usage, waiting=None, preempted=None, finishes=(), step_s=1.0):
    """Steps of step_s seconds from t=0 with the given post-step gauges; one request arriving
    at 0 per finish time (finished then) so that the run window is [0, n * step_s]."""
    n = len(usage)
    iters = pd.DataFrame({
        "start_s": np.arange(n) * step_s, "duration_s": np.full(n, step_s),
        "kv_usage": np.asarray(usage, float),
        "num_waiting": np.asarray(waiting if waiting is not None else np.zeros(n), float),
        "num_running": np.zeros(n), "num_preempted": np.asarray(
            preempted if preempted is not None else np.zeros(n), np.int64)})
    reqs = pd.DataFrame({"arrival_s": np.zeros(max(len(finishes), 1)),
                         "finish_s": np.asarray(list(finishes) or [np.nan], float),
                         "status": ["finished"] * len(finishes) or ["rejected"]})
    return reqs, iters


def as_tuples(fired):
    return [(f.rule, f.start_s, f.end_s, f.peak, f.peak_s, f.resolved) for f in fired]


def test_kv_usage_firings_exact():
    # usage after steps ending at 1..6: .5 .9 .95 .8 .9 .1 -> above .85 over [2, 4) and [5, 6)
    reqs, iters = frames([0.5, 0.9, 0.95, 0.8, 0.9, 0.1])
    rules = resolve_rules({})
    fired = evaluate([r for r in rules if r.name == "kv_usage_high"], reqs, iters)
    assert as_tuples(fired) == [("kv_usage_high", 2.0, 4.0, 0.95, 3.0, True),
                                ("kv_usage_high", 5.0, 6.0, 0.9, 5.0, True)]
    # sustained 1.5 s: only [2, 4) lasts longer; it fires from 3.5, where the peak is .95
    long = [AlertRule("kv", "kv_usage", 0.85, for_s=1.5)]
    assert as_tuples(evaluate(long, reqs, iters)) == [("kv", 3.5, 4.0, 0.95, 3.5, True)]
    # exactly as long as for_s: never fires
    assert evaluate([AlertRule("kv", "kv_usage", 0.85, for_s=2.0)], reqs, iters) == []


def test_firing_still_open_at_end_is_unresolved():
    fn = StepFunction(np.array([1.0, 2.0]), np.array([5.0, 20.0]))
    fired = firings(AlertRule("p", "pending", 10, for_s=0.5), fn, 0.0, 3.0)
    assert as_tuples(fired) == [("p", 2.5, 3.0, 20.0, 2.5, False)]


def test_pending_sustained_window():
    # waiting 12 over [1, 7) except a dip to 3 over [3, 4): episodes of 2 s and 3 s
    reqs, iters = frames(np.zeros(8), waiting=[12, 12, 3, 12, 12, 15, 0, 0])
    rule = AlertRule("pending_high", "pending", 10, for_s=2.5)
    assert as_tuples(evaluate([rule], reqs, iters)) == [("pending_high", 6.5, 7.0, 15.0, 6.5, True)]


def test_preemption_rate_window_exact():
    # one preemption in the step ending at 2; finishes at 1, 3, 4; window 10 s:
    # t:     [1,2) [2,3) [3,4) [4,11) [11,12) [12,13) [13,14) [14,...)
    # P/(P+F): 0    1/2   1/3   1/4    1/3      0       0       0
    reqs, iters = frames(np.zeros(20), preempted=[0, 1] + [0] * 18, finishes=(1.0, 3.0, 4.0))
    fn = preemption_rate(reqs, iters, 10.0)
    t = np.array([0.5, 1, 2, 3, 4, 10.9, 11, 12, 13.5, 19])
    assert fn.at(t).tolist() == [0, 0, 1 / 2, 1 / 3, 1 / 4, 1 / 4, 1 / 3, 0, 0, 0]
    fired = evaluate([AlertRule("pr", "preemption_rate", 0.05, window_s=10.0)], reqs, iters)
    assert as_tuples(fired) == [("pr", 2.0, 12.0, 0.5, 2.0, True)]


def test_rule_config_overrides_and_validation():
    rules = {r.name: r for r in resolve_rules({"pending_high": {"for_s": 30},
                                               "kv_usage_high": {"enabled": False},
                                               "busy": {"signal": "running", "threshold": 200}})}
    assert set(rules) == {"pending_high", "preemption_rate_high", "busy"}
    assert rules["pending_high"] == AlertRule("pending_high", "pending", 10.0, for_s=30.0,
                                              window_s=10.0)
    assert rules["busy"].describe() == "running > 200"
    assert DEFAULT_RULES["kv_usage_high"]["threshold"] == 0.85  # the defaults were not mutated
    with pytest.raises(ConfigError, match=r"alerts.pending_high: unknown key 'for'.*did you mean"):
        resolve_rules({"pending_high": {"for": 30}})
    with pytest.raises(ConfigError, match=r"alerts.kv_usage_high.threshold must be a number >= 0, got -1"):
        resolve_rules({"kv_usage_high": {"threshold": -1}})
    with pytest.raises(ConfigError, match=r"alerts.preemption_rate_high.window_s must be a number > 0"):
        resolve_rules({"preemption_rate_high": {"window_s": 0}})
    with pytest.raises(ConfigError, match=r"alerts.kv_usge_high: a new rule needs a signal.*did you mean"):
        resolve_rules({"kv_usge_high": {"threshold": 0.9}})
    with pytest.raises(ConfigError, match=r"alerts.x.signal must be one of .*got 'queue'"):
        resolve_rules({"x": {"signal": "queue", "threshold": 1}})
    with pytest.raises(ConfigError, match="alerts.pending_high.enabled must be true or false"):
        build_config(None, ["alerts.pending_high.enabled=maybe"])
    cfg = build_config(None, ["alerts.pending_high.for_s=12"])
    assert resolve_rules(cfg.alerts)[1].for_s == 12.0


# An L4 serving Llama-2-7B holds ~12k KV tokens and decodes ~one step per 56 ms: 30 req/s
# of ShareGPT-like requests is far beyond what it can serve, 0.5 req/s is easy.
L4 = {"gpu": "l4", "model": "llama-2-7b", "engine.max_model_len": 2048}


def test_overload_fires_the_three_seed_alerts():
    s = run(build_config(None, ["workload.arrival.rate=30", "workload.num_requests=80"], L4)).summary
    a = s["alerts"]
    assert a["fired"] == ["kv_usage_high", "pending_high", "preemption_rate_high"]
    assert a["rules"]["kv_usage_high"]["peak"] > 0.85
    assert a["rules"]["pending_high"]["peak"] > 10
    assert a["rules"]["pending_high"]["first_start_s"] >= 5.0  # sustained 5 s first
    assert a["rules"]["preemption_rate_high"]["peak"] > 0.05
    assert s["preemptions"]["total"] > 0 and s["queue"]["pending_max"] > 10


def test_low_load_fires_nothing():
    s = run(build_config(None, ["workload.arrival.rate=0.5", "workload.num_requests=20"], L4)).summary
    assert s["alerts"]["fired"] == []
    assert all(not r["fired"] and r["num_firings"] == 0 for r in s["alerts"]["rules"].values())
    assert s["kv_cache"]["usage_max"] < 0.85 and s["preemptions"]["total"] == 0
