"""CPU offload tier (vLLM 0.33's native KV offloading, `--kv-offloading-size GiB`): a second pool
of KV blocks in host memory behind the GPU prefix cache. docs/prefix_caching.md ("CPU offload
tier") cites the vLLM lines each step follows.

    GPU pool (paged.py)            CPU tier (HostBlockPool, one CPU block per GPU block)
    [b4 b9 b2 ...] --store-->      [c1 c7 c3 ...]   written after the step that completed them
            <--load (async)--                       read before the request runs again

1. store (vLLM's build_connector_meta -> prepare_store; the copy starts with the next step):
   after each step, every *prompt* block the step completed that the request has not offered
   yet is offered (offload_prompt_only). A block the tier lacks gets a CPU block, evicting the
   policy's first evictable blocks; if too few are evictable the whole offer fails and is
   retried next step. Its write queues on the GPU->CPU link; the block is *pending* until the
   write ends, then *ready* and evictable. A ready block offered again counts as a reuse.
2. lookup (get_num_new_matched_tokens, at admission): after the GPU prefix hit, the longest run
   of ready CPU blocks that follows it (full blocks of the request's tokens). A pending block,
   or one another request is loading, in the run defers the request (vLLM returns None).
3. load (update_state_after_alloc; vLLM's async load, WAITING_FOR_REMOTE_KVS): the request's
   GPU blocks for GPU hit + CPU hit are allocated (the loaded ones hashed only once loaded), it
   leaves the queue, the read queues on the CPU->GPU link. When it ends the request goes back
   to the front of the waiting queue with those tokens computed (all of them: the last one is
   recomputed). The load time is not charged to any step: the other requests keep running.
4. evict: `lru` is vLLM's LRUCachePolicy order: a block ranks (rank of the request that stored
   or reused it, -its end position) while that request runs (its tail goes first), and gets a
   fresh rank when the request finishes, tail first (so a finished request's head is evicted
   last); the lowest rank is evicted first. `lru_ttl` (ours): blocks not accessed for ttl_s go
   first, oldest access first, then `lru`.
Invariants: every CPU block is free, pending (being written, ref count 1), ready-evictable (in
the free queue, hashed) or being loaded (ref count >= 1, ready); a load pins its blocks.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.config.registry import Registry
from simulator.engine.kvcache.block_pool import BlockPool, PoolClock
from simulator.engine.kvcache.eviction.heap import VersionedHeap
from simulator.engine.kvcache.eviction.lru_ttl import LRUWithTTL, LRUWithTTLParams
from simulator.engine.protocols import OffloadStats
from simulator.engine.swap import HostLink
from simulator.errors import ConfigError
from simulator.workload.request import Request

if TYPE_CHECKING:
    from simulator.engine.kvcache.paged import PagedAllocator

GIB = 1 << 30
PAGE_BYTES = 4096  # vLLM rounds a CPU block up to mmap.PAGESIZE (cpu/spec.py:120)

# engine.kv_offloading_eviction_policy -> policy class; built as cls(pool, block_ids, **params)
OFFLOAD_EVICTION_POLICIES: Registry = Registry("kv_offloading_eviction_policy")


class LookupResult(Enum):  # vLLM's kv_offload/base.py:121
    MISS = 0
    HIT = 1
    HIT_PENDING = 2


class HostBlockPool(BlockPool):
    """A BlockPool of CPU blocks: also each block's vLLM LRU rank (what `lru` orders by) and
    whether it is ready (its write has ended)."""

    def __init__(self, num_blocks: int, eviction: str, eviction_params: dict | None) -> None:
        self.rank: list[tuple[int, int]] = [(0, 0)] * num_blocks  # read while the policy is built
        super().__init__(num_blocks, eviction, eviction_params, OFFLOAD_EVICTION_POLICIES,
                         "engine.kv_offloading_eviction_params")
        self.ready = [False] * num_blocks


@OFFLOAD_EVICTION_POLICIES.register("lru")
class RankedLRU(VersionedHeap):
    """vLLM 0.33's LRUCachePolicy (cpu/policies/lru.py): evictable blocks by rank, lowest first;
    blocks without a hash (never used) before all of them (vLLM allocates fresh chunks first)."""

    def __init__(self, pool: HostBlockPool, block_ids: range) -> None:
        super().__init__(pool.num_blocks)
        self.pool = pool
        self._free: set[int] = set()
        self._seq = 0
        self.prepend(list(block_ids))

    def __len__(self) -> int:
        return len(self._free)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._free

    def append(self, block_id: int) -> None:
        self._free.add(block_id)
        self._push((0, *self.pool.rank[block_id]), block_id)

    def prepend(self, block_ids: list[int]) -> None:
        for b in reversed(block_ids):  # ahead of every ranked block and of earlier prepends
            self._seq += 1
            self._free.add(b)
            self._push((-1, -self._seq, 0), b)

    def remove(self, block_id: int) -> None:
        self._free.remove(block_id)
        self._invalidate(block_id)

    def reorder(self, block_id: int) -> None:
        """A free block's rank changed: its entry moves (the old one is invalidated)."""
        self._push((0, *self.pool.rank[block_id]), block_id)

    def popleft(self) -> int:
        block_id = self._peek_valid()[-1]
        self._free.remove(block_id)
        self._invalidate(block_id)
        return block_id


