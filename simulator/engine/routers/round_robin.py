"""`round_robin`: replicas in turn."""

from __future__ import annotations

from simulator.engine.protocols import ClusterView, RouterContext
from simulator.engine.routers import ROUTERS
from simulator.workload.request import Request


@ROUTERS.register("round_robin")
class RoundRobin:
    def __init__(self, ctx: RouterContext) -> None:
        self.next = 0

    def choose(self, req: Request, cluster: ClusterView) -> int:
        i = self.next
        self.next = (i + 1) % cluster.num_replicas
        return i
