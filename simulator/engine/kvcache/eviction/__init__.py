"""Eviction policies: the order in which free KV blocks are reused (and cached ones evicted),
one module per policy (lru, lru_ttl, lfu), each registered by name in EVICTION_POLICIES."""

from simulator.config.registry import Registry

# engine.eviction_policy -> policy class; built as cls(pool, block_ids, **engine.eviction_params)
EVICTION_POLICIES: Registry = Registry("eviction_policy")

from simulator.engine.kvcache.eviction import lfu, lru, lru_ttl  # noqa: E402,F401  (each registers itself)

__all__ = ["EVICTION_POLICIES"]
