"""Eviction policies: the order in which *free* blocks are reused (and cached ones evicted).

Only blocks with ref count 0 are ever here. Popping a block that still carries a hash evicts
it from the prefix cache (lazy eviction, as vLLM). Each policy sees per-block metadata kept
by the BlockPool: `freed_s` (when its ref count last fell to 0), `last_access_s` (when it was
last allocated or hit by a prefix lookup) and `num_hits`.

- `lru` (vLLM): a FIFO of releases. Freed hashed blocks join the tail (a request's blocks in
  reverse, so its last blocks go first); freed blocks without a hash go to the head, since
  nobody can hit them (vLLM 0.33); a hit takes a block out; allocation pops the head.
  Every policy reuses unhashed blocks first (`prepend`).
- `lru_ttl`: `lru`, except that blocks whose content has not been *accessed* (allocated or hit)
  for more than `ttl_s` are evicted before all others, oldest access first. It differs from
  `lru` when a block is released long after its last access (the prompt of a long-running
  request that nobody reused): `lru` treats it as fresh, `lru_ttl` as stale.
  NOTE: with "idle" measured from release time, a TTL could never reorder `lru` (the head of
  the FIFO is always the longest-idle block), which is why idle counts from last access.
- `lfu`: fewest prefix hits first, ties by release order: blocks that were reused at least
  once (shared system prompts, session history) outlive one-off long prompts that would flush
  them under `lru` (scan resistance).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from simulator.config.registry import Registry

if TYPE_CHECKING:
    from simulator.engine.kvcache.paged import BlockPool


class EvictionPolicy(Protocol):
    def append(self, block_id: int) -> None: ...  # block's ref count fell to 0
    def prepend(self, block_ids: list[int]) -> None: ...  # freed blocks with no hash: reuse first
    def remove(self, block_id: int) -> None: ...  # a free block was hit (touched)
    def popleft(self) -> int: ...  # the block to reuse next
    def __len__(self) -> int: ...
    def __contains__(self, block_id: int) -> bool: ...


EVICTION_POLICIES: Registry = Registry("eviction_policy")


@EVICTION_POLICIES.register("lru")
class LRU:
    def __init__(self, pool: BlockPool, block_ids: range) -> None:
        self._q: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._q)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._q

    def append(self, block_id: int) -> None:
        self._q[block_id] = None

    def prepend(self, block_ids: list[int]) -> None:
        q = self._q
        for b in reversed(block_ids):
            q[b] = None
            q.move_to_end(b, last=False)

    def remove(self, block_id: int) -> None:
        del self._q[block_id]

    def popleft(self) -> int:
        return self._q.popitem(last=False)[0]

    def order(self) -> list[int]:
        """Current eviction order, head first (tests and debugging)."""
        return list(self._q)


class _Versioned:
    """Heap entries are invalidated by bumping a per-block version (lazy deletion)."""

    def __init__(self, num_blocks: int) -> None:
        self._version = [0] * num_blocks
        self._heap: list[tuple] = []

    def _push(self, key: tuple, block_id: int) -> None:
        self._version[block_id] += 1
        heap = self._heap
        heapq.heappush(heap, (*key, self._version[block_id], block_id))
        if len(heap) > 4 * len(self) + 1024:
            # Stale entries pile up under lazy deletion; drop them so pushes and pops stay
            # O(log free blocks). Entries are unique tuples, so the pop order is unchanged.
            version = self._version
            self._heap = [e for e in heap if e[-2] == version[e[-1]]]
            heapq.heapify(self._heap)

    def _invalidate(self, block_id: int) -> None:
        self._version[block_id] += 1

    def _peek_valid(self):
        heap, version = self._heap, self._version
        while heap and heap[0][-2] != version[heap[0][-1]]:
            heapq.heappop(heap)
        return heap[0] if heap else None


@EVICTION_POLICIES.register("lru_ttl")
class LRUWithTTL(_Versioned):
    def __init__(self, pool: BlockPool, block_ids: range, ttl_s: float = 60.0) -> None:
        super().__init__(pool.num_blocks)
        self.pool = pool
        self.ttl_s = ttl_s
        self._lru = LRU(pool, block_ids)
        for b in block_ids:
            self._push((pool.last_access_s[b],), b)

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._lru

    def append(self, block_id: int) -> None:
        self._lru.append(block_id)
        self._push((self.pool.last_access_s[block_id],), block_id)

    def prepend(self, block_ids: list[int]) -> None:
        self._lru.prepend(block_ids)
        for b in block_ids:
            self._push((self.pool.last_access_s[b],), b)

    def remove(self, block_id: int) -> None:
        self._lru.remove(block_id)
        self._invalidate(block_id)

    def popleft(self) -> int:
        top = self._peek_valid()
        if top is not None and top[0] < self.pool.now - self.ttl_s:
            block_id = top[-1]
            self._lru.remove(block_id)
        else:
            block_id = self._lru.popleft()
        self._invalidate(block_id)
        return block_id


@EVICTION_POLICIES.register("lfu")
class LFU(_Versioned):
    def __init__(self, pool: BlockPool, block_ids: range) -> None:
        super().__init__(pool.num_blocks)
        self.pool = pool
        self._seq = 0
        self._free: set[int] = set()
        for b in block_ids:
            self.append(b)

    def __len__(self) -> int:
        return len(self._free)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._free

    def append(self, block_id: int) -> None:
        self._seq += 1
        self._free.add(block_id)
        self._push((self.pool.num_hits[block_id], self._seq), block_id)

    def prepend(self, block_ids: list[int]) -> None:
        for b in reversed(block_ids):  # ahead of every hashed block and earlier prepends
            self._seq += 1
            self._free.add(b)
            self._push((-1, -self._seq), b)

    def remove(self, block_id: int) -> None:
        self._free.remove(block_id)
        self._invalidate(block_id)

    def popleft(self) -> int:
        block_id = self._peek_valid()[-1]
        self._free.remove(block_id)
        self._invalidate(block_id)
        return block_id
