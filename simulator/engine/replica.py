"""One serving replica as a SimPy process: schedule -> cost -> timeout -> commit, repeated.

Invariants:
- a request is rejected at arrival (counted, with a reason) when it can never run: prompt +
  output > max_model_len, or its final KV size exceeds the whole pool;
- the replica sleeps on an event when it has nothing to do and wakes on the next arrival;
- a step that schedules nothing while work is pending is a bug and raises (never a hang).
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from simulator.engine.costmodel import CostModel
from simulator.engine.scheduling import Scheduler
from simulator.metrics.summary import MetricsRecorder
from simulator.workload.request import Request, Status


class Replica:
    def __init__(self, env: simpy.Environment, scheduler: Scheduler, cost: CostModel,
                 recorder: MetricsRecorder, max_model_len: int,
                 on_iteration: Callable[[], None] | None = None) -> None:
        self.env = env
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.cost = cost
        self.recorder = recorder
        self.max_model_len = max_model_len
        self.on_iteration = on_iteration
        self.trace = None  # a steptrace.StepTrace to record each step's decisions into
        self.num_arrived = 0
        self.arrivals_done = False
        self._wake: simpy.Event | None = None
        self.process = env.process(self.run())

    def submit(self, req: Request) -> None:
        self.num_arrived += 1
        reason = self._reject_reason(req)
        if reason:
            req.status = Status.REJECTED
            req.reject_reason = reason
            self.recorder.request_ended(req)
        else:
            self.scheduler.add_request(req)
        self._poke()

    def close(self) -> None:
        """No more arrivals: the replica exits once its queues drain."""
        self.arrivals_done = True
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _reject_reason(self, req: Request) -> str:
        total = req.prompt_tokens + req.output_tokens
        if total > self.max_model_len:
            return f"prompt+output {total} > max_model_len {self.max_model_len}"
        need = self.kv.max_request_slots(req)
        if need > self.kv.total_slots:
            return f"needs {need} KV slots > pool of {self.kv.total_slots}"
        return ""

    def run(self):
        env, sched, rec, kv = self.env, self.scheduler, self.recorder, self.kv
        step_time = self.cost.step_time
        caching = getattr(kv, "enable_prefix_caching", False)
        contiguous = hasattr(kv, "largest_hole")
        queries = hits = evictions = 0  # prefix-cache counters at the previous step
        pool = getattr(kv, "pool", None) if caching else None
        swapping = sched.swap is not None
        while True:
            if not sched.has_work:
                if self.arrivals_done:
                    return
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            start = env.now
            batch = sched.schedule(start)
            trace = self.trace
            if trace is not None:
                trace.scheduled(start, sched)
            if batch.shape.num_tokens == 0:
                raise RuntimeError(
                    f"scheduler made no progress at t={start:.6f}s with {sched.running.m} running "
                    f"and {len(sched.queue)} waiting ({kv.used_slots}/{kv.total_slots} KV slots used)")
            duration = step_time(batch.shape) + batch.swap_s
            yield env.timeout(duration)
            finished = sched.commit(env.now)
            if trace is not None:
                trace.committed(finished, kv.usage)
            for req in finished:
                rec.request_ended(req)
            extra = {"num_sampled": batch.shape.num_sampled}
            if caching:  # per-step increments, like vLLM's counters
                extra["prefix_cache_queries"] = kv.prefix_queries - queries
                extra["prefix_cache_hits"] = kv.prefix_hits - hits
                queries, hits = kv.prefix_queries, kv.prefix_hits
                extra["kv_evictions"] = pool.num_evictions - evictions
                evictions = pool.num_evictions
            if swapping:
                extra["swap_s"] = batch.swap_s
            if contiguous:
                extra["kv_external_frag_slots"] = kv.total_slots - kv.used_slots - kv.largest_hole
            rec.iteration(start, duration, batch.num_seqs, batch.shape.num_tokens,
                          batch.num_prefill_tokens, batch.num_decode_tokens, batch.num_preempted,
                          batch.num_admitted, sched.running.m, len(sched.queue), kv.used_slots,
                          kv.usage, sched.tokens_stored, **extra)
            if self.on_iteration is not None:
                self.on_iteration()


def feed_arrivals(env: simpy.Environment, workload, replica: Replica):
    """SimPy process: create each Request at its arrival time and hand it to the replica."""
    arrival, prompt, output, priority = (workload.arrival_s, workload.prompt_tokens,
                                         workload.output_tokens, workload.priority)
    prefix = workload.prefix
    tenant = getattr(workload, "tenant", None)
    tier = getattr(workload, "tier", None)
    for i in range(len(workload)):
        t = float(arrival[i])
        if t > env.now:
            yield env.timeout(t - env.now)
        req = Request(i, t, int(prompt[i]), int(output[i]), int(priority[i]),
                      tenant="" if tenant is None else str(tenant[i]),
                      prefix=None if prefix is None else prefix[i])
        if tier is not None:
            req.tier = str(tier[i])
        replica.submit(req)
    replica.close()