@OFFLOAD_EVICTION_POLICIES.register("lru_ttl", params=LRUWithTTLParams)
class RankedLRUWithTTL(LRUWithTTL):
    """eviction/lru_ttl.py over vLLM's ranked LRU: blocks not accessed (stored, loaded or
    offered again) for ttl_s go first, oldest access first; then `lru`."""

    fallback = RankedLRU

    def reorder(self, block_id: int) -> None:
        self._lru.reorder(block_id)  # a rank changed, not the last access


class CPUTier(PoolClock):
    """The CPU blocks' bookkeeping, keyed by block hash: vLLM's CPUOffloadingManager
    (cpu/manager.py) with the LRUCachePolicy ranks. `keys` are (block hash, end token) pairs
    in prefix order (vLLM's offload keys and their positions)."""

    def __init__(self, num_blocks: int, eviction: str = "lru", eviction_params: dict | None = None) -> None:
        self.pool = HostBlockPool(num_blocks + 1, eviction, eviction_params)  # + the null block
        self.num_blocks = num_blocks
        self._next_rank = 0
        self._req_rank: dict[int, int] = {}  # request id -> its rank (vLLM's _RequestRank)
        self._seen: dict[int, dict[int, int]] = {}  # request id -> {hash: end token} it accessed

    def lookup(self, block_hash: int) -> LookupResult:
        b = self.pool.get_cached_block(block_hash)
        if b is None:
            return LookupResult.MISS
        return LookupResult.HIT if self.pool.ready[b] else LookupResult.HIT_PENDING

    def _request_rank(self, rid: int) -> int:
        rank = self._req_rank.get(rid)
        if rank is None:
            self._next_rank += 1
            rank = self._req_rank[rid] = self._next_rank
        return rank

    def _set_rank(self, b: int, rank: tuple[int, int]) -> None:
        pool = self.pool
        pool.rank[b] = rank
        if b in pool.free_queue:  # evictable: re-queued under its new rank (vLLM's heap push)
            pool.free_queue.reorder(b)

    def _access(self, rid: int, keys: Sequence[tuple[int, int]]) -> None:
        """vLLM's _record_request_cache_access -> on_request_access: keys the request accesses
        for the first time rank (request rank, -end token) unless they rank higher already."""
        seen = self._seen.setdefault(rid, {})
        new = [(h, p) for h, p in keys if h not in seen]
        if not new:
            return
        seen.update(new)
        rr = self._request_rank(rid)
        get = self.pool.get_cached_block
        for h, p in new:
            b = get(h)
            if b is not None and self.pool.rank[b] < (rr, -p):
                self._set_rank(b, (rr, -p))

    def prepare_store(self, rid: int, keys: Sequence[tuple[int, int]]) -> list[int] | None:
        """vLLM's prepare_store. Steps: 1. split the offer into blocks to store (absent) and
        ready ones (a reuse; pending ones are neither); 2. record the access; 3. nothing absent:
        []; 4. None when the free and evictable blocks, less the offer's own, are too few;
        5. pop new blocks (evicting), each hashed, pending, ranked (request rank, -end token).
        The offer's ready blocks are never evicted for it."""
        pool = self.pool
        get = pool.get_cached_block
        to_store, protected = [], []
        for h, p in keys:  # 1.
            b = get(h)
            if b is None:
                to_store.append((h, p))
            elif pool.ready[b]:
                protected.append(b)
        recorded = {h for h, _ in to_store}
        recorded.update(pool.block_hash[b] for b in protected)
        self._access(rid, [(h, p) for h, p in keys if h in recorded])  # 2.
        queue = pool.free_queue
        # the offer's own blocks are not evicted for it (vLLM's `protected`); out of the queue
        # meanwhile, and back with their access stamped (lru_ttl's clock: they were accessed)
        held = [b for b in protected if b in queue]
        for b in held:
            queue.remove(b)
        now = pool.now
        for b in protected:
            pool.last_access_s[b] = now
        new: list[int] | None = []
        if len(to_store) > len(queue):  # 4.
            new = None
        elif to_store:
            new = pool.get_new_blocks(len(to_store))  # 5.
        for b in held:
            queue.append(b)
        if not new:  # 3. or 4.
            return new
        rr = self._request_rank(rid)
        for b, (h, p) in zip(new, to_store):
            pool.cache_block(b, h)
            pool.ready[b] = False
            pool.rank[b] = (rr, -p)
        return new

    def complete_store(self, blocks: list[int]) -> None:
        pool = self.pool
        for b in blocks:
            pool.ready[b] = True
        pool.free_blocks(blocks)  # ref count 1 -> 0: evictable

    def prepare_load(self, rid: int, keys: Sequence[tuple[int, int]]) -> list[int]:
        """vLLM's prepare_load: the ready blocks are pinned (out of the eviction order) and
        their access recorded."""
        pool = self.pool
        blocks = [pool.get_cached_block(h) for h, _ in keys]
        pool.touch(blocks)
        self._access(rid, keys)
        return blocks

    def complete_load(self, blocks: list[int]) -> None:
        self.pool.free_blocks(blocks)

    def request_finished(self, rid: int) -> None:
        """vLLM's on_request_finished -> LRUCachePolicy._update_recency: every block the
        request accessed gets a fresh rank, tail first (its head ends up most recent)."""
        self._req_rank.pop(rid, None)
        seen = self._seen.pop(rid, None)
        if not seen:
            return
        get = self.pool.get_cached_block
        for h, _ in sorted(seen.items(), key=lambda kv: -kv[1]):
            b = get(h)
            if b is not None:
                self._next_rank += 1
                self._set_rank(b, (self._next_rank, 0))

    def where(self) -> dict[str, int]:
        """How many CPU blocks are free / pending / ready and evictable / being loaded (tests)."""
        pool = self.pool
        out = {"free": 0, "pending": 0, "ready": 0, "loading": 0}
        for b in range(1, pool.num_blocks):
            if pool.ref_cnt[b] == 0:
                out["ready" if pool.block_hash[b] is not None else "free"] += 1
            else:
                out["loading" if pool.ready[b] else "pending"] += 1
        return out


