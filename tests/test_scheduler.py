"""Scheduler: golden step logs on hand-built scenarios, and vectorized == sequential."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import drive, make_scheduler

# Hand-traced with vLLM v1's rules (block_size 4, 6 usable blocks, budget 8 tokens):
# step 0: r0 prefill 6 (2 blocks), r1 gets the 2 budget tokens left (chunked prefill)
# step 1: r0 decodes, r1 finishes its prompt (4), r2 admitted with the 3 tokens left
# step 2: everyone 1 token; r2's prompt is done and it samples its first token
# step 3: r0 takes the last free block; r2 needs a block, none free -> the victim is the
#         running tail, r2 itself: preempted, no admission this step; r0 finishes
# step 4: r2 re-admitted and recomputes prompt + 1 output (5 tokens); r1 and r2 finish
GOLDEN = [
    (0, {0: 6, 1: 2}, [], []),
    (1, {0: 1, 1: 4, 2: 3}, [], []),
    (2, {0: 1, 1: 1, 2: 1}, [], []),
    (3, {0: 1, 1: 1}, [2], [0]),
    (4, {1: 1, 2: 5}, [], [1, 2]),
]


@pytest.mark.parametrize("vectorized", [True, False])
def test_golden_preemption_log(vectorized):
    sched = make_scheduler(vectorized=vectorized)
    log = drive(sched, {0: [(6, 4), (6, 4)], 1: [(4, 2)]})
    assert log == GOLDEN
    assert sched.kv.pool.num_free_blocks == 6
    assert sched.num_preemptions == 1


def test_static_batch_admits_nobody_until_it_drains():
    sched = make_scheduler(batching="static", num_blocks=100, budget=64, max_num_seqs=2)
    log = drive(sched, {0: [(4, 3), (4, 1), (4, 1)]})
    # r0, r1 form the batch; r1 finishes at step 0, but r2 waits until r0 is done (step 2)
    assert log == [
        (0, {0: 4, 1: 4}, [], [1]),
        (1, {0: 1}, [], []),
        (2, {0: 1}, [], [0]),
        (3, {2: 4}, [], [2]),
    ]


def test_static_batch_limited_by_final_kv_size():
    # 4 usable blocks of 4 = 16 slots; each request's final size is 4 + 5 - 1 = 8 slots -> 2 fit
    sched = make_scheduler(batching="static", num_blocks=5, budget=64, max_num_seqs=8)
    log = drive(sched, {0: [(4, 5)] * 3})
    assert list(log[0][1]) == [0, 1]
    assert all(not pre for _, _, pre, _ in log)  # static never preempts


def test_contiguous_oracle_reserves_final_length():
    sched = make_scheduler(contiguous="oracle", total_slots=20, budget=64)
    drive_log = drive(sched, {0: [(6, 4), (6, 4), (6, 4)]})
    # reservations of 10 slots: two fit, the third waits for a free region
    assert list(drive_log[0][1]) == [0, 1]
    assert 2 in drive_log[4][1]  # admitted right after r0/r1 finish at step 3


def _random_arrivals(rng, steps, max_prompt, max_out):
    return {int(s): [(int(rng.integers(1, max_prompt)), int(rng.integers(1, max_out)))
                     for _ in range(int(rng.integers(1, 4)))]
            for s in rng.choice(steps, size=steps // 3, replace=False)}


@pytest.mark.parametrize("seed", range(12))
def test_vectorized_matches_sequential(seed):
    """The numpy fast path must make exactly the reference loop's decisions."""
    rng = np.random.default_rng(seed)
    params = dict(num_blocks=int(rng.integers(8, 40)), block_size=int(rng.choice([1, 2, 4, 16])),
                  budget=int(rng.integers(4, 64)), max_num_seqs=int(rng.integers(1, 10)))
    arrivals = _random_arrivals(rng, 60, 40, 30)
    fits = params["num_blocks"] - 1
    # keep requests that fit the pool alone (the replica rejects the others at arrival)
    arrivals = {s: [(p, o) for p, o in reqs if -(-(p + o - 1) // params["block_size"]) <= fits]
                for s, reqs in arrivals.items()}
    fast = drive(make_scheduler(vectorized=True, **params), arrivals)
    slow = drive(make_scheduler(vectorized=False, **params), arrivals)
    assert fast == slow
    assert sum(len(f) for *_, f in fast) == sum(len(v) for v in arrivals.values())


@pytest.mark.parametrize("seed", range(6))
def test_continuous_respects_limits_and_frees_everything(seed):
    rng = np.random.default_rng(100 + seed)
    budget, max_seqs = int(rng.integers(8, 48)), int(rng.integers(1, 6))
    sched = make_scheduler(num_blocks=30, block_size=4, budget=budget, max_num_seqs=max_seqs)
    arrivals = _random_arrivals(rng, 80, 50, 40)
    log = drive(sched, arrivals)
    for _, scheduled, _, _ in log:
        assert 0 < sum(scheduled.values()) <= budget
        assert len(scheduled) <= max_seqs
    assert sched.kv.pool.num_free_blocks == 29
    assert not sched.kv.req_to_blocks


@pytest.mark.parametrize("seed", range(10))
def test_vectorized_matches_sequential_with_prefix_caching(seed):
    """Same, with shared prefixes: hits at admission, blocks hashed as soon as they fill."""
    rng = np.random.default_rng(1000 + seed)
    params = dict(num_blocks=int(rng.integers(10, 40)), block_size=int(rng.choice([2, 4, 8])),
                  budget=int(rng.integers(4, 48)), max_num_seqs=int(rng.integers(1, 8)),
                  caching=True, eviction=str(rng.choice(["lru", "lfu"])), chunk_tokens=8)
    arrivals = {}
    for s in rng.choice(60, size=25, replace=False):
        reqs = []
        for _ in range(int(rng.integers(1, 4))):
            chunks = [int(x) for x in rng.integers(0, 3, size=int(rng.integers(0, 4)))]
            prompt = 8 * len(chunks) + int(rng.integers(1, 10))
            out = int(rng.integers(1, 20))
            if -(-(prompt + out - 1) // params["block_size"]) <= params["num_blocks"] - 1:
                reqs.append((prompt, out, chunks))
        arrivals[int(s)] = reqs
    fast_s = make_scheduler(vectorized=True, **params)
    slow_s = make_scheduler(vectorized=False, **params)
    fast, slow = drive(fast_s, arrivals), drive(slow_s, arrivals)
    assert fast == slow
    assert fast_s.kv.prefix_hits == slow_s.kv.prefix_hits
    assert sum(len(f) for *_, f in fast) == sum(len(v) for v in arrivals.values())


@pytest.mark.parametrize("vectorized", [True, False])
def test_static_batching_in_prefill_first_steps(vectorized):
    # Budget 8, 2 seats, no chunked prefill: prompts run whole, decodes pause meanwhile.
    # static: r0 and r1 form the batch; r1's prompt does not fit the budget left at step 0, so
    # it runs alone at step 1; r2 waits for the whole batch to finish (step 4).
    # continuous: r2 takes r1's seat as soon as r1 finishes (step 2).
    arrivals = {0: [(6, 3), (6, 1), (4, 2)]}
    static = make_scheduler(num_blocks=40, budget=8, max_num_seqs=2, batching="static",
                            chunked_prefill=False, vectorized=vectorized)
    assert drive(static, arrivals) == [
        (0, {0: 6}, [], []),
        (1, {1: 6}, [], [1]),
        (2, {0: 1}, [], []),
        (3, {0: 1}, [], [0]),
        (4, {2: 4}, [], []),
        (5, {2: 1}, [], [2]),
    ]
    continuous = make_scheduler(num_blocks=40, budget=8, max_num_seqs=2, chunked_prefill=False,
                                vectorized=vectorized)
    assert drive(continuous, arrivals)[2:4] == [(2, {2: 4}, [], []), (3, {0: 1, 2: 1}, [], [2])]


def test_running_batch_departures_shift_every_column_and_bump_the_version():
    """RunningBatch: appends keep every slot (version unchanged), a departure (remove or
    compress) shifts all columns together and bumps the version; the ones row stays ones; a
    list handed out before a departure is not changed by it (async steps in flight keep it)."""
    from simulator.engine.scheduling.running import RunningBatch
    from simulator.workload.request import Request

    rng = np.random.default_rng(3)
    rb = RunningBatch(16, async_scheduling=True)
    live: list[Request] = []
    for step in range(200):
        if len(live) < 16 and (not live or rng.random() < 0.5):
            req = Request(step, 0.0, int(rng.integers(1, 50)), int(rng.integers(1, 20)))
            v = rb.version
            slot = rb.append(req, int(rng.integers(0, req.num_tokens)), 16 * step)
            assert slot == len(live) and rb.version == v
            live.append(req)
        else:
            before = rb.reqs
            snapshot = list(before)
            v = rb.version
            if rng.random() < 0.5:
                i = int(rng.integers(0, len(live)))
                rb.remove(i)
                live.pop(i)
            else:
                keep = rng.random(len(live)) < 0.6
                rb.compress(keep)
                live = [r for r, k in zip(live, keep) if k]
            assert rb.version == v + 1 and before == snapshot
        m = rb.m
        assert rb.reqs == live
        assert rb.ids[:m].tolist() == [r.req_id for r in live]
        assert rb.tokens[:m].tolist() == [r.num_tokens for r in live]
        assert rb.capacity[:m].tolist() == [16 * r.req_id for r in live]
        assert rb.target_out[:m].tolist() == [r.output_tokens for r in live]
        assert (rb.ones == 1).all()


@pytest.mark.parametrize("seed", range(3))
def test_slots_now_follows_departures(seed):
    """RunningBatch.slots_now: requests at some slots of an earlier version are found where they
    are now (or known gone) through the departures since - removals, compressions, with appends
    in between - as a lookup by req_id finds them; None once more departures happened than are
    kept."""
    from simulator.engine.scheduling import running as running_mod
    from simulator.engine.scheduling.running import RunningBatch
    from simulator.workload.request import Request

    rng = np.random.default_rng(seed)
    rb = RunningBatch(64, async_scheduling=True)
    next_id = 0
    snaps = []  # (version, slots, their req_ids then)
    for _ in range(400):
        m = rb.m
        op = rng.random()
        if m < 3 or op < 0.45:
            rb.append(Request(next_id, 0.0, 10, 10), 0, 16)
            next_id += 1
        elif op < 0.7:
            rb.remove(int(rng.integers(0, m)))
        elif op < 0.85:
            rb.remove_slots(sorted(rng.choice(m, size=int(rng.integers(1, min(m, 4) + 1)),
                                              replace=False).tolist()))
        else:
            keep = rng.random(m) < 0.7
            rb.compress(keep)
        m = rb.m
        if m:
            slots = np.sort(rng.choice(m, size=int(rng.integers(1, m + 1)), replace=False))
            snaps.append((rb.version, slots, [rb.reqs[i].req_id for i in slots.tolist()]))
        ids_now = {r.req_id: i for i, r in enumerate(rb.reqs)}
        for version, slots, ids in snaps[-100:]:
            got = rb.slots_now(version, slots)
            if rb.version - version > running_mod._DEPARTURES:
                assert got is None
                continue
            if version == rb.version:
                continue
            assert got is not None
            at, alive = got
            assert alive.tolist() == [i in ids_now for i in ids]
            assert at[alive].tolist() == [ids_now[i] for i in ids if i in ids_now]



def test_async_commit_by_req_id_when_departures_are_not_kept(monkeypatch):
    """The async commit finds a step's samplers through the departures since it was scheduled;
    with none kept it looks them up by req_id instead: the same run (preemptions under a small
    pool, finishes, stale outputs)."""
    from simulator.config.schema import build_config
    from simulator.engine.run import run
    from simulator.engine.scheduling import running as running_mod

    cfg = build_config(overrides=["engine.max_model_len=4096", "engine.queue_policy=priority",
                                  "engine.num_gpu_blocks_override=300", "workload.arrival.rate=30",
                                  "workload.num_requests=150", "engine.async_scheduling=true"])
    want = run(cfg)
    monkeypatch.setattr(running_mod, "_DEPARTURES", 0)
    got = run(cfg)
    assert want.summary["preemptions"]["total"] > 0
    assert got.summary == want.summary
    assert got.requests.equals(want.requests)
