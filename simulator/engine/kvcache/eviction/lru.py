"""`lru` (vLLM's free queue): a FIFO of releases; its head is the next block to reuse.

Freed hashed blocks join the tail (a request's blocks in reverse, so its last blocks go first);
freed blocks without a hash go to the head, since nobody can hit them (vLLM 0.33); a hit takes
a block out; allocation pops the head.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from simulator.engine.kvcache.eviction import EVICTION_POLICIES

if TYPE_CHECKING:
    from simulator.engine.kvcache.block_pool import BlockPool


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
