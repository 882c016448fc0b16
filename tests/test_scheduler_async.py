"""Async scheduling (vLLM 0.33's AsyncScheduler, two batches in flight) in kvsim's scheduler:
small scenarios driven the way the replica's async loop drives it (step n+1 scheduled before
step n commits), whole logs asserted."""

from __future__ import annotations

import numpy as np
from helpers import make_scheduler

from simulator.workload.request import Request


def drive_async(sched, arrivals: dict[int, list[tuple]], max_steps=1000):
    """Like helpers.drive, with two steps in flight: schedule(n+1) runs before commit(n).
    Log: one (step, {req_id: tokens}, [preempted], [finished at its commit]) per step run."""
    log, next_id, t = [], 0, 0
    pending = dict(arrivals)
    inflight = None
    while t < max_steps:
        for prompt, output, *extra in pending.pop(t, []):
            priority = extra[0] if extra else 0
            sched.add_request(Request(next_id, float(t), prompt, output, priority))
            next_id += 1
        if inflight is None:
            if not sched.has_work:
                if not pending:
                    break
                t += 1
                continue
            batch = sched.schedule(float(t))
            assert batch.shape.num_tokens, "no progress"
            inflight = (sched.scheduled(), [r.req_id for r in batch.preempted])
        nxt = None
        if sched.has_work:
            b = sched.schedule(float(t))
            nxt = (sched.scheduled(), [r.req_id for r in b.preempted], b.shape.num_tokens)
        finished = [r.req_id for r in sched.commit(float(t) + 1.0)]
        log.append((t, inflight[0], inflight[1], sorted(finished)))
        t += 1
        inflight = None
        if nxt is not None:
            if nxt[2]:
                inflight = nxt[:2]
            else:
                sched.commit(float(t))  # an empty step: nothing ran
    return log


def _async(**kw):
    sched = make_scheduler(**kw)
    sched.async_scheduling = True
    from simulator.engine.scheduling.running import RunningBatch
    sched.running = RunningBatch(sched.max_num_seqs, True)
    return sched


def test_no_extra_step_at_max_tokens_and_blocks_freed_a_step_later():
    """A (prompt 4, 2 outputs) on a pool of 2 blocks of 4 and B (6 + 1 tokens, two blocks)
    waiting for them. Step 0 prefills A (samples its 1st token); step 1, scheduled while step 0
    runs, decodes it (its 2nd and last token, the 1st still a placeholder). The schedule made
    while step 1 runs skips A (its last token is in flight: vLLM's num_output_placeholders
    check) and cannot admit B (A's blocks are freed only at step 1's commit): it schedules
    nothing. B is admitted by the schedule after that commit."""
    sched = _async(num_blocks=3, block_size=4, budget=8)
    sched.add_request(Request(0, 0.0, 4, 2))
    sched.add_request(Request(1, 0.0, 6, 1))
    sched.schedule(0.0)
    assert sched.scheduled() == {0: 4}
    sched.schedule(0.0)
    assert sched.scheduled() == {0: 1}
    assert sched.commit(1.0) == []
    empty = sched.schedule(1.0)
    assert empty.shape.num_tokens == 0 and sched.running.m == 1 and len(sched.queue) == 1
    assert [r.req_id for r in sched.commit(2.0)] == [0]
    sched.commit(2.0)  # the empty step
    sched.schedule(2.0)
    assert sched.scheduled() == {1: 6}
    log = drive_async(_async(num_blocks=3, block_size=4, budget=8), {0: [(4, 2), (6, 1)]})
    assert log == [(0, {0: 4}, [], []), (1, {0: 1}, [], [0]), (2, {1: 6}, [], [1])]


def test_sync_frees_at_once():
    """The same arrivals synchronously: B is admitted right after A's last step."""
    from helpers import drive
    log = drive(make_scheduler(num_blocks=3, block_size=4, budget=8), {0: [(4, 2), (6, 1)]})
    assert log == [(0, {0: 4}, [], []), (1, {0: 1}, [], [0]), (2, {1: 6}, [], [1])]


