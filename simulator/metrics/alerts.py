"""Alert rules over a run's signals, evaluated exactly in simulated time.

A rule watches one signal, a step function of time (timeseries.py), and its condition is
`signal > threshold`. Like a Prometheus rule with `for:`, a rule fires once the condition has
held for `for_s` seconds without a break: a firing runs from (condition start + for_s) to the
moment the condition stops holding (or the end of the run), and reports the peak signal value
seen while firing. Conditions that hold for exactly for_s or less never fire.

Signals:
- kv_usage          vllm:kv_cache_usage_perc (fraction of the pool in use, 0..1)
- pending           vllm:num_requests_waiting
- running           vllm:num_requests_running
- preemption_rate   preemptions / (preemptions + finished requests) in the trailing window_s
                    seconds: of the requests leaving the running batch, the share that were
                    preempted rather than finished (0 when neither happened). In PromQL:
                    increase(vllm:num_preemptions_total[W]) / (increase(vllm:num_preemptions_total[W])
                    + increase(vllm:request_success_total[W])).

The seed's defaults are DEFAULT_RULES; YAML `alerts:` overrides fields of a rule by name,
disables one with `enabled: false`, or adds a rule with its own `signal`. The rules are typed
and validated in the config (config/sections.py: AlertsConfig); this module evaluates them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from simulator.config.sections import DEFAULT_RULES, RULE_KEYS, SIGNALS, AlertsConfig  # noqa: F401 (re-exported)
from simulator.errors import ConfigError
from simulator.metrics.steps import as_steps, distinct
from simulator.metrics.table import column
from simulator.metrics.timeseries import Iterations, Requests, StepFunction, gauge, run_window


@dataclass(frozen=True, slots=True)
class AlertRule:
    name: str
    signal: str
    threshold: float
    for_s: float = 0.0
    window_s: float = 10.0  # preemption_rate only

    def describe(self) -> str:
        s = f"{self.signal} > {self.threshold:g}"
        if self.signal == "preemption_rate":
            s += f" over {self.window_s:g} s"
        if self.for_s:
            s += f" for {self.for_s:g} s"
        return s


@dataclass(frozen=True, slots=True)
class Firing:
    rule: str
    signal: str
    threshold: float
    start_s: float
    end_s: float
    peak: float
    peak_s: float  # first time the peak was reached
    resolved: bool  # False: still firing when the run ended

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["duration_s"] = self.duration_s
        return d


def resolve_rules(spec: AlertsConfig | dict[str, Any] | None) -> list[AlertRule]:
    """The enabled rules of the `alerts:` section (config/sections.py: the defaults overlaid
    with the YAML's rules, validated there). Order: defaults first, then added rules, each
    group in the order written. `spec`: the config's section, or raw YAML data."""
    alerts = AlertsConfig.from_section(spec)
    return [AlertRule(name=name, signal=r.signal, threshold=float(r.threshold),
                      for_s=float(r.for_s), window_s=float(r.window_s))
            for name, r in alerts.items() if r.enabled]


def preemption_rate(requests: Requests, iterations: Iterations, window_s: float) -> StepFunction:
    """preemptions / (preemptions + finishes) in (t - window_s, t], exact: the ratio only changes
    when an event enters the window (its time) or leaves it (its time + window_s)."""
    steps = as_steps(iterations)
    preempted = steps["num_preempted"]
    keep = np.flatnonzero(preempted > 0)
    p_t, p_inc = steps.ends[keep], preempted[keep].astype(np.float64)
    f_t = np.sort(column(requests, "finish_s")[column(requests, "status") == "finished"]
                  .astype(np.float64, copy=False))
    p_cum = np.concatenate([[0.0], np.cumsum(p_inc)])
    change = distinct(np.concatenate([p_t, p_t + window_s, f_t, f_t + window_s]))

    def count_p(t: np.ndarray) -> np.ndarray:
        return p_cum[np.searchsorted(p_t, t, side="right")]

    def count_f(t: np.ndarray) -> np.ndarray:
        return np.searchsorted(f_t, t, side="right").astype(np.float64)

    p = count_p(change) - count_p(change - window_s)
    f = count_f(change) - count_f(change - window_s)
    total = p + f
    rate = np.divide(p, total, out=np.zeros_like(p), where=total > 0)
    return StepFunction(change, rate)


def signal(name: str, requests: Requests, iterations: Iterations,
           window_s: float = 10.0) -> StepFunction:
    if name == "kv_usage":
        return gauge(iterations, "kv_usage")
    if name == "pending":
        return gauge(iterations, "num_waiting")
    if name == "running":
        return gauge(iterations, "num_running")
    if name == "preemption_rate":
        return preemption_rate(requests, iterations, window_s)
    raise ConfigError(f"unknown alert signal {name!r}; valid: {', '.join(SIGNALS)}")


def firings(rule: AlertRule, fn: StepFunction, t0: float, t1: float) -> list[Firing]:
    """1. Cut [t0, t1] into the signal's constant pieces; 2. join consecutive pieces above the
    threshold into episodes [a, b); 3. an episode longer than for_s fires over [a + for_s, b),
    with the peak over that span."""
    # NOTE: StepFunction.segments less its pieces of length 0, without arrays of the pieces'
    # own: `kept` maps a kept piece to its segment (edges[s], edges[s + 1], value v[s]); the
    # edges are [t0, clip(times, t0, t1), t1], read where needed (step ends lie within the
    # window: the clip is then the times themselves, no array of them is made)
    times = fn.times
    n_times = len(times)
    if n_times and (float(times.min()) < t0 or float(times.max()) > t1):
        times = np.clip(times, t0, t1)

    def edges_at(seg: np.ndarray) -> np.ndarray:
        if not n_times:
            return np.where(seg == 0, t0, t1).astype(np.float64)
        inner = times[np.clip(seg - 1, 0, n_times - 1)]
        return np.where(seg == 0, t0, np.where(seg > n_times, t1, inner)).astype(np.float64)
    positive = np.empty(n_times + 1, bool)  # length > 0: edges[1:] > edges[:-1]
    if n_times:
        positive[0] = times[0] > t0
        np.greater(times[1:], times[:-1], out=positive[1:-1])
        positive[-1] = t1 > times[-1]
    else:
        positive[0] = t1 > t0
    # (None: every piece has a length, piece i is segment i, as in a run's step ends)
    kept = None if positive.all() else np.flatnonzero(positive)
    del positive
    above = np.zeros(len(times) + 3 if kept is None else len(kept) + 2, bool)
    if kept is None:
        above[1] = fn.initial > rule.threshold
        np.greater(fn.values, rule.threshold, out=above[2:-1])
    else:
        high = np.empty(len(times) + 1, bool)
        high[0] = fn.initial > rule.threshold
        np.greater(fn.values, rule.threshold, out=high[1:])
        above[1:-1] = high[kept]
        del high
    first_above = np.flatnonzero(~above[:-1] & above[1:])  # episode i..j: pieces above in a row
    last_above = np.flatnonzero(above[:-1] & ~above[1:]) - 1
    del above
    n = len(times) + 1 if kept is None else len(kept)

    def segments_of(i: int, j: int) -> np.ndarray:  # the segments of kept pieces i..j
        return np.arange(i, j + 1) if kept is None else kept[i:j + 1]
    end_at_t1 = float(fn.at(np.array([t1]))[0]) > rule.threshold  # value recorded at t1
    out: list[Firing] = []

    def values_of(seg: np.ndarray) -> np.ndarray:  # v[s] of segments s (v[0] = initial)
        if not len(fn.values):
            return np.full(len(seg), fn.initial, np.float64)
        return np.where(seg > 0, fn.values[np.maximum(seg - 1, 0)], fn.initial).astype(np.float64)
    for i, j in zip(first_above.tolist(), last_above.tolist()):
        segs = segments_of(i, j)
        starts = edges_at(segs)
        lengths = edges_at(segs + 1) - starts
        a, b = float(starts[0]), float(starts[-1] + lengths[-1])
        if b - a <= rule.for_s:
            continue
        start = a + rule.for_s
        if start >= b:  # b - a > for_s, but a + for_s rounds up to b: nothing left to fire
            continue
        ends = starts + lengths
        first = int(np.searchsorted(ends, start, side="right"))  # piece holding `start`
        seg = values_of(segs[first:])
        k = int(np.argmax(seg))
        # still firing at the end only if the value recorded at t1 is above the threshold
        resolved = j + 1 < n or not end_at_t1
        out.append(Firing(rule.name, rule.signal, rule.threshold, start, b, float(seg[k]),
                          max(start, float(starts[first + k])), resolved))
    return out


def evaluate(rules: list[AlertRule], requests: Requests,
             iterations: Iterations) -> list[Firing]:
    """Every firing of every rule over the run window, ordered by rule then start time.
    NOTE: kept in the steps' memo for the same rules and requests frame (the summary's alerts
    section and alerts.json come from one evaluation)."""
    iterations = as_steps(iterations)
    key = ("alerts.evaluate", tuple(rules))
    seen = iterations.memo.get(key)
    if seen is not None and seen[0] is requests:
        return list(seen[1])
    t0, t1 = run_window(requests, iterations)
    out: list[Firing] = []
    for rule in rules:
        out += firings(rule, signal(rule.signal, requests, iterations, rule.window_s), t0, t1)
    iterations.memo[key] = (requests, tuple(out))
    return out


def summarize_alerts(rules: list[AlertRule], fired: list[Firing]) -> dict[str, Any]:
    """summary.json's `alerts` section: which rules fired, how often, for how long, how high."""
    per_rule: dict[str, Any] = {}
    for rule in rules:
        mine = [f for f in fired if f.rule == rule.name]
        per_rule[rule.name] = {
            "condition": rule.describe(),
            "fired": bool(mine),
            "num_firings": len(mine),
            "firing_s": float(sum(f.duration_s for f in mine)),
            "first_start_s": mine[0].start_s if mine else None,
            "peak": max(f.peak for f in mine) if mine else None,
        }
    return {"fired": [r.name for r in rules if per_rule[r.name]["fired"]], "rules": per_rule}


def alerts_document(rules: list[AlertRule], fired: list[Firing]) -> dict[str, Any]:
    """alerts.json: the resolved rules and every firing."""
    return {"rules": [asdict(r) | {"condition": r.describe()} for r in rules],
            "firings": [f.to_dict() for f in fired]}
