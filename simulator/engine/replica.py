"""One serving replica as a SimPy process: schedule -> cost -> timeout -> commit -> record.

Invariants:
- a request is rejected at arrival (counted, with a reason) when it can never run: prompt +
  output > max_model_len, or its final KV size exceeds the whole pool;
- the replica sleeps on an event when it has nothing to do and wakes on the next arrival;
- a step that schedules nothing while work is pending is a bug and raises (never a hang);
- the loop records nothing itself: each step's Batch and the scheduler's stats after commit
  become one row (StepRecord's fields) for the metrics recorder (what is kept is the stats' business);
- async scheduling (`run_async`, vLLM 0.33's EngineCore.step_with_batch_queue with two batches
  in flight): step n+1 is scheduled when step n starts, before step n's output is committed;
  step n+1 starts when step n ends; a step's tokens reach the client when it commits.
"""

from __future__ import annotations

import gc
import itertools
import math
from collections.abc import Callable

import numpy as np
import simpy

from simulator.engine.advance import ArrivalClock, Lookahead, decode_run_fn, exact_delay, landing
from simulator.engine.costmodel import CostModel
from simulator.engine.protocols import Batch, SchedulerInterface, SchedulerStats
from simulator.engine.steptrace import StepTrace
from simulator.metrics.recorder import MetricsRecorder
from simulator.workload.generators import RequestArrays
from simulator.workload.request import Request, Status