def test_tokens_reach_the_client_at_their_commit():
    sched = _async(num_blocks=20, block_size=4, budget=64)
    reqs = []
    orig = sched.add_request

    def keep(r):
        reqs.append(r)
        orig(r)
    sched.add_request = keep
    log = drive_async(sched, {0: [(5, 4)]})
    assert [s for _, s, _, _ in log] == [{0: 5}, {0: 1}, {0: 1}, {0: 1}]
    (r,) = reqs
    assert r.first_token_s == 1.0 and r.finish_s == 4.0 and r.num_output_tokens == 4
    assert sched.stats().kv.used_slots == 0


def test_preempted_with_last_token_in_flight_finishes_from_outside_the_queue():
    """fcfs victim = the running tail; when its last token is in flight it finishes at that
    step's commit (vLLM finishes it from the waiting queue) and never runs again."""
    sched = _async(num_blocks=5, block_size=4, budget=16)
    log = drive_async(sched, {0: [(7, 6), (4, 2)]})
    finished = [f for *_, fs in log for f in fs]
    assert sorted(finished) == [0, 1]
    assert len(sched.queue) == 0 and not sched._finishing
    assert np.all(sched.running.ph[:sched.running.m] >= 0)


def test_async_scheduling_resolves_as_vllm_does():
    """Unset: on, except kvsim's synchronous modes (off); true with one: a one-line error."""
    import pytest

    from simulator.config.schema import build_config
    from simulator.engine.build import setup
    from simulator.errors import ConfigError
    assert setup(build_config(None, [])).engine.async_scheduling is True
    assert setup(build_config(None, [])).cost.async_scheduling is True
    assert setup(build_config(None, ["engine.async_scheduling=false"])).cost.async_scheduling is False
    for mode in ("engine.scheduler=static", "engine.preemption_mode=swap"):
        assert setup(build_config(None, [mode])).engine.async_scheduling is False
        with pytest.raises(ConfigError, match="engine.async_scheduling true is not supported"):
            setup(build_config(None, [mode, "engine.async_scheduling=true"]))


def test_two_requests_by_hand_under_async(monkeypatch):
    """tests/test_metrics.py's two requests (fixed 0.25 s steps; r0 at 0 prompt 20 output 3,
    r1 at .375 prompt 10 output 2) with two batches in flight:
      step  runs       scheduled at  what                       committed (tokens emitted)
      1     0-.25      0             r0 prefill 20              .25  r0 1st token
      2     .25-.5     0             r0 decode (placeholder)    .5   r0 2nd
      3     .5-.75     .25           r0 decode, its last        .75  r0 3rd, r0 finishes
      4     .75-1      .5            r1 prefill (r0 skipped)    1.0  r1 1st
      5     1-1.25     .75           r1 decode, its last        1.25 r1 2nd, r1 finishes
    the schedule at 1.0 finds only r1, its last token in flight: nothing runs.
    Synchronously r1's prefill runs at .5-.75 (TTFT .375): async adds one step to it."""
    from simulator.config.schema import build_config
    from simulator.engine.costmodel import CostModel
    from simulator.engine.run import run
    from simulator.engine.steptrace import StepTrace
    from simulator.workload.generators import RequestArrays
    monkeypatch.setattr(CostModel, "step_time", lambda self, shape: 0.25)
    wl = RequestArrays(np.array([0.0, 0.375]), np.array([20, 10], np.int64),
                       np.array([3, 2], np.int64), np.zeros(2, np.int64))
    trace = StepTrace()
    res = run(build_config(None, ["engine.async_scheduling=true"]), wl, trace=trace)
    assert [(r["t_s"], r["scheduled"], r["finished"]) for r in trace.rows] == [
        (0.0, [[0, 20]], []), (0.0, [[0, 1]], []), (0.25, [[0, 1]], [0]),
        (0.5, [[1, 10]], []), (0.75, [[1, 1]], [1])]
    req = res.requests
    assert (req["first_token_s"] - req["arrival_s"]).tolist() == [0.25, 0.625]
    assert req["finish_s"].tolist() == [0.75, 1.25]
    assert req["first_scheduled_s"].tolist() == [0.0, 0.5]
    assert res.summary["batch"]["num_iterations"] == 5
