"""`kv_aware`: least projected KV use = used slots + prompt tokens routed but not yet
scheduled, as a share of the pool (the pending term stops a burst from herding onto one
replica between two engine steps); ties by fewer outstanding requests, then lower index."""

from __future__ import annotations

from simulator.engine.protocols import ClusterView, RouterContext
from simulator.engine.routers import ROUTERS
from simulator.workload.request import Request


@ROUTERS.register("kv_aware")
class KvAware:
    def __init__(self, ctx: RouterContext) -> None:
        pass

    def choose(self, req: Request, cluster: ClusterView) -> int:
        best, best_key = 0, None
        for i in range(cluster.num_replicas):
            kv = cluster.kv(i)
            key = ((kv.stats().used_slots + cluster.pending_prompt_tokens(i)) / max(kv.total_slots, 1),
                   cluster.outstanding[i], i)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best
