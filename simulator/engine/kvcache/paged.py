"""Paged KV cache (vLLM v1's KVCacheManager): fixed-size blocks from a BlockPool (block_pool.py),
a block table per request, and prefix caching on full blocks.

    req_to_blocks[r] = [b4, b9, b2]     tokens [0, 16) in b4, [16, 32) in b9, [32, 40) in b2
                                        (block_size 16; b2 is partly filled, not yet hashed)

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

import numpy as np

from simulator.engine.kvcache import ALLOCATORS
from simulator.engine.kvcache.block_pool import PoolClock, make_block_pool
from simulator.engine.kvcache.prefix import BlockHasher
from simulator.engine.protocols import KVContext, KVStats
from simulator.workload.request import Request


@ALLOCATORS.register("paged")
def build_paged(ctx: KVContext) -> PagedAllocator:
    """engine.kv_allocator paged: num_gpu_blocks blocks of block_size (no params of its own)."""
    return PagedAllocator(ctx.num_gpu_blocks, ctx.block_size, ctx.enable_prefix_caching,
                          ctx.eviction_policy, ctx.eviction_params, ctx.prefix_chunk_tokens)


class PagedAllocator(PoolClock):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = False,
                 eviction: str = "lru", eviction_params: dict | None = None,
                 prefix_chunk_tokens: int = 512) -> None:
        self.block_size = block_size
        # without prefix caching no block is hashed: a list-backed pool (same ids, same order)
        self.pool = make_block_pool(num_blocks, eviction, eviction_params, enable_prefix_caching)
        # whether take_decode_blocks reads its step times (the pool keeps access times)
        self.decode_stamps = self.pool.keeps_access_times
        self.total_slots = (num_blocks - 1) * block_size
        self.req_to_blocks: dict[int, list[int]] = {}
        self.enable_prefix_caching = enable_prefix_caching
        self.caches_full_blocks = enable_prefix_caching  # scheduler: call us when a block fills
        self.hasher = BlockHasher(block_size, prefix_chunk_tokens)
        self._num_cached: dict[int, int] = {}  # req_id -> how many of its blocks are hashed
        self._pending_hits: dict[int, list[int]] = {}  # lookup result awaiting allocate_slots
        self.prefix_queries = 0  # tokens looked up (vLLM's prefix_cache_queries)
        self.prefix_hits = 0  # tokens found (vLLM's prefix_cache_hits)
        # decode_gauges' (used slots, usage) by free-block count, made at the first run
        self._gauge_tables: tuple[np.ndarray, np.ndarray] | None = None

    def max_request_slots(self, req: Request) -> int:
        return -(-req.final_kv_tokens // self.block_size) * self.block_size

    def _cached_prefix(self, req: Request) -> list[int]:
        """The blocks holding req's longest cached prefix (at most num_tokens - 1 tokens)."""
        max_blocks = (req.num_tokens - 1) // self.block_size
        hits: list[int] = []
        if max_blocks:
            get = self.pool.get_cached_block
            for h in self.hasher.hashes(req, max_blocks)[:max_blocks]:
                b = get(h)
                if b is None:
                    break
                hits.append(b)
        return hits

    def get_computed_tokens(self, req: Request) -> int:
        """Longest cached prefix of req, in tokens (a multiple of block_size); its blocks are
        held for req's next allocate_slots."""
        if not self.enable_prefix_caching:
            return 0
        hits = self._pending_hits[req.req_id] = self._cached_prefix(req)
        return len(hits) * self.block_size

    def lookup_prefix(self, req: Request) -> int:
        """get_computed_tokens without holding the hits (the pool is not changed; req's block
        hashes are computed and kept on req, as a later lookup would)."""
        if not self.enable_prefix_caching:
            return 0
        return len(self._cached_prefix(req)) * self.block_size

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
            free_hits = sum(1 for b in hits if pool.ref_cnt[b] == 0) if hits else 0
            num_free = pool.num_free_blocks
            if full_sequence_must_fit and (max(-(-req.num_tokens // self.block_size) - held, 0)
                                           + free_hits > num_free):
                return None
            if max(need, 0) + free_hits > num_free:
                return None
            if hits:
                pool.touch(hits)
            new = pool.get_new_blocks(need) if need > 0 else []
            if blocks is None:
                blocks = self.req_to_blocks[rid] = hits + new if hits else new
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
        running requests have no pending prefix hits, so each just pops its new blocks
        (`_allocate_many`); then, with prefix caching, each served request's newly full blocks
        are hashed, in order (hashing takes no block, so it may follow all the pops).
        `num_tokens`: each request's current token count (default req.num_tokens)."""
        caps = self._allocate_many(reqs, num_new, num_computed)
        if self.enable_prefix_caching:
            tables = self.req_to_blocks
            for k, req in enumerate(reqs[:len(caps)]):
                self._cache_full_blocks(req, tables[req.req_id], min(
                    num_computed[k] + num_new[k], req.num_tokens if num_tokens is None else num_tokens[k]))
        return caps

    def _allocate_many(self, reqs: list[Request], num_new: list[int],
                       num_computed: list[int]) -> list[int]:
        """allocate_slots_many's blocks: in order, each request takes the blocks it lacks from
        the pool (the first the free blocks cannot serve stops it); a request with no table yet
        gets one (even if it takes no block). Returns the capacities of those served."""
        bs = self.block_size
        tables = self.req_to_blocks
        take = self.pool.get_new_blocks
        free = self.pool.num_free_blocks
        caps = []
        for req, n, c in zip(reqs, num_new, num_computed):
            blocks = -(-(c + n) // bs)
            table = tables.get(req.req_id)
            if table is None:
                if blocks > free:
                    break
                free -= blocks
                tables[req.req_id] = take(blocks)
                self._num_cached[req.req_id] = 0
            else:
                need = blocks - len(table)
                if need <= 0:  # holds what it needs (or more)
                    caps.append(len(table) * bs)
                    continue
                if need > free:
                    break
                free -= need
                table += take(need)
            caps.append(blocks * bs)
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

    def free(self, req: Request) -> None:
        """Release req's blocks tail-first; full blocks not yet hashed (filled by decoding, see
        Scheduler) are hashed first, so they stay hittable exactly as if hashed when filled."""
        if self.enable_prefix_caching and req.req_id in self.req_to_blocks:
            self._cache_full_blocks(req, self.req_to_blocks[req.req_id],
                                    min(req.num_computed_tokens, req.num_tokens))
        blocks = self.req_to_blocks.pop(req.req_id, None)
        self._num_cached.pop(req.req_id, None)
        self._pending_hits.pop(req.req_id, None)
        if blocks:
            self.pool.free_table(blocks)

    # --- event-level advance (engine/advance.py) ------------------------------------------
    def decode_room(self) -> int | None:
        """Blocks pure-decode steps may take in one run (None: no runs; with prefix caching a
        block filled by decoding is hashed and may be hit, so every step goes through the loop)."""
        return None if self.enable_prefix_caching else len(self.pool.free_queue)

    def admission_fits(self, req: Request, num_new_tokens: int, full_sequence_must_fit: bool) -> bool:
        """Whether allocate_slots could serve a waiting request's first allocation now (no side
        effects; True where it cannot tell: a request holding blocks or prefix hits)."""
        rid = req.req_id
        if self.enable_prefix_caching or rid in self.req_to_blocks or rid in self._pending_hits:
            return True
        bs = self.block_size
        free = self.pool.num_free_blocks
        if full_sequence_must_fit and -(-req.num_tokens // bs) > free:
            return False
        return -(-num_new_tokens // bs) <= free

    def take_decode_blocks(self, req_ids: list[int], times: np.ndarray | None) -> None:
        """One new block for each entry (a request id), popped in order (as
        allocate_slots_many pops them step after step), stamped with its step's start time
        (`times`: None where the pool keeps no access times, `decode_stamps`)."""
        pool = self.pool
        new = pool.get_new_blocks(len(req_ids))
        tables = self.req_to_blocks
        for rid, b in zip(req_ids, new):
            tables[rid].append(b)
        if times is not None:
            pool.stamp_access(new, times)

    def decode_gauges(self, taken: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(used_slots, usage) after each step of a run, `taken` blocks into it (cumulative),
        as stats() computes them; taken blocks are already out of the free queue."""
        return self.free_gauges((len(self.pool.free_queue) + int(taken[-1])) - taken)

    # a decode run may go on past a finish: the blocks a finished request frees are free blocks
    # like any other (free_gauges reads the gauges off the free-block count alone)
    decode_run_frees = True

    def free_gauges(self, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(used_slots, usage) at each free-block count of `free`, as stats() computes them."""
        tables = self._gauge_tables
        if tables is None:  # by free-block count: stats()' values, computed once
            nb = self.pool.num_blocks
            counts = np.arange(nb, dtype=np.int64)
            tables = self._gauge_tables = ((nb - 1 - counts) * self.block_size, 1.0 - counts / (nb - 1))
        return tables[0][free], tables[1][free]

    def stats(self) -> KVStats:
        pool = self.pool
        free = len(pool.free_queue)
        used = (pool.num_blocks - 1 - free) * self.block_size
        usage = 1.0 - free / (pool.num_blocks - 1)  # BlockPool.usage, inlined (every step)
        if not self.enable_prefix_caching:
            return KVStats(used, usage)
        return KVStats(used, usage, self.prefix_queries, self.prefix_hits, pool.num_evictions,
                       pool.evicted_idle_s)
