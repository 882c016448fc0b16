"""A heap of free blocks with lazy deletion, shared by the policies that order by a key."""

from __future__ import annotations

import heapq


class VersionedHeap:
    """Heap entries are invalidated by bumping a per-block version (lazy deletion). A subclass
    defines `__len__` (its number of free blocks), which bounds how many stale entries pile up."""

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
