"""Paged KV cache (vLLM v1): fixed-size blocks, block ids with ref counts, per-request tables,
and prefix caching on full blocks.

NOTE: block 0 is vLLM's null block and is never handed out, so a pool of N blocks has N - 1
usable ones and usage = 1 - free / (N - 1). Free-but-cached blocks count as free.

    free queue (eviction policy; head = next to reuse): [b7, b3, b9, ...]
    allocate: pop from the head; a popped block that still has a hash is evicted then (lazy)
    free: a request's blocks go back tail-first; unhashed ones to the head (reused first),
          hashed ones to the tail (vLLM 0.33)
    hit:  a cached block is `touch`ed: out of the free queue, ref count + 1

Prefix caching (vLLM v1 semantics):
1. Only full blocks are hashed; a hash chains the parent's hash with the block's content
   (prefix.py). A block is cached as soon as an allocation covers its last token, so a
   request admitted in the same step as another can hit blocks still being computed.
2. A lookup walks the request's hashes and stops at the first miss; at most
   num_tokens - 1 tokens can hit (the last token is always computed, to sample from).
   prefix_queries / prefix_hits count a lookup when its request is admitted (first admission
   only), as vLLM's prefix_cache_queries / prefix_cache_hits.
3. Freed hashed blocks keep their hash and stay hittable until popped for reuse.
4. Duplicates are possible (two requests computing the same block concurrently); as in vLLM
   each hash maps to its blocks in caching order and a lookup returns the first.
"""

from __future__ import annotations

from array import array

from simulator.engine.kvcache.base import ALLOCATORS
from simulator.engine.kvcache.eviction import EVICTION_POLICIES
from simulator.engine.kvcache.prefix import BlockHasher
from simulator.workload.request import Request


class BlockPool:
    """Owns every block: ref counts, hashes, the hash map and the free queue (the policy)."""

    def __init__(self, num_blocks: int, eviction: str = "lru", **eviction_params) -> None:
        if num_blocks < 2:
            raise ValueError(f"a block pool needs >= 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.now = 0.0
        self.ref_cnt = [0] * num_blocks
        self.ref_cnt[0] = 1  # null block, permanently held
        self.block_hash: list[int | None] = [None] * num_blocks
        self.last_access_s = [0.0] * num_blocks
        self.freed_s = [0.0] * num_blocks
        self.num_hits = [0] * num_blocks
        self.cached: dict[int, dict[int, None]] = {}  # hash -> {block_id: None}, caching order
        self.free_queue = EVICTION_POLICIES.get(eviction)(self, range(1, num_blocks), **eviction_params)
        self.num_evictions = 0
        self.evicted_idle_s = array("d")  # now - last access, for every evicted cached block

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, block_hash: int) -> int | None:
        blocks = self.cached.get(block_hash)
        return next(iter(blocks)) if blocks else None

    def touch(self, block_ids: list[int]) -> None:
        now = self.now
        for b in block_ids:
            if self.ref_cnt[b] == 0:
                self.free_queue.remove(b)
            self.ref_cnt[b] += 1
            self.num_hits[b] += 1
            self.last_access_s[b] = now

    def get_new_blocks(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise ValueError(f"asked for {n} blocks, {len(self.free_queue)} free")
        now = self.now
        out = []
        for _ in range(n):
            b = self.free_queue.popleft()
            h = self.block_hash[b]
            if h is not None:  # lazy eviction of a cached block
                blocks = self.cached[h]
                del blocks[b]
                if not blocks:
                    del self.cached[h]
                self.block_hash[b] = None
                self.num_evictions += 1
                self.evicted_idle_s.append(now - self.last_access_s[b])
            self.ref_cnt[b] = 1
            self.num_hits[b] = 0
            self.last_access_s[b] = now
            out.append(b)
        return out

    def cache_block(self, block_id: int, block_hash: int) -> None:
        if self.block_hash[block_id] is None:
            self.block_hash[block_id] = block_hash
            self.cached.setdefault(block_hash, {})[block_id] = None

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        """Drop one reference from each block. Blocks reaching 0 that carry no hash go to the
        *front* of the free queue, in order (reused first: nobody can hit them); hashed ones
        join the tail in order (vLLM 0.33 BlockPool.free_blocks: LIFO reuse of uncached
        blocks, FIFO of cached ones)."""
        now = self.now
        first: list[int] = []
        block_hash = self.block_hash
        for b in ordered_blocks:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.freed_s[b] = now
                if block_hash[b] is None:
                    first.append(b)
                else:
                    self.free_queue.append(b)
            elif self.ref_cnt[b] < 0:
                raise AssertionError(f"block {b} freed twice")
        if first:
            self.free_queue.prepend(first)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)


