"""Schedulers: one vLLM v1-style step loop with pluggable queue policy and batching mode."""

from simulator.engine.scheduling.batching import BATCHING_MODES
from simulator.engine.scheduling.queues import QUEUE_POLICIES
from simulator.engine.scheduling.scheduler import Batch, RunningBatch, Scheduler

__all__ = ["BATCHING_MODES", "QUEUE_POLICIES", "Batch", "RunningBatch", "Scheduler"]
