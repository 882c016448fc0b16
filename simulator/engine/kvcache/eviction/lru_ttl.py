"""`lru_ttl`: `lru`, except that blocks whose content has not been *accessed* (allocated or hit)
for more than `ttl_s` are evicted before all others, oldest access first.

It differs from `lru` when a block is released long after its last access (the prompt of a
long-running request that nobody reused): `lru` treats it as fresh, `lru_ttl` as stale.
NOTE: with "idle" measured from release time, a TTL could never reorder `lru` (the head of the
FIFO is always the longest-idle block), which is why idle counts from last access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field

from simulator.engine.kvcache.eviction import EVICTION_POLICIES
from simulator.engine.kvcache.eviction.heap import VersionedHeap
from simulator.engine.kvcache.eviction.lru import LRU
from simulator.engine.protocols import PluginParams

if TYPE_CHECKING:
    from simulator.engine.kvcache.block_pool import BlockPool


class LRUWithTTLParams(PluginParams):
    # engine.eviction_ttl_s (default 60 s) fills this when engine.eviction_params omits it
    ttl_s: float = Field(60.0, gt=0, allow_inf_nan=False)  # seconds since last access


@EVICTION_POLICIES.register("lru_ttl", params=LRUWithTTLParams)
class LRUWithTTL(VersionedHeap):
    # the order after the stale blocks (the CPU offload tier swaps in vLLM's ranked LRU)
    fallback: type = LRU

    def __init__(self, pool: BlockPool, block_ids: range, ttl_s: float = 60.0) -> None:
        super().__init__(pool.num_blocks)
        self.pool = pool
        self.ttl_s = ttl_s
        self._lru = self.fallback(pool, block_ids)
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
        """1. the least recently accessed free block, if idle for more than ttl_s; 2. else the
        LRU head."""
        top = self._peek_valid()
        if top is not None and top[0] < self.pool.now - self.ttl_s:
            block_id = top[-1]
            self._lru.remove(block_id)
        else:
            block_id = self._lru.popleft()
        self._invalidate(block_id)
        return block_id
