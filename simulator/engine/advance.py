"""Event-level advance: many pure-decode steps at once, identical to stepping one by one.

Between two events that can change what the scheduler decides (an arrival, an admission, a
finish, a preemption, the step whose new blocks the free queue cannot cover), every step is a
pure decode of the same running batch: each request gets one token, and the step's shape, its
duration and the KV blocks it takes are closed-form functions of the step index j:
    num_tokens = num_sampled = m,  kv_tokens = C + m (j + 1),  attn_pairs = C + m j + m
(C = sum of the computed tokens at the first step). `Scheduler.decode_run` finds how many such
steps k come before the next event, applies them in one pass and returns what the replica
records (docs/performance.md states the invariants and how k is found). A run goes in parts
(`RunPart`): a part's last step may finish requests (they leave, their blocks are freed as commit
frees them), and the next part is the same closed form over the batch left.

This module holds what the run needs besides the scheduler: the step durations over numpy
arrays (the cost model's own tables, element-wise equal to CostModel.step_time), the one
SimPy delay that lands exactly on the last step's end, and the arrivals ahead of a replica
alone (`Lookahead`), which a sync prefill-first run may admit itself (scheduling/span.py).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engine.costmodel import CostModel, StepShape


@dataclass(slots=True)
class ArrivalClock:
    """When the next arrival will be submitted (inf: none left); feed_arrivals keeps it. A
    decode run ends strictly before it, so routers and queues see every replica exactly as
    step by step. `ahead`: the arrivals a replica alone may admit itself (a span, below)."""

    next_s: float = math.inf
    ahead: Lookahead | None = None


class Lookahead:
    """The arrivals ahead of a replica alone (no router reads its state when one comes), which
    a sync prefill-first run may admit itself instead of the feed
    submitting them (scheduling/span.py: each one's prompt step and the decode steps after it
    in one pass). feed_arrivals and the span share it:
    - `next_i`: the next arrival the feed submits; a span that admits arrivals next_i..j sets
      it to j + 1, and the feed, woken at arrival next_i's time, goes on from j + 1;
    - `last_f`: the SimPy time of the last arrival submitted or admitted, from which the feed's
      next timeout lands where the step loop's would (its time as SimPy adds the delays);
    - `make(i)`: request i as the feed makes it; `accept(req)`: whether the replica would take
      it (not rejected at arrival), set by the replica."""

    __slots__ = ("times", "make", "accept", "next_i", "last_f", "traced")

    def __init__(self, times: list[float], make: Callable[[int], Any]) -> None:
        self.times = times
        self.make = make
        self.accept: Callable[[Any], bool] = _accept_all
        self.next_i = 0
        self.last_f = 0.0
        self.traced = False  # the replica keeps a step trace: spans make its rows (DecodeRun.trace_rows)


def landing(last: float, t: float) -> float:
    """The SimPy time of an arrival at `t` whose feed last woke at `last`: where its
    `env.timeout(t - last)` lands (an ulp off t at times), or `last` (no wait) if t <= last."""
    return last + (t - last) if t > last else last


def _accept_all(req: Any) -> bool:
    return True


@dataclass(slots=True)
class RunPart:
    """Consecutive steps of a decode run over the same running batch; its last step may finish
    requests (the batch is one smaller, or more, for the next part)."""

    # (a run made in one pass, DecodeRun.columns: None, None, None and its steps; the run's
    # columns and first batch hold them)
    columns: dict | None  # MetricsRecorder.record_many columns (k values, a numpy scalar, or None)
    gaps: np.ndarray | None  # the steps' token gaps, in step order (len(reqs) a step)
    reqs: list | None  # the running batch (Requests) in running order: each samples one token a step
    finished: list  # the requests its last step finished, in commit order (empty: none)
    steps: int = 0  # how many steps (a run made in one pass; else len(columns["start_s"]))


@dataclass(slots=True)
class DecodeRun:
    """k pure-decode steps applied at once: what the replica waits, records and traces."""

    delay: float  # the SimPy timeout that ends at starts[k] (env.now + delay == starts[k])
    starts: np.ndarray  # k + 1 times: each step's start, then the last step's end
    parts: list  # RunPart, in step order (their steps add up to k)
    # async scheduling: the step the run scheduled last, in flight when it ends (None: sync, or
    # nothing left to run)
    next_batch: Any = None  # protocols.Batch, a pure decode of the requests left
    next_duration: float = 0.0  # its duration (the cost model's)
    pipelined: bool = False  # async scheduling: each step was scheduled when the one before began
    # the last step ends after the next arrival (decode_run's `straddle`): its record's waiting
    # count is the queue as the run's end finds it
    straddles: bool = False
    # a run made in one pass through its finishes (Scheduler._decode_run_through): the k records
    # as one block of columns (the parts hold only their steps and finishes), its token gaps,
    # how many each step has (None: each part records its own columns) and the running batch
    # at its first decode step (a part's batch is it less those finished before the part)
    columns: dict | None = None
    gaps: np.ndarray | None = None
    gaps_per_step: np.ndarray | int | None = None
    reqs: list | None = None
    # a sync run that opens with a prompt step (Scheduler._prompt_then_run): (its start, its
    # duration, its Batch, the SchedulerStats after its commit), what the loop records and
    # traces for it; `starts` then begin at the decode steps' first start, and a run of the
    # prompt step alone has no parts
    prompt: tuple | None = None
    # a span (scheduling/span.py): how many arrivals it admitted itself (the feed skips them),
    # and with a step trace its rows (StepTrace's, less the step numbers)
    taken: int = 0
    trace_rows: list | None = None


# NOTE: a cost model whose step_time was replaced (a test's fixed step) is evaluated step by
# step instead, so its replacement is what runs
_STEP_TIME = CostModel.step_time


def decode_run_times(cost: CostModel, m: int, first: int, k: int,
                     window_kv_tokens: np.ndarray | int = -1) -> np.ndarray:
    """CostModel.step_time(StepShape(m, m, e_j, e_j, m, 0, window_kv_tokens[j])) for the k
    steps j of a decode run, e_j = first + m j: the cost model's own decode_run_times (element-
    wise equal to step_time, tests/test_advance.py); every step of a decode run is a pure
    decode of the m running requests (window_kv_tokens: -1, not given, unless the model has
    sliding-window layers)."""
    if type(cost).step_time is not _STEP_TIME:
        step_time = cost.step_time
        entries = range(first, first + m * k, m)
        windows = np.broadcast_to(window_kv_tokens, (k,)).tolist()
        return np.array([step_time(StepShape(m, m, float(e), e, m, 0, w))
                         for e, w in zip(entries, windows)], np.float64)
    return cost.decode_run_times(m, first, k, window_kv_tokens)


def decode_run_fn(cost: CostModel) -> Callable[..., np.ndarray]:
    """decode_run_times bound to `cost` (what a replica hands Scheduler.decode_run): the cost
    model's own method where its step_time is the standard one (no wrapper on the hot path)."""
    if type(cost).step_time is not _STEP_TIME:
        return functools.partial(decode_run_times, cost)
    return cost.decode_run_times


def exact_delay(now: float, target: float) -> float | None:
    """A delay d with now + d == target in floats (SimPy adds delays to now), or None."""
    d = target - now
    for _ in range(8):
        t = now + d
        if t == target:
            return d
        d = math.nextafter(d, math.inf if t < target else -math.inf)
    return None
