"""Scheduling: the step scheduler (vLLM v1) over its running batch, the batching modes
(continuous, static) and the queue policies (queues/)."""

from simulator.engine.scheduling.batching import BATCHING_MODES
from simulator.engine.scheduling.queues import QUEUE_POLICIES
from simulator.engine.scheduling.running import RunningBatch
from simulator.engine.scheduling.scheduler import Scheduler

__all__ = ["BATCHING_MODES", "QUEUE_POLICIES", "RunningBatch", "Scheduler"]
