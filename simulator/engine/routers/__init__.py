"""Routers: which replica of a cluster serves each arriving request, one module per router
(round_robin, least_outstanding, kv_aware, prefix_affinity), registered by name in ROUTERS."""

from simulator.config.registry import Registry

# cluster.router -> router class; built as cls(RouterContext, **cluster.router_params)
ROUTERS: Registry = Registry("router")

from simulator.engine.routers import kv_aware, least_outstanding, prefix_affinity, round_robin  # noqa: E402,F401,I001

__all__ = ["ROUTERS"]
