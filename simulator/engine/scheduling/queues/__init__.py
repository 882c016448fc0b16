"""Queue policies: the waiting-queue order and the choice of preemption victims, one module per
policy (fcfs, priority, tiered), each registered by name in QUEUE_POLICIES."""

from simulator.config.registry import Registry

# engine.queue_policy -> policy class; built as cls(QueueContext, **engine.queue_params)
QUEUE_POLICIES: Registry = Registry("queue_policy")

from simulator.engine.scheduling.queues import fcfs, priority, tiered  # noqa: E402,F401  (each registers itself)

__all__ = ["QUEUE_POLICIES"]