class OffloadConnector:
    """The scheduler's side of the tier (vLLM's OffloadingConnectorScheduler): which of a
    request's blocks are looked up, loaded and offered, and when; transfers over the host link
    (swap.HostLink), one FIFO per direction (vLLM's CPUOffloadingWorker: a store handler and a
    load handler, each running its transfers in submission order)."""

    def __init__(self, kv: PagedAllocator, tier: CPUTier, block_bytes: int, link_gbps: float,
                 latency_s: float, size_gib: float) -> None:
        self.kv = kv
        self.tier = tier
        self.block_size = kv.block_size
        self.block_bytes = block_bytes
        self.to_gpu = HostLink(link_gbps, latency_s)  # loads
        self.to_cpu = HostLink(link_gbps, latency_s)  # stores
        self._next_store: dict[int, int] = {}  # request id -> first prompt block not offered yet
        self._loads: list[tuple[float, int, Request, list[int], list[int]]] = []  # heap by end
        self._stores: deque[tuple[float, list[int]]] = deque()  # FIFO: ends in order
        self._being_loaded: dict[int, int] = {}  # hash -> loads reading it (vLLM's _chunks_being_loaded)
        self._reserved: dict[int, int] = {}  # loading request -> blocks it still needs to run
        self._finished: list[int] = []  # finished last commit: re-ranked after this commit's offers
        self._stats = OffloadStats(size_gib=size_gib, num_cpu_blocks=tier.num_blocks,
                                  block_size=kv.block_size)

    @property
    def stats(self) -> OffloadStats:
        self._stats.num_evictions = self.tier.pool.num_evictions
        return self._stats

    @property
    def num_loading(self) -> int:
        return len(self._loads)

    def _keys(self, req: Request, first: int, last: int) -> list[tuple[int, int]]:
        hashes = self.kv.hasher.hashes(req, last)
        bs = self.block_size
        return [(hashes[j], (j + 1) * bs) for j in range(first, last)]

    # --- admission -----------------------------------------------------------------------
    def match(self, req: Request, num_computed: int) -> int | None:
        """Tokens past the GPU hit (`num_computed`, block-aligned) the tier can load: the run of
        ready blocks that follows it, over the full blocks of the request's tokens; None: a block
        of the run is pending or being loaded (vLLM defers the request). Resets the request's
        store offers to its first block (vLLM's get_num_new_matched_tokens)."""
        self._next_store[req.req_id] = 0
        bs = self.block_size
        first, last = num_computed // bs, req.num_tokens // bs
        if last <= first:
            return 0
        lookup, hit = self.tier.lookup, LookupResult.HIT
        hashes = self.kv.hasher.hashes(req, last)
        n = 0
        for j in range(first, last):
            r = lookup(hashes[j])
            if r is LookupResult.MISS:
                break
            if r is not hit:
                self._stats.num_deferred += 1
                return None
            n += 1
        if n and self._being_loaded and any(hashes[j] in self._being_loaded
                                            for j in range(first, first + n)):
            self._stats.num_deferred += 1
            return None
        return n * bs

    def start_load(self, req: Request, num_computed: int, num_external: int, now: float,
                   full_sequence_must_fit: bool) -> bool:
        """Allocate the request's GPU blocks for `num_computed + num_external` tokens (False: no
        room, it waits) and queue the read of the CPU blocks; the request is out of the queue
        until `poll` returns it."""
        total = num_computed + num_external
        bs = self.block_size
        # vLLM's _inflight_prefill_reserved_blocks: a load holds its blocks with no progress, so
        # it is admitted only if its whole sequence fits beside what loads in flight still need
        need = -(-req.num_tokens // bs) - num_computed // bs
        if need + sum(self._reserved.values()) > self.kv.pool.num_free_blocks:
            return False
        # num_tokens=num_computed: the loaded blocks are hashed when the request runs again
        # (vLLM's delay_cache_blocks), so nobody hits them before they hold their KV
        if self.kv.allocate_slots(req, 0, total, full_sequence_must_fit=full_sequence_must_fit,
                                  num_tokens=num_computed) is None:
            return False
        self._reserved[req.req_id] = max(-(-req.num_tokens // bs) - len(self.kv.req_to_blocks[req.req_id]), 0)
        keys = self._keys(req, num_computed // bs, total // bs)
        self.tier.now = now
        blocks = self.tier.prepare_load(req.req_id, keys)
        nbytes = len(blocks) * self.block_bytes
        end = self.to_gpu.submit(now, nbytes)
        heapq.heappush(self._loads, (end, req.req_id, req, blocks, [h for h, _ in keys]))
        for h, _ in keys:
            self._being_loaded[h] = self._being_loaded.get(h, 0) + 1
        self._next_store[req.req_id] = total // bs  # loaded blocks are not stored back
        req.num_computed_tokens = total
        s = self._stats
        s.num_loads += 1
        s.loaded_blocks += len(blocks)
        s.bytes_loaded += nbytes
        s.load_seconds += self.to_gpu.transfer_s(nbytes)
        s.load_wait_s += end - now
        if not req.num_preemptions:  # first admissions, as the prefix-cache counters
            s.hit_tokens += num_external
        return True

    def poll(self, now: float) -> list[Request]:
        """Transfers that ended by `now` (vLLM reports them after the step they end in): stores
        become ready; loaded requests are returned, in load order, to go back in line."""
        tier = self.tier
        tier.now = now
        stores = self._stores
        while stores and stores[0][0] <= now:
            tier.complete_store(stores.popleft()[1])
        ready = []
        loads = self._loads
        while loads and loads[0][0] <= now:
            _, _, req, blocks, hashes = heapq.heappop(loads)
            tier.complete_load(blocks)
            del self._reserved[req.req_id]
            for h in hashes:
                left = self._being_loaded[h] - 1
                if left:
                    self._being_loaded[h] = left
                else:
                    del self._being_loaded[h]
            if req.num_computed_tokens >= req.num_tokens:
                req.num_computed_tokens = req.num_tokens - 1  # one token computed to sample from
            ready.append(req)
        return ready

    def next_event_s(self) -> float | None:
        """When the next transfer ends (None: none in flight)."""
        ends = [q[0][0] for q in (self._loads, self._stores) if q]
        return min(ends) if ends else None

    # --- after each step -----------------------------------------------------------------
    def offer(self, reqs: list[Request], computed: np.ndarray, n: np.ndarray, tokens: np.ndarray,
              num_out: np.ndarray, finished: list[Request], now: float) -> None:
        """Store offers of the step that just ran (`computed` after it, `n` scheduled in it):
        1. each request's prompt blocks the step completed, not offered yet; 2. the requests
        that finished last commit are re-ranked (vLLM calls on_request_finished after the next
        step's offers); 3. this commit's finished requests wait for the next one."""
        prompt = tokens - num_out
        cand = np.flatnonzero((n > 0) & (computed - n < prompt))
        bs = self.block_size
        self.tier.now = now
        for i in cand.tolist():
            req = reqs[i]
            full = min(int(computed[i]), int(prompt[i])) // bs
            first = self._next_store.get(req.req_id, 0)
            if full > first:
                self._store(req, first, full, now)
        tier = self.tier
        for rid in self._finished:  # 2.
            tier.request_finished(rid)
        self._finished = [r.req_id for r in finished]  # 3.
        for r in finished:
            self._next_store.pop(r.req_id, None)

    def _store(self, req: Request, first: int, last: int, now: float) -> None:
        s = self._stats
        blocks = self.tier.prepare_store(req.req_id, self._keys(req, first, last))
        if blocks is None:  # too few evictable blocks: offered again next step (vLLM)
            s.store_failures += 1
            return
        self._next_store[req.req_id] = last
        if blocks:
            nbytes = len(blocks) * self.block_bytes
            self._stores.append((self.to_cpu.submit(now, nbytes), blocks))
            s.num_stores += 1
            s.stored_blocks += len(blocks)
            s.bytes_stored += nbytes
            s.store_seconds += self.to_cpu.transfer_s(nbytes)


def num_cpu_blocks(size_gib: float, block_bytes: int, tp: int) -> int:
    """vLLM's num_chunks (cpu/spec.py:111-123): kv_offloading_size is summed over the TP ranks,
    each rank keeps its shard of a block, and a block is rounded up to a page."""
    per_block = -(-block_bytes * tp // PAGE_BYTES) * PAGE_BYTES
    return int(size_gib * GIB) // per_block


def check_offload(eng: Any, *, kv_allocator: str, block_bytes: int, tp: int,
                  swap_gib: float) -> dict[str, Any] | None:
    """The tier's one-line errors (None: the tier is off); returns its validated eviction params."""
    size = eng.kv_offloading_size
    if not size:
        return None
    if eng.kv_offloading_backend != "native":
        raise ConfigError(f"engine.kv_offloading_backend {eng.kv_offloading_backend} is not modelled "
                          f"yet (kvsim models native only)")
    if eng.backend != "kvsim":
        raise ConfigError("engine.kv_offloading_size is modelled by the kvsim backend only, "
                          f"got engine.backend {eng.backend}")
    if kv_allocator != "paged" or not eng.enable_prefix_caching:
        raise ConfigError("engine.kv_offloading_size needs the paged allocator with "
                          f"enable_prefix_caching: true, got {kv_allocator} with "
                          f"enable_prefix_caching {str(eng.enable_prefix_caching).lower()}")
    host = eng.host_memory_gib
    if size + swap_gib > host:
        what = f"{size:g} GiB" + (f" + swap_space_gib {swap_gib:g}" if swap_gib else "")
        raise ConfigError(f"engine.kv_offloading_size {what} is more than engine.host_memory_gib "
                          f"{host:g} GiB")
    if num_cpu_blocks(size, block_bytes, tp) < 1:
        raise ConfigError(f"engine.kv_offloading_size {size:g} GiB is smaller than one KV block "
                          f"({block_bytes * tp / 2**20:.3g} MiB over {tp} GPU(s))")
    return OFFLOAD_EVICTION_POLICIES.validate_params(
        eng.kv_offloading_eviction_policy, eng.kv_offloading_eviction_params,
        "engine.kv_offloading_eviction_params")


def build_offload(kv: PagedAllocator, size_gib: float, block_bytes: int, tp: int, eviction: str,
                  eviction_params: dict, link_gbps: float, latency_s: float) -> OffloadConnector:
    tier = CPUTier(num_cpu_blocks(size_gib, block_bytes, tp), eviction, eviction_params)
    return OffloadConnector(kv, tier, block_bytes, link_gbps, latency_s, size_gib)


# --- summary.json `kv_offload` (engine/run.py add_engine_sections merges it in one line) -------
def offload_summary(s: OffloadStats, prefix: dict[str, Any]) -> dict[str, Any]:
    """The tier's counters and the hit rate by tier: prompt tokens found on the GPU (the prefix
    cache) and on the CPU, over the tokens looked up at first admissions (prefix_cache.queries)."""
    q = prefix.get("queries") or 0
    gpu = prefix.get("hits") or 0
    return {
        "size_gib": s.size_gib, "num_cpu_blocks": s.num_cpu_blocks,
        "hit_tokens": s.hit_tokens, "hit_blocks": s.hit_tokens // s.block_size,
        "loads": s.num_loads, "loaded_blocks": s.loaded_blocks,
        "stores": s.num_stores, "stored_blocks": s.stored_blocks, "store_failures": s.store_failures,
        "evictions": s.num_evictions, "deferred_lookups": s.num_deferred,
        "bytes_loaded": s.bytes_loaded, "bytes_stored": s.bytes_stored,
        "bytes_moved": s.bytes_loaded + s.bytes_stored,
        "load_seconds": s.load_seconds, "store_seconds": s.store_seconds,
        "load_wait_s_mean": s.load_wait_s / s.num_loads if s.num_loads else None,
        "hit_rate_by_tier": {"gpu": gpu / q if q else None, "cpu": s.hit_tokens / q if q else None,
                             "total": (gpu + s.hit_tokens) / q if q else None},
    }
