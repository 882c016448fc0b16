"""Schedulers: one vLLM v1-style step loop with pluggable queue policy and batching mode."""

from simulator.schedulers.batching import BATCHING_MODES
from simulator.schedulers.queues import QUEUE_POLICIES
from simulator.schedulers.scheduler import Batch, RunningBatch, Scheduler

__all__ = ["BATCHING_MODES", "QUEUE_POLICIES", "Batch", "RunningBatch", "Scheduler"]