@ALLOCATORS.register("paged")
class PagedAllocator:
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 eviction: str = "lru", eviction_params: dict | None = None,
                 prefix_chunk_tokens: int = 512, **_: object) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, eviction, **(eviction_params or {}))
        self.total_slots = (num_blocks - 1) * block_size
        self.req_to_blocks: dict[int, list[int]] = {}
        self.enable_prefix_caching = enable_prefix_caching
        self.caches_full_blocks = enable_prefix_caching  # scheduler: call us when a block fills
        self.hasher = BlockHasher(block_size, prefix_chunk_tokens)
        self._num_cached: dict[int, int] = {}  # req_id -> how many of its blocks are hashed
        self._pending_hits: dict[int, list[int]] = {}  # lookup result awaiting allocate_slots
        self.prefix_queries = 0  # tokens looked up (vLLM's prefix_cache_queries)
        self.prefix_hits = 0  # tokens found (vLLM's prefix_cache_hits)

    @property
    def now(self) -> float:
        return self.pool.now

    @now.setter
    def now(self, value: float) -> None:
        self.pool.now = value

    def max_request_slots(self, req: Request) -> int:
        return -(-req.final_kv_tokens // self.block_size) * self.block_size

    def get_computed_tokens(self, req: Request) -> int:
        """Longest cached prefix of req, in tokens (a multiple of block_size)."""
        if not self.enable_prefix_caching:
            return 0
        num_tokens = req.num_tokens
        max_blocks = (num_tokens - 1) // self.block_size
        hits: list[int] = []
        if max_blocks:
            get = self.pool.get_cached_block
            for h in self.hasher.hashes(req, max_blocks)[:max_blocks]:
                b = get(h)
                if b is None:
                    break
                hits.append(b)
        self._pending_hits[req.req_id] = hits
        return len(hits) * self.block_size

    def allocate_slots(self, req: Request, num_new_tokens: int, num_computed_tokens: int,
                       full_sequence_must_fit: bool = False, num_tokens: int | None = None
                       ) -> int | None:
        """1. take the pending prefix hits (admission only); 2. blocks needed = ceil((computed +
        new) / block_size) - blocks held; 3. None if that plus the hits that are currently free
        exceeds the free blocks, or, with `full_sequence_must_fit` (vLLM's admission gate
        scheduler_reserve_full_isl), if the blocks for all req.num_tokens do not fit;
        4. touch the hits, pop new blocks; 5. hash newly full blocks up to min(computed + new,
        num_tokens) (`num_tokens`: the request's current token count when the caller keeps it,
        default req.num_tokens)."""
        rid = req.req_id
        looked_up = rid in self._pending_hits
        hits = self._pending_hits.pop(rid, None) or []
        blocks = self.req_to_blocks.get(rid)
        held = (len(blocks) if blocks else 0) + len(hits)
        total_tokens = num_computed_tokens + num_new_tokens
        need = -(-total_tokens // self.block_size) - held
        pool = self.pool
        if need > 0 or hits or full_sequence_must_fit:
            free_hits = sum(1 for b in hits if pool.ref_cnt[b] == 0)
            if full_sequence_must_fit and (max(-(-req.num_tokens // self.block_size) - held, 0)
                                           + free_hits > pool.num_free_blocks):
                return None
            if max(need, 0) + free_hits > pool.num_free_blocks:
                return None
            if hits:
                pool.touch(hits)
            new = pool.get_new_blocks(need) if need > 0 else []
            if blocks is None:
                blocks = self.req_to_blocks[rid] = hits + new
                self._num_cached[rid] = len(hits)
            else:
                blocks.extend(new)
            held = len(blocks)
        if looked_up and not req.num_preemptions:
            # vLLM 0.33 (KVCacheManager.record_prefix_cache_stats): counted when the looked-up
            # request is admitted, not on every lookup; a re-admitted preempted request goes
            # to separate preempted_* counters, not to these
            self.prefix_queries += req.num_tokens
            self.prefix_hits += len(hits) * self.block_size
        if self.enable_prefix_caching:
            self._cache_full_blocks(req, blocks, min(total_tokens, req.num_tokens
                                                     if num_tokens is None else num_tokens))
        return held * self.block_size

    def allocate_slots_many(self, reqs: list[Request], num_new: list[int],
                            num_computed: list[int], num_tokens: list[int] | None = None
                            ) -> list[int]:
        """allocate_slots for running requests in order, stopping at the first that does not
        fit; returns the capacities of those served. Same blocks, same order as one call each:
        running requests have no pending prefix hits, so each just pops its new blocks.
        `num_tokens`: each request's current token count (default req.num_tokens)."""
        bs = self.block_size
        pool = self.pool
        free = pool.num_free_blocks
        tables = self.req_to_blocks
        needs = []
        for req, n, c in zip(reqs, num_new, num_computed):
            table = tables.get(req.req_id)
            need = -(-(c + n) // bs) - (len(table) if table else 0)
            if need > free:
                break
            free -= need
            needs.append(need)
        new = pool.get_new_blocks(sum(needs))
        caps = []
        pos = 0
        caching = self.enable_prefix_caching
        for k, need in enumerate(needs):
            req = reqs[k]
            table = tables.get(req.req_id)
            if table is None:
                table = tables[req.req_id] = []
                self._num_cached[req.req_id] = 0
            if need:
                table.extend(new[pos:pos + need])
                pos += need
            if caching:
                self._cache_full_blocks(req, table, min(num_computed[k] + num_new[k], req.num_tokens
                                                        if num_tokens is None else num_tokens[k]))
            caps.append(len(table) * bs)
        return caps

    def _cache_full_blocks(self, req: Request, blocks: list[int], num_tokens: int) -> None:
        done = self._num_cached.get(req.req_id, 0)
        full = num_tokens // self.block_size
        if full > done:
            hashes = self.hasher.hashes(req, full)
            cache = self.pool.cache_block
            for j in range(done, full):
                cache(blocks[j], hashes[j])
            self._num_cached[req.req_id] = full

    def free(self, req: Request, now: float = 0.0) -> None:
        """Release req's blocks tail-first; full blocks not yet hashed (filled by decoding, see
        Scheduler) are hashed first, so they stay hittable exactly as if hashed when filled."""
        if self.enable_prefix_caching and req.req_id in self.req_to_blocks:
            self._cache_full_blocks(req, self.req_to_blocks[req.req_id],
                                    min(req.num_computed_tokens, req.num_tokens))
        blocks = self.req_to_blocks.pop(req.req_id, None)
        self._num_cached.pop(req.req_id, None)
        self._pending_hits.pop(req.req_id, None)
        if blocks:
            self.pool.free_blocks(blocks[::-1])

    def can_fit(self, token_counts: list[int]) -> bool:
        bs = self.block_size
        return sum(-(-t // bs) for t in token_counts) <= self.pool.num_free_blocks

    @property
    def used_slots(self) -> int:
        return (self.pool.num_blocks - 1 - self.pool.num_free_blocks) * self.block_size

    @property
    def usage(self) -> float:
        return self.pool.usage
