"""KV-cache managers behind vLLM v1's boundary (protocols.KVCacheManager): the block pool, the paged,
hybrid (a table per KV cache group) and contiguous allocators, prefix block hashes, eviction/ policies."""

from simulator.config.registry import Registry

# engine.kv_allocator -> factory(KVContext, **engine.kv_allocator_params) -> KVCacheManager
ALLOCATORS: Registry = Registry("kv_allocator")

from simulator.engine.kvcache.block_pool import BlockPool  # noqa: E402
from simulator.engine.kvcache.contiguous import ContiguousAllocator  # noqa: E402
from simulator.engine.kvcache.hybrid import HybridAllocator  # noqa: E402
from simulator.engine.kvcache.paged import PagedAllocator  # noqa: E402

__all__ = ["ALLOCATORS", "BlockPool", "ContiguousAllocator", "HybridAllocator", "PagedAllocator"]
