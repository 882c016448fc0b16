"""Router `by_id` with a parameter: request id modulo the replicas, shifted by `offset`."""

from __future__ import annotations

from pydantic import Field

from simulator.engine.protocols import PluginParams
from simulator.engine.routers import ROUTERS


class ByIdParams(PluginParams):
    offset: int = Field(0, ge=0)


@ROUTERS.register("by_id", params=ByIdParams)
class ById:
    def __init__(self, ctx, offset: int = 0) -> None:
        self.offset = offset

    def choose(self, req, cluster) -> int:
        return (req.req_id + self.offset) % cluster.num_replicas
