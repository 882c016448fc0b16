"""Batching modes: who may join the running batch, and when.

- `continuous` (Orca / vLLM): iteration-level; waiting requests are admitted at every step
  while the token budget, max_num_seqs and KV memory allow.
- `static` (FasterTransformer-style): when the running batch is empty, up to max_num_seqs
  waiting requests whose *final* sizes all fit in KV memory form a batch; nobody joins until
  every member has finished. Prefill respects the token budget (chunked), so a batch may
  take several steps to prefill (without chunked prefill: whole prompts, as many as the budget
  holds, before any decode). Finished members stop costing compute but their slot is not
  refilled. No preemption can happen: the batch was admitted at its final size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simulator.config.registry import Registry

if TYPE_CHECKING:
    from simulator.engine.scheduling.scheduler import Scheduler

BATCHING_MODES: Registry = Registry("scheduler")


@BATCHING_MODES.register("continuous")
class Continuous:
    admits_waiting = True

    def form_batch(self, sched: Scheduler, now: float) -> int:
        return 0


@BATCHING_MODES.register("static")
class Static:
    admits_waiting = False

    def form_batch(self, sched: Scheduler, now: float) -> int:
        """1. only when nothing runs; 2. take queue heads while max_num_seqs and the free KV
        slots hold the sum of their final sizes (max_request_slots: whole blocks or the
        reservation); 3. they enter running with nothing computed yet."""
        if sched.running.m or not len(sched.queue):
            return 0
        kv = sched.kv
        free = kv.total_slots - kv.stats().used_slots
        admitted = 0
        while len(sched.queue) and admitted < sched.max_num_seqs:
            req = sched.queue.peek()
            if req is None:
                break
            size = kv.max_request_slots(req)
            if size > free:
                break
            free -= size
            admitted += 1
            sched.admit(sched.queue.pop(), num_computed=0, capacity=0, now=now)
        return admitted
