"""Eviction policy `lifo` with a parameter: the most recently released block is reused first.
`unhashed_first`: freed blocks without a hash go ahead of every hashed one (as every built-in
policy does) or simply on top of the stack."""

from __future__ import annotations

from simulator.engine.kvcache.eviction import EVICTION_POLICIES
from simulator.engine.protocols import PluginParams


class LifoParams(PluginParams):
    unhashed_first: bool = True


@EVICTION_POLICIES.register("lifo", params=LifoParams)
class Lifo:
    def __init__(self, pool, block_ids: range, unhashed_first: bool = True) -> None:
        self.unhashed_first = unhashed_first
        self._stack: dict[int, None] = dict.fromkeys(reversed(block_ids))  # top = last key
        self._unhashed: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._stack) + len(self._unhashed)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._stack or block_id in self._unhashed

    def append(self, block_id: int) -> None:
        self._stack[block_id] = None

    def prepend(self, block_ids: list[int]) -> None:
        target = self._unhashed if self.unhashed_first else self._stack
        for b in reversed(block_ids):
            target[b] = None

    def remove(self, block_id: int) -> None:
        (self._stack if block_id in self._stack else self._unhashed).pop(block_id)

    def popleft(self) -> int:
        if self._unhashed:
            return self._unhashed.popitem()[0]
        return self._stack.popitem()[0]
