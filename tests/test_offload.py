"""The CPU offload tier (kvcache/offload.py): bad input, a load instead of a recompute, off is
unchanged, and a state machine over the scheduler with the tier on (every block in one place,
every request accounted for)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_scheduler
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from simulator.config.schema import build_config
from simulator.engine.build import setup
from simulator.engine.kvcache.offload import CPUTier, LookupResult, OffloadConnector, num_cpu_blocks
from simulator.engine.run import run
from simulator.errors import ConfigError
from simulator.workload.request import Request

SESSIONS = ["workload.duration_s=60", "workload.arrival.rate=1.0", "engine.max_model_len=32768",
            "engine.num_gpu_blocks_override=2500"]


def sessions(*sets):
    return build_config("workloads/sessions.yaml", [*SESSIONS, *sets])


# --- bad input: one line each ------------------------------------------------------------
@pytest.mark.parametrize("value,expect", [
    ("-1", "engine.kv_offloading_size must be a number of GiB >= 0, got -1"),
    ("lots", "engine.kv_offloading_size must be a number of GiB >= 0, got 'lots'"),
    (".nan", "engine.kv_offloading_size must be a number of GiB >= 0, got nan"),
])
def test_bad_size_is_one_line(value, expect):
    with pytest.raises(ConfigError) as e:
        build_config(None, [f"engine.kv_offloading_size={value}"])
    assert str(e.value) == expect


@pytest.mark.parametrize("sets,expect", [
    (["engine.kv_offloading_size=4096"],
     "engine.kv_offloading_size 4096 GiB is more than engine.host_memory_gib 2048 GiB"),
    (["engine.kv_offloading_size=100", "engine.host_memory_gib=64"],
     "engine.kv_offloading_size 100 GiB is more than engine.host_memory_gib 64 GiB"),
    (["engine.kv_offloading_size=60", "engine.host_memory_gib=64", "engine.preemption_mode=swap",
      "engine.swap_space_gib=8"],
     "engine.kv_offloading_size 60 GiB + swap_space_gib 8 is more than engine.host_memory_gib 64 GiB"),
    (["engine.kv_offloading_size=0.0001"], "smaller than one KV block"),
    (["engine.kv_offloading_size=4", "engine.kv_offloading_backend=lmcache"],
     "engine.kv_offloading_backend lmcache is not modelled yet (kvsim models native only)"),
    (["engine.kv_offloading_size=4", "engine.enable_prefix_caching=false"],
     "needs the paged allocator with enable_prefix_caching: true"),
    (["engine.kv_offloading_size=4", "engine.kv_offloading_eviction_policy=arc"],
     "kv_offloading_eviction_policy"),
    (["engine.kv_offloading_size=4", "engine.kv_offloading_eviction_policy=lru_ttl",
      "engine.kv_offloading_eviction_params={ttl_s: -1}"],
     "engine.kv_offloading_eviction_params.ttl_s"),
    (["engine.kv_offloading_size=4", "engine.async_scheduling=true"],
     "engine.async_scheduling true is not supported with engine.kv_offloading_size"),
])
def test_bad_tier_settings_are_one_line(sets, expect):
    with pytest.raises(ConfigError) as e:
        setup(build_config(None, sets))
    msg = str(e.value)
    assert expect in msg and "\n" not in msg


def test_bad_size_from_the_cli(capsys):
    from simulator.cli.main import main
    assert main(["run", "--set", "engine.kv_offloading_size=-2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kvsim: error: engine.kv_offloading_size must be a number of GiB >= 0, got -2"]


def test_cpu_blocks_as_vllm_counts_them():
    # Llama-3.1-8B, block 16: 2 MiB per block (a page multiple); TP 2: 1 MiB per rank, summed
    assert num_cpu_blocks(64, 2 << 20, 1) == 32768
    assert num_cpu_blocks(64, 1 << 20, 2) == 32768
    assert num_cpu_blocks(1, 5000, 1) == (1 << 30) // 8192  # rounded up to a 4 KiB page


# --- a load instead of a recompute ------------------------------------------------------------
def tiny(num_blocks=8, cpu_blocks=16, link_gbps=1e-6, latency_s=0.25):
    """A 4-token-block scheduler (7 usable GPU blocks) with a tier; 1000 bytes a block over a
    1 kB/s link: a load of n blocks takes 0.25 + n seconds."""
    sched = make_scheduler(num_blocks=num_blocks, block_size=4, budget=64, max_num_seqs=4,
                           caching=True)
    sched.offload = OffloadConnector(sched.kv, CPUTier(cpu_blocks), 1000, link_gbps, latency_s, 0.0)
    return sched


def step(sched, now, dt=1.0):
    batch = sched.schedule(now)
    scheduled = sched.scheduled()
    finished = sched.commit(now + dt) if batch.shape.num_tokens else []
    return batch, scheduled, [r.req_id for r in finished]


def test_prefix_evicted_from_gpu_is_loaded_from_cpu_not_recomputed():
    sched = tiny()
    a = Request(0, 0.0, 12, 1, prefix=np.array([1, 2, 3]))  # 3 full shared blocks
    sched.add_request(a)
    assert step(sched, 0.0)[1:] == ({0: 12}, [0])  # prefill + first token: finished
    sched.add_request(Request(1, 1.0, 28, 1))  # unique, every GPU block: a's are evicted
    t = 1.0
    while sched.has_work:
        step(sched, t)
        t += 1.0
    assert sched.kv.lookup_prefix(Request(9, t, 13, 1, prefix=np.array([1, 2, 3]))) == 0
    # a's 3 blocks were offered after its prefill step (t=1): written by 1 + 0.25 + 3 s, then
    # request 1's 7 (the store link is a FIFO)
    assert sched.offload.tier.where() == {"free": 6, "pending": 10, "ready": 0, "loading": 0}
    t = 20.0
    b = Request(2, t, 13, 1, prefix=np.array([1, 2, 3]))
    sched.add_request(b)
    batch, scheduled, _ = step(sched, t)  # GPU miss, CPU hit: loading, nothing runs
    assert scheduled == {} and batch.wait_until_s == pytest.approx(t + 0.25 + 3)
    assert sched.has_work and sched.offload.num_loading == 1
    assert step(sched, t + 1)[1] == {}  # still loading
    batch, scheduled, fin = step(sched, t + 3.25)  # the load ended: only the last token runs
    assert scheduled == {2: 1} and fin == [2]
    assert b.num_cached_tokens == 12 and b.first_token_s == t + 4.25
    s = sched.stats().offload
    assert (s.num_loads, s.loaded_blocks, s.hit_tokens, s.bytes_loaded) == (1, 3, 12, 3000)


def test_whole_prompt_on_cpu_recomputes_only_its_last_token():
    sched = tiny()
    sched.add_request(Request(0, 0.0, 8, 1, prefix=np.array([1, 2])))
    step(sched, 0.0)
    sched.add_request(Request(1, 1.0, 28, 1))
    t = 1.0
    while sched.has_work:
        step(sched, t)
        t += 1.0
    t = 20.0
    b = Request(2, t, 8, 1, prefix=np.array([1, 2]))  # all 8 tokens stored: vLLM loads both
    sched.add_request(b)  # blocks (its lookup is not capped at num_tokens - 1) then recomputes 1
    step(sched, t)
    assert step(sched, t + 10)[1] == {2: 1}
    assert b.num_cached_tokens == 7


def test_stores_are_prompt_only_and_once_per_block():
    sched = tiny(cpu_blocks=32)
    r = Request(0, 0.0, 10, 9)  # 2 full prompt blocks; decoding fills a 3rd and a 4th
    sched.add_request(r)
    t = 0.0
    while sched.has_work:
        step(sched, t)
        t += 1.0
    s = sched.stats().offload
    assert (s.num_stores, s.stored_blocks) == (1, 2)  # vLLM's offload_prompt_only


def test_off_is_unchanged_and_on_hits_more(tmp_path):
    base = run(sessions())
    zero = run(sessions("engine.kv_offloading_size=0"))
    assert json.dumps(base.summary, sort_keys=True) == json.dumps(zero.summary, sort_keys=True)
    assert "kv_offload" not in base.summary
    assert "kv_offloading_size" not in base.setup.config.engine.to_dict()
    on = run(sessions("engine.kv_offloading_size=8"))
    again = run(sessions("engine.kv_offloading_size=8"))
    assert json.dumps(on.summary, sort_keys=True) == json.dumps(again.summary, sort_keys=True)
    k = on.summary["kv_offload"]
    assert k["hit_tokens"] > 0 and k["loads"] > 0 and k["stores"] > 0
    assert k["bytes_moved"] == k["bytes_loaded"] + k["bytes_stored"]
    by = k["hit_rate_by_tier"]
    assert by["total"] == pytest.approx(by["gpu"] + by["cpu"])
    assert by["total"] > base.summary["prefix_cache"]["hit_rate"]
    assert on.summary["prefix_cache"]["request_hit_rate"] == pytest.approx(by["total"])
    assert on.summary["requests"]["finished"] == base.summary["requests"]["finished"]


@pytest.mark.parametrize("policy", ["lru", "lru_ttl"])
def test_both_cpu_policies_run(policy):
    res = run(sessions("engine.kv_offloading_size=1", f"engine.kv_offloading_eviction_policy={policy}",
                       "workload.duration_s=30"))
    assert res.summary["kv_offload"]["evictions"] > 0  # 1 GiB: the tier turns over


# --- state machine -----------------------------------------------------------------------
class OffloadMachine(RuleBasedStateMachine):
    """Arrivals (shared prefix chunks) and steps at random times on a tiny GPU pool and CPU
    tier with slow transfers. After every rule: each GPU block is used (held by the tables
    that reference it), cached-free or free; each CPU block is free, ready, pending (in exactly
    one store in flight) or being loaded (pinned once per load in flight); each arrived
    request is waiting, loading, running, finished or rejected. At the end, drained:
    arrived = finished + rejected."""

    def __init__(self):
        super().__init__()
        self.sched = tiny(num_blocks=10, cpu_blocks=6, link_gbps=4e-6, latency_s=0.1)
        self.now = 0.0
        self.next_id = 0
        self.arrived = self.finished = self.rejected = 0

    @rule(chunks=st.lists(st.integers(0, 2), max_size=3), extra=st.integers(1, 6),
          out=st.integers(1, 4))
    def arrive(self, chunks, extra, out):
        req = Request(self.next_id, self.now, 4 * len(chunks) + extra, out,
                      prefix=np.asarray(chunks, np.int64) if chunks else None)
        self.next_id += 1
        self.arrived += 1
        if self.sched.kv.max_request_slots(req) > self.sched.kv.total_slots:
            self.rejected += 1  # as the replica rejects it
        else:
            self.sched.add_request(req)

    @rule(dt=st.sampled_from([0.3, 1.0, 2.5]))
    def tick(self, dt):
        self._step(dt)

    def _step(self, dt):
        sched = self.sched
        if not sched.has_work:
            self.now += dt
            return
        batch = sched.schedule(self.now)
        if batch.shape.num_tokens:
            self.finished += len(sched.commit(self.now + dt))
            self.now += dt
        else:
            assert batch.wait_until_s is not None, "no progress and nothing in flight"
            self.now = max(self.now + 0.01, batch.wait_until_s)

    @invariant()
    def gpu_blocks_in_one_place(self):
        kv = self.sched.kv
        pool = kv.pool
        refs = [0] * pool.num_blocks
        for blocks in kv.req_to_blocks.values():
            for b in blocks:
                refs[b] += 1
        for b in range(1, pool.num_blocks):
            assert pool.ref_cnt[b] == refs[b], b  # used: exactly the tables holding it
            assert (b in pool.free_queue) == (refs[b] == 0)  # else cached-free or free
        for h, blocks in pool.cached.items():
            assert all(pool.block_hash[b] == h for b in blocks)

    @invariant()
    def cpu_blocks_in_one_place(self):
        off = self.sched.offload
        pool = off.tier.pool
        pending = [b for _, blocks in off._stores for b in blocks]
        loading = [b for _, _, _, blocks, _ in off._loads for b in blocks]
        assert len(pending) == len(set(pending)) and not set(pending) & set(loading)
        for b in range(1, pool.num_blocks):
            queued = b in pool.free_queue
            if b in pending:  # in transit to the CPU
                assert pool.ref_cnt[b] == 1 and not pool.ready[b] and not queued
                assert pool.block_hash[b] is not None
            elif b in loading:  # in transit to the GPU, pinned once per load
                assert pool.ref_cnt[b] == loading.count(b) and pool.ready[b] and not queued
            else:  # ready (hashed) or free, and evictable
                assert pool.ref_cnt[b] == 0 and queued
                assert pool.block_hash[b] is None or pool.ready[b]

    @invariant()
    def requests_accounted_for(self):
        sched = self.sched
        loading = sched.offload.num_loading
        running = sched.running.m
        assert self.arrived == (len(sched.queue) + loading + running + self.finished
                                + self.rejected)
        for _, _, req, _, _ in sched.offload._loads:  # a loading request holds its GPU blocks
            assert req.req_id in sched.kv.req_to_blocks

    def teardown(self):
        for _ in range(2000):
            if not self.sched.has_work:
                break
            self._step(1.0)
        assert not self.sched.has_work
        assert self.arrived == self.finished + self.rejected


TestOffloadMachine = OffloadMachine.TestCase
TestOffloadMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("policy,params,evicted", [
    ("lru", {}, {"B", "C"}),  # vLLM's ranks: request 1's blocks (the first request), tail first
    ("lru_ttl", {"ttl_s": 5.0}, {"C", "A"}),  # ours: not accessed for 5 s goes first, oldest first
])
def test_cpu_eviction_order_lru_vs_lru_ttl(policy, params, evicted):
    tier = CPUTier(3, policy, params)
    name = {101: "C", 102: "B", 201: "A"}

    def store(rid, keys, now):
        tier.now = now
        blocks = tier.prepare_store(rid, keys)
        tier.complete_store(blocks)

    store(1, [(101, 16)], 0.0)  # request 1 touches the tier first: the lowest request rank
    store(0, [(201, 16)], 0.5)
    store(1, [(102, 32)], 10.0)  # its tail, stored later, still ranks below request 0's block
    tier.now = 12.0
    assert tier.prepare_store(2, [(301, 16), (302, 32)]) is not None
    assert {n for h, n in name.items() if tier.lookup(h) is LookupResult.MISS} == evicted


# --- the experiment ------------------------------------------------------------------------
def test_cpu_offload_page_and_the_trace_bound():
    """The page has every section; the trace's own infinite-cache count reproduces the bound
    issue 17 quotes for the whole Mooncake conversation trace (37.36 % of prompt tokens)."""
    from pathlib import Path

    from simulator.analysis.experiments import get_experiment
    exp = get_experiment("cpu_offload")
    text = (Path(__file__).resolve().parent.parent / "experiments/results/cpu_offload.md").read_text()
    for section in ("**Claim.**", "**Setup.**", "**Measured.**", "**Verdict:", "kvsim experiment cpu_offload",
                    "](cpu_offload.png)"):
        assert section in text
    if not Path(exp.trace_path()).is_file():
        pytest.skip("../shared/data traces absent")
    assert round(100 * exp.trace_stats(None)["bound"], 2) == 37.36
