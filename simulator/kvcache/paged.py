"""Paged KV cache (vLLM v1): fixed-size blocks, block ids with ref counts, per-request tables.

NOTE: block 0 is vLLM's null block and is never handed out, so a pool of N blocks has N - 1
usable ones and usage = 1 - free / (N - 1).

    free queue (head = next to reuse) : [b7, b3, b9, ...]
    allocate: pop from the head        request table: req -> [b1, b2, b5]
    free: push the request's blocks to the tail in reverse (tail blocks first), so a request's
    last blocks are reused first (they are the least likely to be shared).

The free queue order *is* the eviction order; `EvictionPolicy` objects own it so that prefix
caching (issue 5) can plug in LRU / LRU+TTL without touching the pool.
"""

from __future__ import annotations

from collections import OrderedDict

from simulator.kvcache.base import ALLOCATORS
from simulator.request import Request


class LRUFreeQueue:
    """vLLM's free block queue: pop from the head, freed blocks appended at the tail."""

    def __init__(self, block_ids: range) -> None:
        self._q: OrderedDict[int, None] = OrderedDict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._q)

    def popleft(self) -> int:
        return self._q.popitem(last=False)[0]

    def append(self, block_id: int, now: float = 0.0) -> None:
        self._q[block_id] = None

    def remove(self, block_id: int) -> None:
        del self._q[block_id]

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._q


class BlockPool:
    """Owns every block: ref counts and the free queue. Block ids, not counts."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"a block pool needs >= 2 blocks (one is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_cnt = [0] * num_blocks
        self.ref_cnt[0] = 1  # null block, permanently held
        self.free_queue = LRUFreeQueue(range(1, num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def get_new_blocks(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise ValueError(f"asked for {n} blocks, {len(self.free_queue)} free")
        out = [self.free_queue.popleft() for _ in range(n)]
        for b in out:
            self.ref_cnt[b] += 1
        return out

    def free_blocks(self, ordered_blocks: list[int], now: float = 0.0) -> None:
        """Drop one reference from each block; blocks reaching 0 go to the free queue in order."""
        for b in ordered_blocks:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free_queue.append(b, now)
            elif self.ref_cnt[b] < 0:
                raise AssertionError(f"block {b} freed twice")

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / (self.num_blocks - 1)


@ALLOCATORS.register("paged")
class PagedAllocator:
    name = "paged"

    def __init__(self, num_blocks: int, block_size: int, **_: object) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.total_slots = (num_blocks - 1) * block_size
        self.req_to_blocks: dict[int, list[int]] = {}

    def max_request_slots(self, req: Request) -> int:
        return -(-req.final_kv_tokens // self.block_size) * self.block_size

    def get_computed_tokens(self, req: Request) -> int:
        return 0  # prefix caching plugs in here (issue 5)

    def allocate_slots(self, req: Request, num_new_tokens: int, num_computed_tokens: int) -> int | None:
        """1. blocks needed = ceil((computed + new) / block_size) - blocks held;
        2. None if the pool has fewer free; 3. else pop them and extend the table."""
        blocks = self.req_to_blocks.get(req.req_id)
        held = len(blocks) if blocks else 0
        need = -(-(num_computed_tokens + num_new_tokens) // self.block_size) - held
        if need > 0:
            if need > self.pool.num_free_blocks:
                return None
            new = self.pool.get_new_blocks(need)
            if blocks is None:
                self.req_to_blocks[req.req_id] = new
            else:
                blocks.extend(new)
            held += need
        return held * self.block_size

    def free(self, req: Request, now: float = 0.0) -> None:
        blocks = self.req_to_blocks.pop(req.req_id, None)
        if blocks:
            self.pool.free_blocks(blocks[::-1], now)

    def can_fit(self, token_counts: list[int]) -> bool:
        bs = self.block_size
        return sum(-(-t // bs) for t in token_counts) <= self.pool.num_free_blocks

    @property
    def used_slots(self) -> int:
        return (self.pool.num_blocks - 1 - self.pool.num_free_blocks) * self.block_size

    @property
    def usage(self) -> float:
        return self.pool.usage
