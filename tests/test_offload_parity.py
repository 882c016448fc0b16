"""The CPU offload tier's block semantics against vLLM 0.33's own code: the same random sequence
of store / complete / lookup / load / finish events drives vLLM's CPUOffloadingManager with its
LRU policy (vllm/v1/kv_offload/cpu/manager.py, cpu/policies/lru.py: pure-Python bookkeeping,
no GPU needed; the GPU side, CPUOffloadingWorker, is not involved) and kvsim's CPUTier, and
every answer is compared: what an offer stores, what it evicts, whether it fails, and the
lookup of every key after every event.

How vLLM's code runs here: the manager is built as CPUOffloadingSpec.get_manager builds it
(cpu/spec.py:165) with store_threshold 0 and events on; each request gets a ReqContext whose
offload-key positions are set as OffloadingConnectorScheduler.update_offload_keys sets them
(end token of the block, offloading/scheduler.py:412); keys are make_offload_key(hash, group 0).
"""

from __future__ import annotations

import random

import pytest

from simulator.engine.kvcache.offload import CPUTier, LookupResult

vllm_manager = pytest.importorskip("vllm.v1.kv_offload.cpu.manager",
                                   reason="vLLM 0.33 is not installed")
vllm_base = pytest.importorskip("vllm.v1.kv_offload.base")

BS = 16  # tokens per block


def vkey(h: int):
    return vllm_base.make_offload_key(h.to_bytes(8, "big"), 0)


class Both:
    """One vLLM manager and one kvsim tier, fed the same events; every answer compared."""

    def __init__(self, num_blocks: int) -> None:
        self.v = vllm_manager.CPUOffloadingManager(num_chunks=num_blocks, cache_policy="lru",
                                                   enable_events=True)
        self.k = CPUTier(num_blocks, "lru")
        self.ctx: dict[int, object] = {}
        self.keys_seen: set[int] = set()
        self.log: list[tuple] = []

    def new_request(self, rid: int, keys: list[tuple[int, int]]) -> None:
        ctx = vllm_base.ReqContext(req_id=str(rid))
        for h, pos in keys:
            ctx.set_offload_key_position(vkey(h), pos)
        self.v.on_new_request(ctx)
        self.ctx[rid] = ctx
        self.keys_seen.update(h for h, _ in keys)

    def store(self, rid: int, keys: list[tuple[int, int]]):
        before = {h for h in self.keys_seen if self.k.lookup(h) is not LookupResult.MISS}
        out_v = self.v.prepare_store([vkey(h) for h, _ in keys], self.ctx[rid])
        out_k = self.k.prepare_store(rid, keys)
        assert (out_v is None) == (out_k is None), (rid, keys, out_v, out_k)
        if out_k is None:
            self.log.append(("store-failed", rid))
            return None
        stored_v = sorted(int.from_bytes(k[:8], "big") for k in out_v.keys_to_store)
        stored_k = sorted(self.k.pool.block_hash[b] for b in out_k)
        assert stored_v == stored_k
        evicted_v = sorted(int.from_bytes(k[:8], "big") for k in out_v.evicted_keys)
        after = {h for h in self.keys_seen if self.k.lookup(h) is not LookupResult.MISS}
        evicted_k = sorted(before - after)
        assert evicted_v == evicted_k, (rid, evicted_v, evicted_k)
        self.log.append(("store", rid, tuple(stored_k), tuple(evicted_k)))
        return [h for h in stored_k], out_k

    def complete_store(self, hashes: list[int], blocks: list[int], rid: int) -> None:
        self.v.complete_store([vkey(h) for h in hashes], self.ctx[rid])
        self.k.complete_store(blocks)

    def lookup_run(self, keys: list[tuple[int, int]]) -> int:
        """Ready blocks from the start of `keys`, as the connector scans them."""
        n = 0
        for h, _ in keys:
            rv = self.v.lookup(vkey(h), None)
            rk = self.k.lookup(h)
            assert rv.name == rk.name
            if rk is not LookupResult.HIT:
                break
            n += 1
        return n

    def load(self, rid: int, keys: list[tuple[int, int]]) -> list[int]:
        self.v.prepare_load([vkey(h) for h, _ in keys], self.ctx[rid])
        return self.k.prepare_load(rid, keys)

    def complete_load(self, rid: int, keys: list[tuple[int, int]], blocks: list[int]) -> None:
        self.v.complete_load([vkey(h) for h, _ in keys], self.ctx[rid])
        self.k.complete_load(blocks)

    def finish(self, rid: int) -> None:
        self.v.on_request_finished(self.ctx[rid])
        self.k.request_finished(rid)

    def check_lookups(self) -> None:
        for h in sorted(self.keys_seen):
            assert self.v.lookup(vkey(h), None).name == self.k.lookup(h).name, h


