"""`least_outstanding`: fewest routed-but-unfinished requests (`by: requests`) or tokens
(`by: tokens`, prompt + output of those requests); the lowest index wins ties."""

from __future__ import annotations

from typing import Literal

import numpy as np

from simulator.engine.protocols import ClusterView, PluginParams, RouterContext
from simulator.engine.routers import ROUTERS
from simulator.workload.request import Request


class LeastOutstandingParams(PluginParams):
    by: Literal["requests", "tokens"] = "requests"


@ROUTERS.register("least_outstanding", params=LeastOutstandingParams)
class LeastOutstanding:
    def __init__(self, ctx: RouterContext, by: str = "requests") -> None:
        self.by = by

    def choose(self, req: Request, cluster: ClusterView) -> int:
        load = cluster.outstanding if self.by == "requests" else cluster.outstanding_tokens
        return int(np.argmin(load))  # first minimum: the lowest index wins ties
