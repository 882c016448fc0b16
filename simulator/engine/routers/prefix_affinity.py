"""`prefix_affinity`: cache-aware routing with a load guard (the shape of SGLang's cache-aware
router).

A request goes to the replica holding the longest leading part of its prompt, judged by the
replica's prefix cache (KVCacheManager.lookup_prefix, no side effects) and by the chunk ids this
router sent it before (requests still in flight); a prefix every replica holds does not count,
and when loads are imbalanced (`balance_rel`, `balance_abs`) the least loaded replica wins, so
a popular prefix cannot pin all traffic on one replica.
"""

from __future__ import annotations

from pydantic import Field

from simulator.engine.protocols import ClusterView, PluginParams, RouterContext
from simulator.engine.routers import ROUTERS
from simulator.workload.request import Request


class PrefixAffinityParams(PluginParams):
    # A replica may run 1.5x and 8 requests above the least loaded one before affinity yields
    # to balance; both bounds must be exceeded (small loads stay sticky).
    balance_rel: float = Field(1.5, gt=0, allow_inf_nan=False)
    balance_abs: float = Field(8.0, gt=0, allow_inf_nan=False)


@ROUTERS.register("prefix_affinity", params=PrefixAffinityParams)
class PrefixAffinity:
    def __init__(self, ctx: RouterContext, balance_rel: float = 1.5, balance_abs: float = 8.0
                 ) -> None:
        self.balance_rel = float(balance_rel)
        self.balance_abs = float(balance_abs)
        self.caching = ctx.enable_prefix_caching
        self.chunk_tokens = ctx.prefix_chunk_tokens
        self.chunk_to_replicas: dict[int, set[int]] = {}  # prefix chunk id -> replicas sent it

    def _served_tokens(self, req: Request, i: int) -> int:
        depth = 0
        for cid in req.prefix:
            if i not in self.chunk_to_replicas.get(int(cid), ()):
                break
            depth += 1
        return min(depth * self.chunk_tokens, req.prompt_tokens)

    def choose(self, req: Request, cluster: ClusterView) -> int:
        """Steps: 1. imbalanced (max load > balance_rel x min and > min + balance_abs): the
        least loaded replica; 2. score each replica: max(cached leading tokens in its prefix
        cache, leading tokens of chunks this router sent it before; the latter covers
        requests still in flight); 3. a score above the lowest one (a prefix every replica
        holds, e.g. a shared system prompt, does not count): best score, then fewer
        outstanding, then lower index; otherwise the least loaded; 4. remember the request's
        chunk ids -> the choice."""
        n = cluster.num_replicas
        load = cluster.outstanding
        least = min(range(n), key=lambda i: (load[i], i))
        lo, hi = load[least], max(load)
        best = least
        if not (hi > self.balance_rel * lo and hi > lo + self.balance_abs) \
                and req.prefix is not None and self.caching:
            scores = [max(cluster.kv(i).lookup_prefix(req), self._served_tokens(req, i))
                      for i in range(n)]
            if max(scores) > min(scores):
                best = min(range(n), key=lambda i: (-scores[i], load[i], i))
        if req.prefix is not None:
            for cid in req.prefix:
                self.chunk_to_replicas.setdefault(int(cid), set()).add(best)
        return best
