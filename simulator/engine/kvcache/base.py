"""The KVCacheManager protocol and the allocator registry."""

from __future__ import annotations

from typing import Protocol

from simulator.config.registry import Registry
from simulator.workload.request import Request


class KVCacheManager(Protocol):
    name: str
    block_size: int  # allocation granularity in tokens (1 for contiguous)
    total_slots: int  # token slots the pool holds

    def max_request_slots(self, req: Request) -> int:
        """Slots this request would occupy at its final size (reservation or blocks)."""
        ...

    def get_computed_tokens(self, req: Request) -> int: ...

    def allocate_slots(self, req: Request, num_new_tokens: int, num_computed_tokens: int,
                       full_sequence_must_fit: bool = False,
                       num_tokens: int | None = None) -> int | None: ...

    def allocate_slots_many(self, reqs: list[Request], num_new: list[int],
                            num_computed: list[int], num_tokens: list[int] | None = None
                            ) -> list[int]:
        """allocate_slots for each in order, stopping at the first failure; returns the
        capacities of those served (a fast path for the running batch)."""
        ...

    def free(self, req: Request) -> None: ...

    def can_fit(self, token_counts: list[int]) -> bool: ...

    @property
    def used_slots(self) -> int:
        """Slots currently allocated or reserved (what vLLM's usage gauge counts)."""
        ...

    @property
    def usage(self) -> float:
        """vLLM's kv_cache_usage: share of the pool not free."""
        ...


ALLOCATORS: Registry = Registry("kv_allocator")


def build_allocator(name: str, **kwargs) -> KVCacheManager:
    return ALLOCATORS.get(name)(**kwargs)
