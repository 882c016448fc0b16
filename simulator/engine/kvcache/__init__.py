"""KV-cache managers behind one boundary (vLLM v1's): the scheduler asks, the manager answers.

    get_computed_tokens(req) -> int          prefix-cache hit tokens (0 without caching)
    allocate_slots(req, n, num_computed) -> capacity_tokens | None   None = no room
    free(req)                                 release the request's memory
    can_fit(token_counts) -> bool             would these final sizes fit now (static batching)

The manager never sees queues and never picks victims: on None the *scheduler* preempts and
retries. Both kinds account token states vs allocated slots, so fragmentation is measured.
"""

from simulator.engine.kvcache.base import ALLOCATORS, KVCacheManager, build_allocator
from simulator.engine.kvcache.contiguous import ContiguousAllocator
from simulator.engine.kvcache.paged import BlockPool, PagedAllocator

__all__ = ["ALLOCATORS", "KVCacheManager", "build_allocator", "ContiguousAllocator",
           "BlockPool", "PagedAllocator"]
