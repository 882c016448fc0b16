"""KV-cache managers behind vLLM v1's boundary (protocols.KVCacheManager): the block pool, the paged,
hybrid (a table per KV cache group) and contiguous allocators, prefix block hashes, eviction/ policies."""

from simulator.config.registry import Registry

# engine.kv_allocator -> factory(KVContext, **engine.kv_allocator_params) -> KVCacheManager
ALLOCATORS: Registry = Registry("kv_allocator")


def allocate_in_order(kv, reqs: list, num_new: list[int], num_computed: list[int]) -> list[int]:
    """allocate_slots_many for a manager without a batched path: allocate_slots for each in
    order, stopping at the first failure; the capacities of those served."""
    caps = []
    for req, n, c in zip(reqs, num_new, num_computed):
        cap = kv.allocate_slots(req, n, c)
        if cap is None:
            break
        caps.append(cap)
    return caps


from simulator.engine.kvcache.block_pool import BlockPool  # noqa: E402
from simulator.engine.kvcache.contiguous import ContiguousAllocator  # noqa: E402
from simulator.engine.kvcache.hybrid import HybridAllocator  # noqa: E402
from simulator.engine.kvcache.paged import PagedAllocator  # noqa: E402

__all__ = ["ALLOCATORS", "allocate_in_order", "BlockPool", "ContiguousAllocator", "HybridAllocator",
           "PagedAllocator"]
