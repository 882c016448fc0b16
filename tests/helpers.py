"""Small builders shared by tests: a scheduler on a tiny paged pool, driven step by step."""

from __future__ import annotations

import numpy as np

from simulator.engine.kvcache import ContiguousAllocator, PagedAllocator
from simulator.engine.protocols import QueueContext
from simulator.engine.scheduling import BATCHING_MODES, QUEUE_POLICIES, Scheduler
from simulator.workload.request import Request


def make_scheduler(num_blocks=7, block_size=4, budget=8, max_num_seqs=4, batching="continuous",
                   policy="fcfs", vectorized=True, contiguous=None, total_slots=0, max_model_len=0,
                   caching=False, eviction="lru", chunk_tokens=4, queue_params=None,
                   chunked_prefill=True, swap=None):
    if contiguous:
        kv = ContiguousAllocator(total_slots, reserve=contiguous, max_model_len=max_model_len)
    else:
        kv = PagedAllocator(num_blocks=num_blocks, block_size=block_size,
                            enable_prefix_caching=caching, eviction=eviction,
                            prefix_chunk_tokens=chunk_tokens)
    queue = QUEUE_POLICIES.build(policy, queue_params, "engine.queue_params",
                                 QueueContext(max_num_seqs, kv.total_slots))
    return Scheduler(kv, queue, BATCHING_MODES.get(batching)(), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=budget, chunked_prefill=chunked_prefill, swap=swap,
                     vectorized=vectorized)


def drive(sched, arrivals: dict[int, list[tuple[int, int]]], max_steps=10_000):
    """Run steps; `arrivals[step]` = [(prompt, output[, prefix chunk ids]), ...] added before
    that step.
    Returns the log: one (step, {req_id: tokens}, [preempted ids], [finished ids]) per step."""
    log, next_id, step = [], 0, 0
    pending = dict(arrivals)
    while step < max_steps:
        for prompt, output, *extra in pending.pop(step, []):
            # extra: a prefix chunk-id list, or a priority int
            prefix = np.asarray(extra[0]) if extra and isinstance(extra[0], list) else None
            priority = extra[0] if extra and isinstance(extra[0], int) else 0
            sched.add_request(Request(next_id, float(step), prompt, output, priority,
                                      prefix=prefix))
            next_id += 1
        if not sched.has_work:
            if not pending:
                break
            step += 1
            continue
        batch = sched.schedule(float(step))
        scheduled = sched.scheduled()
        preempted = [r.req_id for r in batch.preempted]
        finished = [r.req_id for r in sched.commit(float(step) + 1.0)]
        log.append((step, scheduled, preempted, finished))
        step += 1
    return log