class Replica:
    def __init__(self, env: simpy.Environment, scheduler: SchedulerInterface, cost: CostModel,
                 recorder: MetricsRecorder, max_model_len: int, *,
                 on_iteration: Callable[[], None] | None = None,
                 on_request_end: Callable[[Request], None] | None = None,
                 trace: StepTrace | None = None, clock: ArrivalClock | None = None,
                 solo: bool = False) -> None:
        self.env = env
        self.scheduler = scheduler
        self.kv = scheduler.kv
        self.cost = cost
        self.recorder = recorder
        self.max_model_len = max_model_len
        self.on_iteration = on_iteration  # after every step (progress)
        self.on_request_end = on_request_end  # a request finished or was rejected (the cluster)
        self.trace = trace  # records each step's decisions (steptrace.py)
        # engine.advance event: pure-decode steps advance in runs that end before clock.next_s
        # (None: step by step, the reference)
        self.clock = clock
        # the durations of a decode run's steps (advance.decode_run_times on this cost model)
        self._decode_run_times = decode_run_fn(cost)
        # the only replica (no router reads its state at an arrival, which only joins its queue):
        # a decode run may end with the step during which the next arrival comes
        self.solo = solo
        # the arrivals ahead, which a sync prefill-first run may admit itself (scheduling/span.py):
        # a replica alone
        self._ahead = clock.ahead if clock is not None and solo else None
        if self._ahead is not None:
            self._ahead.accept = self._accepts
            self._ahead.traced = trace is not None
        self.num_arrived = 0
        self.arrivals_done = False
        # P/D replica (engine/disagg.py): blocks held for or by KV transfers can leave a step with
        # nothing to run (a request preempted itself: retry; else sleep until `poke`/`submit`,
        # when a transfer frees or lands them), not a bug
        self.may_stall = False
        # P/D decode replica beside others: told the end of each step or run it starts (the
        # others' decode runs end before it: disagg._DecodeReplicaClock)
        self.on_busy: Callable[[float], None] | None = None
        self._wake: simpy.Event | None = None
        self.process = env.process(self.run_async() if cost.async_scheduling else self.run())

    def submit(self, req: Request, holds_kv: bool = False) -> None:
        """`holds_kv`: P/D, the request's KV arrived into blocks it holds (engine/disagg.py)."""
        self.num_arrived += 1
        reason = self.reject_reason(req)
        if reason:
            req.status = Status.REJECTED
            req.reject_reason = reason
            self._ended(req)
        elif holds_kv:
            self.scheduler.add_request(req, holds_kv=True)
        else:
            self.scheduler.add_request(req)
        self._poke()

    def close(self) -> None:
        """No more arrivals: the replica exits once its queues drain."""
        self.arrivals_done = True
        self._poke()

    def poke(self) -> None:
        """Wake the replica if it sleeps (new work, or blocks freed from outside)."""
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _sleep(self, timeout_s: float | None = None):
        """Wait for a poke (an arrival, blocks freed from outside), at most timeout_s if given."""
        self._wake = self.env.event()
        yield self._wake if timeout_s is None else self._wake | self.env.timeout(timeout_s)
        self._wake = None

    def _ended(self, req: Request) -> None:
        self.recorder.request_ended(req)
        if self.on_request_end is not None:
            self.on_request_end(req)

    def _accepts(self, req: Request) -> bool:
        return not self.reject_reason(req)

    def reject_reason(self, req: Request, pool: str = "") -> str:
        """Why `req` can never run on this replica ("" if it can); `pool` names the replica's
        pool in the KV reason (P/D: "prefill" / "decode")."""
        total = req.prompt_tokens + req.output_tokens
        if total > self.max_model_len:
            return f"prompt+output {total} > max_model_len {self.max_model_len}"
        need = self.kv.max_request_slots(req)
        if need > self.kv.total_slots:
            where = f"{pool}: " if pool else ""
            return f"{where}needs {need} KV slots > pool of {self.kv.total_slots}"
        return ""

    def run(self):
        """Steps, until arrivals are closed and nothing is left: 1. sleep while idle; 2. schedule
        a Batch; 3. wait its duration (cost model + swap time); 4. commit; 5. hand the step's
        record and the requests that ended to the metrics recorder."""
        env, sched = self.env, self.scheduler
        step_time = self.cost.step_time
        trace = self.trace
        clock = self.clock
        while True:
            if not sched.has_work:
                if self.arrivals_done:
                    return
                yield from self._sleep()
                continue
            if clock is not None:
                run = sched.decode_run(env.now, clock.next_s, self._decode_run_times,
                                       straddle=self.solo, step_time=step_time, ahead=self._ahead)
                if run is not None:
                    self._run_ended(run)
                    if self.on_busy is not None:
                        self.on_busy(env.now + run.delay)
                    yield env.timeout(run.delay)
                    self._record_run(run)
                    continue
            start = env.now
            batch = sched.schedule(start)
            if trace is not None:
                trace.scheduled(start, sched, batch)
            shape = batch.shape
            if shape.num_tokens == 0 and self.may_stall:
                if not batch.num_preempted:  # nothing changed: wait for blocks freed from outside
                    yield from self._sleep()
                continue
            if shape.num_tokens == 0:
                if batch.wait_until_s is not None:  # only transfers in flight (kvcache/offload.py)
                    yield from self._sleep(max(batch.wait_until_s - start, 0.0))
                    continue
                s = sched.stats()
                raise RuntimeError(
                    f"scheduler made no progress at t={start:.6f}s with {s.num_running} running "
                    f"and {s.num_waiting} waiting ({s.kv.used_slots}/{self.kv.total_slots} KV "
                    f"slots used)")
            duration = step_time(shape) + (batch.swap_s or 0.0)
            if self.on_busy is not None:
                self.on_busy(start + duration)
            yield env.timeout(duration)
            finished = sched.commit(env.now)
            self._record(start, duration, batch, finished)

    def _run_ended(self, run) -> None:
        """Before a decode run's wait: the requests it finished, in step order (an arrival during
        its last step, rejected, ends after them, as step by step)."""
        for part in run.parts:
            for req in part.finished:
                self._ended(req)

    def _record_run(self, run) -> None:
        """After a decode run: per part its records as columns (a last step that straddled an
        arrival records the queue as it is now, as step by step after that step); the trace
        rows."""
        merged = run.columns is not None  # one block for the whole run (_decode_run_through)
        if run.prompt is not None:  # the run opened with a prompt step (_prompt_then_run)
            start, duration, batch, s = run.prompt
            if run.straddles and not run.parts:  # that step alone, during which one arrived
                s.num_waiting = self.scheduler.num_waiting()
            self.recorder.record_row(_row(start, duration, batch, s), s.token_gaps)
        if run.straddles and run.parts:
            columns = run.columns if merged else run.parts[-1].columns
            waiting = columns["num_waiting"]
            if type(waiting) is not np.ndarray:
                k = len(columns["start_s"])
                waiting = np.empty(k, np.int64)  # (np.full is a Python wrapper: every run)
                waiting.fill(columns["num_waiting"])
                columns["num_waiting"] = waiting
            waiting[-1] = self.scheduler.num_waiting()
        if merged:
            self.recorder.record_many(run.columns, run.gaps, run.gaps_per_step)
        else:
            for part in run.parts:
                self.recorder.record_many(part.columns, part.gaps, len(part.reqs))
        if self.trace is not None:
            self.trace.decode_run(run)
        if self.on_iteration is not None:
            self.on_iteration()

    def _record(self, start: float, duration: float, batch, finished: list[Request]) -> None:
        """After a commit: the ended requests, and the step's record (with the stats now)."""
        s = self.scheduler.stats()
        if self.trace is not None:
            self.trace.committed(finished, s.kv.usage)
        for req in finished:
            self._ended(req)
        self.recorder.record_row(_row(start, duration, batch, s), s.token_gaps)
        if self.on_iteration is not None:
            self.on_iteration()

    def _schedule(self, now: float):
        """schedule(now) and its trace row (an empty step is traced only if it preempted)."""
        batch = self.scheduler.schedule(now)
        if self.trace is not None and (batch.shape.num_tokens or batch.preempted):
            self.trace.scheduled(now, self.scheduler, batch)
        return batch

    def _stuck(self, now: float) -> RuntimeError:
        s = self.scheduler.stats()
        return RuntimeError(
            f"scheduler made no progress at t={now:.6f}s with {s.num_running} running and "
            f"{s.num_waiting} waiting ({s.kv.used_slots}/{self.kv.total_slots} KV slots used)")

    def run_async(self):
        """Async scheduling, two batches in flight (vLLM 0.33's EngineCore.step_with_batch_queue
        with batch_queue_size 2). With step n in flight (it started now):
        1. schedule step n+1 (it sees step n's tokens only as placeholders);
        2. wait step n's duration (the cost model's async rule: max(host, device) + exposed);
        3. commit step n (its tokens reach the client now, finished requests free their KV),
           record it; step n+1 starts now.
        An empty schedule (every running request's last token in flight, nobody admitted) runs
        nothing: vLLM queues it and processes its empty output at once, so it commits at once
        and the next schedule starts a new pair. With nothing in flight, step 1 schedules step n
        itself first (after idling, as vLLM's first step). Pure-decode runs (decode_run) take
        the k pipelined steps at once and leave the last one they scheduled in flight."""
        env, sched = self.env, self.scheduler
        step_time = self.cost.step_time
        clock = self.clock
        decode_run_times, solo = self._decode_run_times, self.solo  # (bound once: every step)
        inflight = None  # (batch, duration) of the step that started at env.now
        while True:
            if inflight is None:
                if not sched.has_work:
                    if self.arrivals_done:
                        return
                    yield from self._sleep()
                    continue
                batch = self._schedule(env.now)
                if batch.shape.num_tokens == 0:
                    sched.commit(env.now)  # the empty step's (empty) output
                    raise self._stuck(env.now)
                inflight = (batch, step_time(batch.shape))
            batch, duration = inflight
            if clock is not None:
                run = sched.decode_run(env.now, clock.next_s, decode_run_times,
                                       inflight_s=duration, straddle=solo)
                if run is not None:
                    self._run_ended(run)
                    yield env.timeout(run.delay)
                    self._record_run(run)
                    # None: the last ones left, the run's last schedule was empty
                    inflight = None if run.next_batch is None else (run.next_batch, run.next_duration)
                    continue
            start = env.now
            nxt = self._schedule(start) if sched.has_work else None  # 1.
            yield env.timeout(duration)  # 2.
            finished = sched.commit(env.now)  # 3.
            self._record(start, duration, batch, finished)
            inflight = None
            if nxt is not None:
                if nxt.shape.num_tokens:
                    inflight = (nxt, step_time(nxt.shape))
                else:
                    done = sched.commit(env.now)  # the empty step: nothing ran, nothing to apply
                    if self.trace is not None and nxt.preempted:
                        # traced (it preempted, _schedule): its row is committed now, or every
                        # later row would take the row before it
                        self.trace.committed(done, sched.stats().kv.usage)


