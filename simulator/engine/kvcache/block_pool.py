"""BlockPool (vLLM v1): owns every KV block - ref counts, hashes, the hash map and the free queue.

NOTE: block 0 is vLLM's null block and is never handed out, so a pool of N blocks has N - 1
usable ones and usage = 1 - free / (N - 1). Free-but-cached blocks count as free.

    free queue (the eviction policy; head = next to reuse): [b7, b3, b9, ...]
    get_new_blocks: pop from the head; a popped block that still has a hash is evicted then (lazy)
    free_blocks:    a request's blocks come back tail-first; unhashed ones to the head (reused
                    first), hashed ones to the tail (vLLM 0.33)
    touch:          a cached block is hit: out of the free queue, ref count + 1

Invariants: a block is in the free queue exactly when its ref count is 0; a hash maps to its
blocks in caching order (duplicates are possible, a lookup returns the first); the pool keeps
the per-block metadata the policies read (`freed_s`, `last_access_s`, `num_hits`).
"""

from __future__ import annotations

from array import array

import numpy as np

from simulator.config.registry import Registry
from simulator.engine.kvcache.eviction import EVICTION_POLICIES


class BlockPool:
    def __init__(self, num_blocks: int, eviction: str = "lru",
                 eviction_params: dict | None = None, policies: Registry = EVICTION_POLICIES,
                 where: str = "engine.eviction_params") -> None:
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
        # `policies`: the registry the free queue comes from (the CPU offload tier has its own)
        self.free_queue = policies.build(eviction, eviction_params, where, self, range(1, num_blocks))
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

    keeps_access_times = True  # (stamp_access sets them: the eviction policy reads them)

    def stamp_access(self, block_ids: list[int], times: np.ndarray) -> None:
        """Set each block's last access time (blocks taken by a decode run, at their step)."""
        last = self.last_access_s
        for b, t in zip(block_ids, times.tolist()):
            last[b] = t

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

    def free_table(self, table: list[int]) -> None:
        """A request's blocks released, its table given in order (first block first): the
        tail first, as vLLM frees them (free_blocks of the table reversed)."""
        self.free_blocks(table[::-1])

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)


class FreeStack:
    """The `lru` free queue of a pool whose blocks never carry a hash (no prefix caching): every
    freed block goes to the head, so the queue is a stack over the initial FIFO. Kept as one
    Python list whose *end* is the head: popping n blocks is a slice and a delete, a request's
    release one extend (no per-block Python loop, no numpy conversion: the ids go straight from
    and to the tables, which are lists). Pops in exactly the order `LRU` pops
    (tests/test_allocators.py)."""

    def __init__(self, block_ids: range) -> None:
        self._stack: list[int] = list(block_ids[::-1])  # head (next to reuse) last

    def __len__(self) -> int:
        return len(self._stack)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._stack

    def order(self) -> list[int]:
        """Current eviction order, head first (tests and debugging)."""
        return self._stack[::-1]

    def prepend_many(self, block_ids: list[int]) -> None:
        """block_ids[0] becomes the head, block_ids[1] next, ... (LRU.prepend)."""
        self._stack.extend(reversed(block_ids))


class UnhashedBlockPool:
    """BlockPool for `lru` without prefix caching (PagedAllocator picks it, `make_block_pool`):
    no block is ever hashed, so nothing is cached, shared or evicted and the free queue is a
    FreeStack. Allocation and release are a slice or an extend per request, not a loop per
    block; same block ids in the same order as BlockPool. No ref counts (nothing is shared: a
    block is held by the one table it went to), no access times or hit counts (no eviction
    policy runs here). NOTE: with no per-block state the pool cannot tell a block freed twice
    from any other free block; it catches one only once the free blocks outnumber the pool
    (checked at every release). PagedAllocator.free pops a table before it frees it, so the
    allocator never frees one twice; BlockPool (prefix caching, other policies) keeps the
    exact check with its ref counts."""

    num_evictions = 0

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"a block pool needs >= 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.now = 0.0
        self.free_queue = FreeStack(range(1, num_blocks))
        self._free = self.free_queue._stack  # (the list itself: every allocation)
        self.evicted_idle_s = array("d")

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def get_cached_block(self, block_hash: int) -> int | None:
        return None

    def touch(self, block_ids: list[int]) -> None:
        raise AssertionError("an unhashed pool has no cached blocks to touch")

    def cache_block(self, block_id: int, block_hash: int) -> None:
        raise AssertionError("an unhashed pool does not cache blocks (prefix caching is off)")

    def get_new_blocks(self, n: int) -> list[int]:
        """The n head blocks (head first), held: the stack's last n, reversed."""
        free = self._free
        if n > len(free):
            raise ValueError(f"asked for {n} blocks, {len(free)} free")
        if n == 1:  # (a decode step's new block: the common case)
            return [free.pop()]
        if n <= 0:
            return []
        out = free[-n:]
        del free[-n:]
        out.reverse()
        return out

    keeps_access_times = False  # (a decode run need not find its blocks' times)

    def stamp_access(self, block_ids: list[int], times: np.ndarray) -> None:
        """No policy reads access times here (BlockPool keeps them)."""

    def free_blocks(self, ordered_blocks: list[int]) -> None:
        """BlockPool.free_blocks: every block reaching ref count 0 goes to the head, in order
        (every held block has one holder here, so all of them do)."""
        self.free_queue.prepend_many(ordered_blocks)
        self._check_release()

    def free_table(self, table: list[int]) -> None:
        """free_blocks(table[::-1]) (BlockPool.free_table): the table's last block becomes the
        head, so the stack takes the table as it is (no reversal, either way)."""
        self._free.extend(table)
        self._check_release()

    def _check_release(self) -> None:
        if len(self._free) >= self.num_blocks:
            raise AssertionError(f"{len(self._free)} blocks free in a pool of {self.num_blocks - 1}: "
                                 "a block was freed twice")

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)


def make_block_pool(num_blocks: int, eviction: str = "lru", eviction_params: dict | None = None,
                    hashing: bool = True) -> BlockPool | UnhashedBlockPool:
    """The pool a KV manager uses: UnhashedBlockPool when no block will ever be hashed under
    `lru` (same order, list slices instead of a loop per block), else BlockPool with the
    eviction policy."""
    if not hashing and eviction == "lru" and not eviction_params:
        return UnhashedBlockPool(num_blocks)
    return BlockPool(num_blocks, eviction, eviction_params)


class PoolClock:
    """`now` of a KV manager whose clock is its block pool's (paged, hybrid, the CPU tier):
    read from and written to `self.pool.now`."""

    pool: BlockPool | UnhashedBlockPool

    @property
    def now(self) -> float:
        return self.pool.now

    @now.setter
    def now(self, value: float) -> None:
        self.pool.now = value