def scenario(seed: int, num_blocks: int, steps: int = 300) -> Both:
    """Requests over a few shared prefix chains (a session's turns, a system prompt), each
    offering its blocks in chunks as prefill steps would, loading hits past a random GPU
    prefix, completing transfers out of order, finishing while transfers are in flight."""
    rng = random.Random(seed)
    both = Both(num_blocks)
    active: dict[int, dict] = {}
    stores: list[tuple[int, list[int], list[int]]] = []
    loads: list[tuple[int, list, list[int]]] = []
    next_id = 0
    for _ in range(steps):
        op = rng.random()
        if op < 0.2 or not active:
            chain = rng.randrange(4)
            length = rng.randint(1, 12)
            keys = [(chain * 1000 + j + 1, (j + 1) * BS) for j in range(length)]
            both.new_request(next_id, keys)
            active[next_id] = {"keys": keys, "next": 0}
            next_id += 1
        elif op < 0.5:
            rid = rng.choice(sorted(active))
            st = active[rid]
            if st["next"] < len(st["keys"]):
                end = min(len(st["keys"]), st["next"] + rng.randint(1, 4))
                out = both.store(rid, st["keys"][st["next"]:end])
                if out is not None:
                    st["next"] = end
                    if out[1]:
                        stores.append((rid, out[0], out[1]))
        elif op < 0.65 and stores:
            rid, hashes, blocks = stores.pop(rng.randrange(len(stores)))
            both.complete_store(hashes, blocks, rid)
        elif op < 0.78:
            rid = rng.choice(sorted(active))
            st = active[rid]
            gpu = rng.randint(0, len(st["keys"]) - 1)  # blocks the GPU prefix cache had
            n = both.lookup_run(st["keys"][gpu:])
            if n:
                keys = st["keys"][gpu:gpu + n]
                loads.append((rid, keys, both.load(rid, keys)))
        elif op < 0.9 and loads:
            rid, keys, blocks = loads.pop(rng.randrange(len(loads)))
            both.complete_load(rid, keys, blocks)
        else:
            rid = rng.choice(sorted(active))
            if not any(r == rid for r, _, _ in loads):
                both.finish(rid)
                del active[rid]
        both.check_lookups()
    return both


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("num_blocks", [6, 16])
def test_tier_matches_vllm_cpu_offloading_manager(seed, num_blocks):
    both = scenario(seed, num_blocks)
    kinds = {e[0] for e in both.log}
    assert "store" in kinds  # the scenario exercised the tier
    if num_blocks == 6:
        assert any(e[0] == "store" and e[3] for e in both.log)  # and evicted


def test_tail_first_and_finished_head_last_as_vllm():
    """A hand-sized trace of vLLM's LRU ranks (cpu/policies/lru.py:1102, 1148): request 0
    stores blocks 1-3 (rank (r0, -end): tail lowest), request 1 stores 11-12 and finishes (fresh
    ranks, tail first); a store that must evict takes request 0's tail first, then its head,
    and request 1's blocks last."""
    both = Both(5)
    a = [(1, 16), (2, 32), (3, 48)]
    b = [(11, 16), (12, 32)]
    both.new_request(0, a)
    both.new_request(1, b)
    _, blocks = both.store(0, a)
    both.complete_store([1, 2, 3], blocks, 0)
    _, blocks = both.store(1, b)
    both.complete_store([11, 12], blocks, 1)
    both.finish(1)
    c = [(21, 16), (22, 32), (23, 48)]
    both.new_request(2, c)
    both.store(2, c)
    assert both.log[-1] == ("store", 2, (21, 22, 23), (1, 2, 3))
    d = [(31, 16)]
    both.new_request(3, d)
    both.store(3, d)  # 21-23 are pending (not evictable): request 1's tail goes
    assert both.log[-1] == ("store", 3, (31,), (12,))