def _row(start: float, duration: float, batch: Batch, s: SchedulerStats) -> tuple:
    """A step's record as the recorder's row: StepRecord's fields in order, less the token gaps
    (no record object a step), from what ran (`batch`) and the stats after its commit."""
    shape, kv = batch.shape, s.kv
    return (start, duration, batch.num_seqs, shape.num_tokens, batch.num_prefill_tokens,
            batch.num_decode_tokens, batch.num_preempted, batch.num_admitted, s.num_running,
            s.num_waiting, kv.used_slots, kv.usage, s.kv_tokens_stored, shape.num_sampled,
            kv.prefix_queries, kv.prefix_hits, kv.num_evictions, batch.swap_s,
            kv.external_frag_slots)


def run_env(env: simpy.Environment) -> None:
    """env.run() with what exists now (modules, config, workload) frozen out of the cyclic
    collector: it outlives the run, and the collector's full passes skip it (W4 80k: 0.37 ->
    0.09 s of gen-2 pauses); unfrozen after, so a sweep's later collections still see it.
    The youngest generation is collected every _GC_GEN0 allocations instead of 700: the run
    makes few cycles (its objects die by reference count), and the passes over the young ones
    walk what survives (the recorder's rows, the requests): at 100,000 they cost ~1 % of W4's
    instructions (callgrind, 2,200 - 200 requests: -0.9 %), and W2's one pass ~48 ms; at
    1,000,000 W4 -0.5 % and W2 -0.4 % more. The thresholds are put back after."""
    thresholds = gc.get_threshold()
    gc.set_threshold(_GC_GEN0, *thresholds[1:])
    gc.freeze()
    try:
        env.run()
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


