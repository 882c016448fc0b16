"""`lfu`: fewest prefix hits first, ties by release order.

Blocks that were reused at least once (shared system prompts, session history) outlive one-off
long prompts that would flush them under `lru` (scan resistance). Freed blocks without a hash
still go first, ahead of every hashed block (as in every policy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.engine.kvcache.eviction import EVICTION_POLICIES
from simulator.engine.kvcache.eviction.heap import VersionedHeap

if TYPE_CHECKING:
    from simulator.engine.kvcache.block_pool import BlockPool


@EVICTION_POLICIES.register("lfu")
class LFU(VersionedHeap):
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