_GC_GEN0 = 1_000_000

# a run's `progress(ended, total)` is called every PROGRESS_EVERY steps (a progress bar needs no
# more; a call every step cost ~0.6 us, ~0.7 % of W2)
PROGRESS_EVERY = 256


def progress_tick(report: Callable[[], None]) -> Callable[[], None]:
    """A replica's on_iteration (called after every step or run) that calls `report` every
    PROGRESS_EVERY calls."""
    calls = itertools.count(1)

    def tick() -> None:  # (every step: no generator)
        if not next(calls) % PROGRESS_EVERY:
            report()
    return tick


def request_maker(workload: RequestArrays) -> Callable[[int], Request]:
    """make(i): the workload's request i as a Request (what feed_arrivals submits)."""
    arrival, prompt, output, priority = (workload.arrival_s, workload.prompt_tokens,
                                         workload.output_tokens, workload.priority)
    prefix, tenant, tier = workload.prefix, workload.tenant, workload.tier

    def make(i: int) -> Request:
        req = Request(i, float(arrival[i]), int(prompt[i]), int(output[i]), int(priority[i]),
                      tenant="" if tenant is None else str(tenant[i]),
                      prefix=None if prefix is None else prefix[i])
        if tier is not None:
            req.tier = str(tier[i])
        return req
    return make


def lookahead(workload: RequestArrays) -> Lookahead:
    """The arrivals of `workload` for a replica alone to look ahead at (advance.Lookahead)."""
    return Lookahead(workload.arrival_s.tolist(), request_maker(workload))


def feed_arrivals(env: simpy.Environment, workload: RequestArrays, target,
                  clock: ArrivalClock | None = None):
    """SimPy process: create each Request at its arrival time and hand it to `target` (a Replica
    or a Cluster: `submit(req)`, then `close()`). `clock.next_s` is kept at the next arrival's
    time as SimPy lands its timeout (now + (t - now): an ulp off t at times; inf after the last).
    With `clock.ahead` (a replica alone), a run may admit the arrivals ahead itself: the feed,
    woken at the first one's time, counts them (`target.count_taken`) and goes on after the
    last, its next timeout landing where it would have landed after submitting them one by one
    (from Lookahead.last_f, `landing`)."""
    n = len(workload)
    ahead = None if clock is None else clock.ahead
    make, times = ((request_maker(workload), workload.arrival_s.tolist()) if ahead is None
                   else (ahead.make, ahead.times))
    last = env.now  # the SimPy time of the last arrival submitted (or a run admitted)
    i = 0
    while i < n:
        t = times[i]
        land = landing(last, t)
        if clock is not None:
            clock.next_s = land
        if land > env.now:
            if last == env.now:
                yield env.timeout(t - env.now)
            else:  # after arrivals a run admitted (the run checked the delay exists)
                delay = exact_delay(env.now, land)
                if delay is None:
                    raise RuntimeError(f"feed: no SimPy delay lands on {land!r} from {env.now!r}")
                yield env.timeout(delay)
        if ahead is not None:
            if ahead.next_i > i:  # a run admitted arrivals i..next_i - 1 while the feed waited
                target.count_taken(ahead.next_i - i)
                i, last = ahead.next_i, ahead.last_f
                continue
            ahead.next_i, ahead.last_f = i + 1, env.now
        last = env.now
        target.submit(make(i))
        i += 1
    if clock is not None:
        clock.next_s = math.inf
    target.close()
