"""The step scheduler (vLLM v1 semantics) over a running batch kept as numpy columns (running.py).

One step (`schedule`), mirroring vLLM v1's `Scheduler.schedule`:
1. The batching mode may form a batch (static batching only).
2. Running requests, in order, each get min(remaining tokens, budget) tokens while the token
   budget lasts. A request whose new tokens do not fit in its KV slots asks the manager; on
   None the queue policy picks a victim, which is preempted (recompute: its KV freed, its
   computed tokens reset, back at the front of the waiting queue) and the allocation retried.
   If the victim is the request itself, running-request scheduling stops.
   Under `priority` a request that is its own victim is skipped and the loop goes on with the
   next one (vLLM 0.33); under fcfs it stops the loop.
3. Unless something was preempted this step, waiting requests are admitted in queue order
   while budget > 0, running < max_num_seqs and the manager finds room (prefix hits first);
   the first one that does not fit stops admission (head-of-line, as vLLM). With
   `reserve_full_isl` (vLLM 0.33's scheduler_reserve_full_isl, on by default) the room asked
   for at admission is the request's whole token sequence, not just its first chunk.
With a CPU offload tier (kvcache/offload.py, vLLM's --kv-offloading-size), step 3 also asks it
for the blocks that follow a request's GPU prefix hit: on a hit the request takes its GPU
blocks and leaves the queue while they load, then comes back at the front (vLLM's
WAITING_FOR_REMOTE_KVS); `commit` offers the prompt blocks each step completed for storing.
Without chunked prefill (vLLM v0's prefill-first steps) a step runs whole prompts if any can
run, else one decode per running request (`_schedule_prefill_first`).
`commit` then applies the step: computed tokens advance; a request that reached its
num_tokens samples one output token (first token, inter-token gap, finish).

Step 2 is evaluated with numpy over the whole running batch: budget cut-off by cumulative
sum, and only requests that outgrow their KV slots touch the manager, in order. On the first
allocation failure it falls back to the plain sequential loop from that request on; both paths
make identical decisions (tests/test_scheduler.py checks this).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.advance import DecodeRun, Lookahead, RunPart, exact_delay
from simulator.engine.costmodel import StepShape, window_kv_sums
from simulator.engine.protocols import (
    Batch,
    BatchingMode,
    KVCacheManager,
    KVStats,
    QueuePolicy,
    SchedulerStats,
)
from simulator.engine.scheduling.queues.fcfs import FCFS
from simulator.engine.scheduling.running import (
    COMPUTED,
    NUM_OUT,
    PH,
    TARGET_OUT,
    TOKENS,
    N,
    RunningBatch,
)
from simulator.engine.scheduling.span import span_run
from simulator.workload.request import Request, Status

_ZERO = np.int64(0)  # a decode run's constant columns (numpy scalars are immutable)
_ZERO_S = np.float64(0.0)
_NO_EVENTS = np.zeros(0, np.int64)  # a run whose steps take no block (never written)
# _summarise sums the unscheduled's computed tokens in Python up to this many (~0.25 us each)
# and the scheduled's reach over numpy beyond (~4 us whatever the count; 250 unscheduled in
# Python took 31 us)
_PY_SUM_MAX = 16
# a run through finishes finds its block events in Python (`_few_block_events`) when its
# requests can take at most this many blocks (m x (horizon // block_size + 1)): W4's runs
# (~8 requests, ~40 steps, blocks of 16), where _decode_block_events' ~10 numpy calls cost more
_PY_EVENTS_MAX = 64

if TYPE_CHECKING:
    from simulator.engine.kvcache.offload import OffloadConnector
    from simulator.engine.swap import SwapSpace

try:  # NOTE: np.count_nonzero's C function, without its Python wrapper (~0.6 us a call, hot path)
    from numpy._core.multiarray import count_nonzero as _nnz
except ImportError:  # numpy < 2
    _nnz = np.count_nonzero
# NOTE: ndarray.min / sum / np.cumsum through their Python wrappers cost ~0.5-3 us a call; the
# same reductions, integer or float, straight from the ufuncs (hot path); np.subtract with its
# out positional (no keyword parsing)
_min = np.minimum.reduce
_sum = np.add.reduce
_accumulate = np.add.accumulate
_subtract = np.subtract


def _few_block_events(left: list[int], computed: list[int], capacity: list[int], horizon: int,
                      block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Scheduler._decode_block_events(horizon, None, min(left, horizon)) for a few requests, in
    Python: request i takes a block at steps capacity_i - computed_i + q block_size < min(left_i,
    horizon); the (slot, step) pairs in (step, slot) order as the same int64 arrays."""
    m = len(left)
    keys = []
    for i, (n, c, cap) in enumerate(zip(left, computed, capacity)):
        h = n if n < horizon else horizon
        j = cap - c
        while j < h:
            keys.append(j * m + i)
            j += block_size
    if not keys:
        return _NO_EVENTS, _NO_EVENTS
    keys.sort()
    ev_j, ev_i = np.divmod(np.array(keys, np.int64), m)
    return ev_i, ev_j


@dataclass(slots=True)
class _InFlight:
    """Async: a scheduled step awaiting its commit: who samples (their slots at schedule time,
    the running list then, the tokens computed through the step) and the batch's version then."""

    idx: np.ndarray
    reqs: list[Request]
    reach: np.ndarray | None  # None: no prefix caching (only the late hashing reads it)
    version: int


class Scheduler:
    """kvsim's step scheduler (protocols.SchedulerInterface) over a KV manager, a queue
    policy and a batching mode; `swap`: a SwapSpace (preempt by swapping while it has room)."""

    def __init__(self, kv: KVCacheManager, queue: QueuePolicy, batching: BatchingMode, *,
                 max_num_seqs: int, max_num_batched_tokens: int, chunked_prefill: bool = True,
                 swap: SwapSpace | None = None, reserve_full_isl: bool = True,
                 vectorized: bool = True, window_tokens: int = 0,
                 offload: OffloadConnector | None = None, async_scheduling: bool = False) -> None:
        self.kv = kv
        self.window_tokens = window_tokens  # > 0: sliding window, for StepShape.window_kv_tokens
        self.queue = queue
        self.batching = batching
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # False: vLLM v0's prefill-first steps (whole prompts, no decodes alongside)
        self.chunked_prefill = chunked_prefill
        self.swap = swap
        self.offload = offload  # the CPU offload tier (kvcache/offload.py), None: off
        self.step_swap_s = 0.0  # swap time charged to the step being scheduled
        # vLLM 0.33's AsyncScheduler: step n+1 is scheduled before step n's output (module
        # docstring, "Async scheduling"); continuous, chunked, recompute only (schema.py)
        self.async_scheduling = async_scheduling
        self._inflight: deque[_InFlight] = deque()  # async: scheduled steps not yet committed
        self._finishing: set[int] = set()  # async: preempted with their last token in flight
        self.running = RunningBatch(max_num_seqs, async_scheduling)
        self._ones = self.running.ones  # sums as dot products (exact, cheaper than reductions)
        self._slots = np.arange(self.running.cols.shape[1], dtype=np.int64)  # slot numbers 0..max_num_seqs-1
        self._layer_cols: dict[int, np.ndarray] = {}  # _layer_steps' columns
        self._shortest_step: float | None = None  # a decode step of one request (_decode_run_through)
        # sync: the step's samplers, their count and its decodes (_summarise's, for commit)
        self._step_sampled: tuple[np.ndarray, int, int] | None = None
        self._prompt_first = -1  # sync: the first slot of a prompt-only step (_summarise_prompts), or -1
        self.num_preemptions = 0
        self.num_swapped = 0
        self._admitted: list[tuple[int, int]] = []  # (req_id, prefix-hit tokens), this step
        self._gaps: np.ndarray | None = None  # inter-token gaps of the last commit
        # vLLM 0.33 scheduler_reserve_full_isl: admit only if the whole sequence fits
        self.reserve_full_isl = reserve_full_isl
        self.vectorized = vectorized  # False: the sequential reference loop only (tests)
        # decode_run's precondition: the last step was a pure decode of the whole running batch
        # (nothing admitted, preempted, swapped or finished) and nothing arrived since
        self._pure = False  # the step just scheduled is a pure decode of every running request
        self._quiet = False  # ... and it committed with no finish and no arrival during it
        # every running request is a decode (`_all_decodes`), known without looking: set by the
        # sync runs (a run leaves only decodes), cleared by schedule() (the loop's steps); an
        # arrival only joins the queue
        self._decoding = False
        # (end, next arrival) of the last decode run when that arrival cut it: a run asked for at
        # that end with the same arrival ahead would find its first step ending past it, so it
        # is not tried (None is always exact: the loop is the reference; this saves run_times)
        self._cut_at: tuple[float, float] | None = None
        # P/D (engine/disagg.py): a prefill replica keeps a finished request's blocks for the
        # KV transfer (vLLM's connector request_finished -> delay_free_blocks); disagg frees them
        self.delay_free_blocks = False
        # P/D decode replica: something outside reacts to each step's finishes (the pull queue
        # is tried after every step), so a decode run ends at its first finishing step
        self.watched_finishes = False
        # P/D decode replica: requests whose KV landed in blocks they hold, admitted before the
        # queue (vLLM's kv_holding_waiting; a preempted request at the queue's head cannot
        # block them)
        self.kv_holding: deque[Request] = deque()
        # an arrival joins the tail of the waiting queue and only the head can be admitted next
        # (fcfs, continuous batching, no CPU tier bringing requests back)
        self._arrival_joins_tail = (type(queue) is FCFS and batching.admits_waiting
                                    and offload is None)
        # a sync prefill-first run may open with the prompt step of an arrival admitted alone
        # (`_prompt_then_run`): fcfs continuous batching, no swap space, no CPU tier, no sliding
        # window, and runs that go past finishes on this KV manager
        self._opens_with_prompt = (self._arrival_joins_tail and not chunked_prefill
                                   and not async_scheduling and swap is None and not window_tokens
                                   and kv.decode_room() is not None and kv.decode_run_frees)

    # --- queue side ----------------------------------------------------------------------
    def add_request(self, req: Request, holds_kv: bool = False) -> None:
        """`holds_kv`: P/D, its KV arrived from a prefill replica into blocks it already holds
        (self.kv_holding)."""
        req.status = Status.WAITING
        if holds_kv:
            self.kv_holding.append(req)
            self._pure = self._quiet = False
            return
        # NOTE: one joining the tail of a waiting fcfs queue changes no decision of the next step
        # (its head waits, and this one behind it): decode runs may go on (`_arrival_joins_tail`)
        if not (len(self.queue) and self._arrival_joins_tail):
            self._pure = self._quiet = False
        self.queue.push(req)

    @property
    def has_work(self) -> bool:
        return bool(self.running.m or len(self.queue) or self.kv_holding
                    or (self.offload is not None and self.offload.num_loading))

    def admit(self, req: Request, num_computed: int, capacity: int, now: float) -> int:
        slot = self.running.append(req, num_computed, capacity)
        self._started(req, num_computed, now)
        self._admitted.append((req.req_id, num_computed))
        return slot

    def _started(self, req: Request, num_computed: int, now: float) -> None:
        """`req` starts running at `now` with num_computed tokens cached: its queue told,
        RUNNING, its first schedule and cached tokens kept from its first admission (`admit`,
        and a span's admissions, which join the running batch only at its end)."""
        self.queue.on_run(req)
        req.status = Status.RUNNING
        if req.first_scheduled_s < 0:
            req.first_scheduled_s = now
        if req.num_cached_tokens < 0:
            req.num_cached_tokens = num_computed

    def _preempt(self, i: int, now: float) -> Request:
        """Swap the victim's KV to CPU when a swap space has room (it keeps its computed
        tokens), else recompute (vLLM v1: KV freed, computed tokens reset). Either way it goes
        back in line through the queue policy."""
        rb = self.running
        req = rb.write_back(i)
        last_in_flight = False
        if self.async_scheduling:
            # the outputs in flight are not the client's yet: they arrive (stale) at their
            # commit; vLLM frees the blocks without hashing more (only `hashed` is cached)
            ph = int(rb.ph[i])
            req.num_output_tokens -= ph
            req.num_computed_tokens = int(rb.hashed[i])
            last_in_flight = ph > 0 and int(rb.num_out[i]) >= int(rb.target_out[i])
        swap = self.swap
        swapped = (swap is not None and req.num_computed_tokens
                   and swap.can_hold(req.num_computed_tokens))
        if swapped:
            self.step_swap_s += swap.swap_out(req, req.num_computed_tokens)
            self.num_swapped += 1
        # freed while its computed tokens still count: the full blocks it computed are hashed
        # (vLLM hashed them when they were allocated), so it can hit them when re-admitted
        self.kv.free(req)
        if not swapped:
            req.num_computed_tokens = 0
        req.num_preemptions += 1
        req.status = Status.PREEMPTED
        self.queue.on_stop(req)
        self.running.remove(i)
        if last_in_flight:
            # NOTE: vLLM puts it in the waiting queue and, when its last token arrives at the
            # commit of the step in flight, finishes it from there; nothing reads the queue in
            # between (a step that preempts admits nobody), so it waits outside the queue
            self._finishing.add(req.req_id)
        else:
            self.queue.prepend(req)
        self.num_preemptions += 1
        return req

    # --- one step ------------------------------------------------------------------------
    def schedule(self, now: float) -> Batch:
        self._decoding = False
        self.kv.now = now
        self.step_swap_s = 0.0
        self._admitted = []
        if self.offload is not None:  # loads that ended: back to the front of the line
            for req in reversed(self.offload.poll(now)):
                self.queue.prepend(req)
        if not self.chunked_prefill:
            return self._schedule_prefill_first(now)
        formed = self.batching.form_batch(self, now)
        reach = None
        if self.vectorized:
            budget, preempted, reach = self._schedule_running_vectorized(now)
        else:
            self.running.n[:self.running.m] = 0
            budget, preempted = self._schedule_running_sequential(0, self.max_num_batched_tokens, now)
        admitted = formed
        if not preempted and self.batching.admits_waiting:
            admitted += self._admit_waiting(budget, now)
        return self._summarise(preempted, admitted, reach)

    def _schedule_running_vectorized(self, now: float) -> tuple[int, list[Request], np.ndarray | None]:
        """Step 2 over numpy columns, segment by segment: budget cut-off by cumulative sum, the
        manager called (in order, in bulk) only for requests that need it; the first request it
        cannot serve goes through `_schedule_one` (preemption), then the next segment starts.
        Each segment writes its tokens straight into `n` (what is left over the budget: 0).
        Returns (budget left, the preempted, computed + n of every running request where one
        segment served them all, for `_summarise`; else None)."""
        rb = self.running
        budget = self.max_num_batched_tokens
        preempted: list[Request] = []
        i = 0
        kv = self.kv
        asynchronous = self.async_scheduling
        while i < len(rb.reqs) and budget > 0:
            m = len(rb.reqs)
            want = rb.n[i:m]
            _subtract(rb.tokens[i:m], rb.computed[i:m], want)
            if asynchronous:
                # vLLM's AsyncScheduler: no extra step for a request whose last token is in flight
                at_last = rb.num_out[i:m] >= rb.target_out[i:m]
                if _nnz(at_last):
                    want[at_last] = 0
            cum = _accumulate(want)  # want.cumsum() without its Python wrapper
            used = cum.item(-1)
            if used <= budget:  # all of them fit
                count = m - i
            else:  # those with budget left before them: the last one is cut to what is left
                count = cum.searchsorted(budget).item() + 1
                used = cum.item(count - 1)
                if used > budget:
                    want[count - 1] -= used - budget
                    used = budget
                want[count:] = 0
            n = want[:count]
            computed = rb.computed[i:i + count]
            reach_all = rb.computed[i:m] + want  # (want is 0 past count)
            reach = reach_all[:count]
            call = reach > rb.capacity[i:i + count]
            caching = kv.caches_full_blocks
            if caching:
                # A step that fills a block without needing a new one must still reach the
                # manager, which hashes full blocks at once, as vLLM's allocate_slots does on
                # every step: others may hit them this very step. That holds for blocks filled
                # by decoding too (a session's next turn can arrive while this turn still runs
                # and resend its answer so far).
                bs = kv.block_size
                if asynchronous:
                    # vLLM hashes up to min(reach, tokens the client has): a block filled by a
                    # token still in flight is hashed one step later
                    cap = np.minimum(reach, rb.tokens[i:i + count] - rb.ph[i:i + count])
                    call |= (n > 0) & (cap // bs > rb.hashed[i:i + count] // bs)
                else:
                    call |= reach // bs > computed // bs
            needers = call.nonzero()[0]
            if len(needers):
                at = needers + i if i else needers
                idx = at.tolist()
                reqs = rb.reqs
                # the needers' rows computed and n (and, for hashing, tokens and ph), one call
                sub = rb.cols[COMPUTED:PH + 1 if caching else N + 1, at].tolist()
                tokens = None
                if caching:  # the token counts only matter for hashing
                    tokens = ([a - b for a, b in zip(sub[TOKENS - COMPUTED], sub[PH - COMPUTED])]
                              if asynchronous else sub[TOKENS - COMPUTED])
                caps = kv.allocate_slots_many([reqs[j] for j in idx], sub[N - COMPUTED], sub[0], tokens)
                served = len(caps)
                if served == len(idx):
                    rb.capacity[at] = caps
                else:  # the manager ran out at request j
                    if served:
                        rb.capacity[at[:served]] = caps
                    j = idx[served]
                    rb.n[j:m] = 0
                    budget -= cum.item(j - i - 1) if j > i else 0  # the tokens before it
                    budget, i, stop = self._schedule_one(j, budget, now, preempted)
                    if stop:
                        break
                    continue
            budget -= used
            if not i:  # a last segment from slot 0: its reach is the step's (nothing changes it after)
                return budget, preempted, reach_all
            break
        return budget, preempted, None

    def _schedule_running_sequential(self, i: int, budget: int, now: float) -> tuple[int, list[Request]]:
        """The reference loop (vLLM v1), from running index i with `budget` tokens left."""
        preempted: list[Request] = []
        while i < self.running.m and budget > 0:
            budget, i, stop = self._schedule_one(i, budget, now, preempted)
            if stop:
                break
        return budget, preempted

    def _schedule_one(self, i: int, budget: int, now: float,
                      preempted: list[Request]) -> tuple[int, int, bool]:
        """Schedule running request i (vLLM v1's loop body): on allocation failure preempt the
        policy's victim and retry. Returns (budget left, next index, stop running requests)."""
        rb = self.running
        kv = self.kv
        req = rb.reqs[i]
        computed = int(rb.computed[i])
        num_new = min(int(rb.tokens[i]) - computed, budget)
        tokens = int(rb.tokens[i])
        if self.async_scheduling:
            if rb.num_out[i] >= rb.target_out[i]:  # its last token is in flight: skip it
                return budget, i + 1, False
            tokens -= int(rb.ph[i])
            hashed = int(rb.hashed[i])
        else:
            hashed = computed
        cap: int | None = int(rb.capacity[i])
        bs = kv.block_size
        if computed + num_new > cap or (  # see _schedule_running_vectorized for the 2nd clause
                kv.caches_full_blocks and min(computed + num_new, tokens) // bs > hashed // bs):
            while True:
                cap = kv.allocate_slots(req, num_new, computed, num_tokens=tokens)
                if cap is not None:
                    break
                v = self.queue.pick_victim(rb.reqs)
                budget += int(rb.n[v])  # a victim already scheduled gives its tokens back
                victim = self._preempt(v, now)
                preempted.append(victim)
                if victim is req:
                    # vLLM 0.33: under priority the requests after it rank higher and may
                    # still fit (it just freed its blocks); under fcfs nothing follows it
                    return budget, i, not self.queue.continue_after_self_preemption
                if v < i:
                    i -= 1
        rb.capacity[i] = cap
        rb.n[i] = num_new
        return budget - num_new, i + 1, False

    def _admit_waiting(self, budget: int, now: float, whole: bool = False) -> int:
        """Step 3. `whole`: prompts are not split (prefill-first); one that exceeds the budget
        left waits for the next step."""
        admitted = 0
        swap = self.swap
        holding = self.kv_holding
        offload = self.offload
        while (holding or len(self.queue)) and budget > 0 and self.running.m < self.max_num_seqs:
            req = holding[0] if holding else self.queue.peek()
            if req is None:  # the policy admits nobody now (a tier at its share cap)
                break
            swapped = swap is not None and swap.holds(req)
            # back from a CPU-tier load (offload.py): it holds its blocks and computed tokens
            swapped |= offload is not None and req.num_computed_tokens > 0
            computed = (req.num_computed_tokens if swapped or holding
                        else self.kv.get_computed_tokens(req))
            if offload is not None and not swapped and not holding:
                ext = offload.match(req, computed)  # past the GPU hit; None: blocks in flight
                if ext is None or (ext and not offload.start_load(req, computed, ext, now,
                                                                  self.reserve_full_isl)):
                    break
                if ext:  # out of line until its load ends
                    self.queue.pop()
                    continue
            num_new = req.num_tokens - computed
            if whole and num_new > budget:
                break
            num_new = min(num_new, budget)
            cap = self.kv.allocate_slots(req, num_new, computed,
                                         full_sequence_must_fit=self.reserve_full_isl)
            if cap is None:
                break
            if holding:
                holding.popleft()
            else:
                self.queue.pop()
            if swapped and swap is not None and swap.holds(req):
                self.step_swap_s += swap.swap_in(req)
            slot = self.admit(req, computed, cap, now)
            self.running.n[slot] = num_new
            budget -= num_new
            admitted += 1
        return admitted

    def _schedule_prefill_first(self, now: float) -> Batch:
        """vLLM v0 without chunked prefill: a step runs whole prompts if any can run (running
        decodes pause), else one decode for each running request.
        1. the batching mode may form a batch (static: its members enter with no prompt computed);
        2. prompts: waiting requests admitted whole (continuous), else running members whose
           prompt is not computed yet, whole and in order while the budget holds them;
        3. no prompt runs: the running batch decodes (step 2 of `schedule`)."""
        rb = self.running
        rb.n[:rb.m] = 0
        budget = self.max_num_batched_tokens
        admitted = self.batching.form_batch(self, now)
        prompts = 0
        if self.batching.admits_waiting:
            prompts = self._admit_waiting(budget, now, whole=True)
            admitted += prompts
        preempted: list[Request] = []
        if not prompts and not self.batching.admits_waiting:
            prompts = self._schedule_prompts(budget, now, preempted)
        if not prompts:
            if self.vectorized:
                _, preempted, reach = self._schedule_running_vectorized(now)
                return self._summarise(preempted, admitted, reach)
            _, preempted = self._schedule_running_sequential(0, budget, now)
        elif admitted == prompts and self.offload is None:
            batch = self._summarise_prompts(rb.m - prompts, prompts)
            if batch is not None:
                return batch
        return self._summarise(preempted, admitted)

    def _summarise_prompts(self, first: int, num_admitted: int) -> Batch | None:
        """_summarise for a prefill-first step that runs only the prompts just admitted (slots
        first..m-1; the running decodes pause): where none of them has an output yet, each
        computes its whole prompt and samples its first token, and the sums are Python over
        those few slots instead of numpy over the batch. None where that does not hold."""
        rb = self.running
        m = len(rb.reqs)
        cols = rb.cols[COMPUTED:NUM_OUT + 1, first:m].tolist()  # computed, n, tokens, num_out
        c, n, tokens, out = cols
        if any(out) or min(n) <= 0:
            return None
        reach = [a + b for a, b in zip(c, n)]
        if reach != tokens:
            return None
        t = sum(n)
        # _summarise's exact integer sums (n @ c, n @ n) and its float expression
        attn_pairs = float(sum(a * b for a, b in zip(c, n))) + float(sum(b * b for b in n) + t) / 2.0
        w = self.window_tokens
        window = sum(min(r, w) for r in reach) if w else -1
        self._pure = False
        self._step_sampled = None
        self._prompt_first = first  # commit: _commit_prompts
        shape = StepShape(t, num_admitted, attn_pairs, sum(reach), num_admitted, t, window)
        return Batch(shape, num_admitted, t, 0, 0, num_admitted,
                     None if self.swap is None else self.step_swap_s, [], self._admitted, None)

    def _schedule_prompts(self, budget: int, now: float, preempted: list[Request]) -> int:
        """Running members whose prompt is not computed yet (a static batch just formed), whole
        prompts in running order until one exceeds the budget left. Returns how many run.
        Only for modes that admit through form_batch: continuous batching admits prompts
        whole (step 2), so its running requests never have one left."""
        rb = self.running
        count = i = 0
        while i < rb.m and budget > 0:
            if rb.num_out[i] or rb.computed[i] >= rb.tokens[i]:
                i += 1
                continue
            if rb.tokens[i] - rb.computed[i] > budget:
                break
            budget, i, stop = self._schedule_one(i, budget, now, preempted)
            count += 1
            if stop:
                break
        return count

    def _summarise(self, preempted: list[Request], num_admitted: int,
                   reach: np.ndarray | None = None) -> Batch:
        """The step's Batch from the columns (sums as dot products with a ones column: exact
        integers, cheaper than a numpy reduction). `reach`: computed + n of the running requests
        when the caller has it (`_schedule_running_vectorized`; recomputed if some joined since)."""
        rb = self.running
        m = len(rb.reqs)
        n = rb.n[:m]
        c = rb.computed[:m]
        ones = self._ones[:m]
        if reach is None or len(reach) != m:
            reach = c + n
        sampled = reach >= rb.tokens[:m]
        num_seqs = int(_nnz(n))
        scheduled = None  # None: every running request is scheduled
        if num_seqs < m:
            scheduled = n.astype(bool)  # n > 0 (n >= 0)
            sampled &= scheduled
        num_sampled = int(_nnz(sampled))
        x = rb.cols[:N + 1, :m]  # ones, c, n
        (_, c_sum, t), (_, _, c_n), (_, _, n_n) = x.dot(x.T).tolist()  # exact integer sums
        w = self.window_tokens
        if t == num_sampled == m:
            # every request samples and the m tokens are one each (n == 1 everywhere): the
            # general sums below in fewer numpy calls (n @ c = sum c, n @ (n + 1) = 2 m)
            decodes = int(_nnz(rb.num_out[:m]))
            attn_pairs = float(c_sum) + float(2 * m) / 2.0
            kv_tokens = c_sum + m
            window = int(np.minimum(reach, w).sum()) if w else -1
        else:
            one = n == ones
            one &= sampled
            decodes = int(_nnz(rb.num_out[:m][one]))
            attn_pairs = float(c_n) + float(n_n + t) / 2.0  # n @ (n + 1), exact
            if scheduled is None:
                kv_tokens = c_sum + t
                window = int(np.minimum(reach, w).sum()) if w else -1
            elif w:  # the sums over the scheduled only
                r = reach[scheduled]
                kv_tokens = (r @ ones[:num_seqs]).item()
                window = int(np.minimum(r, w).sum())
            else:
                # NOTE: the sum over all less the unscheduled's (their reach is their computed):
                # in Python when they are few (past the budget or with their last token in
                # flight), else over numpy (a batch past a small budget)
                if m - num_seqs <= _PY_SUM_MAX:
                    kv_tokens = c_sum + t - sum(map(c.item, (~scheduled).nonzero()[0].tolist()))
                else:
                    kv_tokens = (reach[scheduled] @ ones[:num_seqs]).item()
                window = -1
        self._pure = (decodes == m == t and not preempted and not num_admitted
                      and not self.step_swap_s)
        shape = StepShape(t, num_sampled, attn_pairs, kv_tokens, num_seqs, t - decodes, window)
        if self.async_scheduling:
            self._launch(n, sampled, reach)
        else:  # commit reads them (nothing changes the batch while the step runs)
            self._step_sampled = (sampled, num_sampled, decodes)
        return Batch(shape, num_seqs, t - decodes, decodes,
                     len(preempted), num_admitted, None if self.swap is None else self.step_swap_s,
                     preempted, self._admitted,
                     None if self.offload is None or t else self.offload.next_event_s())

    def _launch(self, n: np.ndarray, sampled: np.ndarray, reach: np.ndarray) -> None:
        """Async: the step just scheduled goes in flight (vLLM's _update_after_schedule):
        computed tokens advance now, each request that samples gets an output placeholder, and
        the step's samplers wait for its commit (`_inflight`)."""
        rb = self.running
        m = len(rb.reqs)
        caching = self.kv.caches_full_blocks
        if caching:
            tok = rb.tokens[:m] - rb.ph[:m]
            np.maximum(rb.hashed[:m], np.where(n > 0, np.minimum(reach, tok), 0),
                       out=rb.hashed[:m])
        rb.computed[:m] = reach
        rb.cols[TOKENS:PH + 1, :m] += sampled  # tokens, num_out, ph
        idx = sampled.nonzero()[0]
        # the running list as it is now (RunningBatch never changes a list in place but to append):
        # the samplers are reqs[idx] should the batch change before the commit
        self._inflight.append(_InFlight(idx, rb.reqs, reach[idx] if caching else None, rb.version))

    def commit(self, now: float) -> list[Request]:
        """Apply the step that just ran: advance tokens, sample, finish. Returns finished."""
        if self.async_scheduling:
            return self._commit_async(now)
        if self._prompt_first >= 0:
            first, self._prompt_first = self._prompt_first, -1
            return self._commit_prompts(first, now)
        rb = self.running
        m = len(rb.reqs)
        n = rb.n[:m]
        c = rb.computed[:m]
        c += n
        step = self._step_sampled
        self._step_sampled = None
        decodes = -1  # not known
        if step is not None and len(step[0]) == m:
            # _summarise's: (n > 0) & (c + n >= tokens), and how many were one-token decodes
            sampled, num_sampled, decodes = step
        else:
            sampled = c >= rb.tokens[:m]
            sampled &= n > 0
            num_sampled = _nnz(sampled)
        out = rb.num_out[:m]
        last = rb.last_token[:m]
        if num_sampled == m and m:
            # every running request samples (a decode step): the masks below without `sampled`
            rb.cols[TOKENS:NUM_OUT + 1, :m] += 1  # tokens and num_out
            if decodes == m:  # every one had an output already: no first token
                num_first = 0
            else:
                firsts = out == self._ones[:m]
                num_first = _nnz(firsts)
            if num_first:
                self._gaps = now - last[~firsts] if num_first < m else None
                for i in firsts.nonzero()[0].tolist():
                    rb.reqs[i].first_token_s = now
            else:
                self._gaps = now - last
            last[:] = now
            done = out >= rb.target_out[:m]
        elif num_sampled:
            rb.cols[TOKENS:NUM_OUT + 1, :m] += sampled
            gaps = out > 1
            gaps &= sampled
            self._gaps = now - last[gaps] if _nnz(gaps) else None
            for i in (sampled & (out == 1)).nonzero()[0].tolist():
                rb.reqs[i].first_token_s = now
            last[sampled] = now
            done = out >= rb.target_out[:m]
            done &= sampled
        else:  # no request samples (prompt chunks only)
            self._gaps = None
            done = sampled
        finished: list[Request] = []
        if self.offload is not None:  # before the finished leave the batch: store offers
            self.offload.offer(rb.reqs, rb.computed[:m], n, rb.tokens[:m], rb.num_out[:m],
                               [rb.reqs[i] for i in done.nonzero()[0].tolist()], now)
        if _nnz(done):
            finished = self._finish_slots(done.nonzero()[0].tolist(), now, not self.delay_free_blocks)
        rb.n[:len(rb.reqs)] = 0
        self._quiet = self._pure and not finished
        return finished

    def _commit_prompts(self, first: int, now: float) -> list[Request]:
        """commit after `_summarise_prompts`' step: the prompts of slots first..m-1 computed,
        each samples its first token (no token gaps); those with one output to make finish."""
        rb = self.running
        m = len(rb.reqs)
        cols = rb.cols
        reqs = rb.reqs
        self._gaps = None
        self._quiet = False
        if first == m - 1:  # one prompt (light load: most admissions): item writes, not slices
            n = rb.n.item(first)
            rb.computed[first] += n
            rb.tokens[first] += 1
            rb.num_out[first] += 1
            rb.n[first] = 0
            rb.last_token[first] = now
            reqs[first].first_token_s = now
            done = [first] if rb.target_out.item(first) <= 1 else []
        else:
            at = slice(first, m)
            cols[COMPUTED, at] += cols[N, at]
            cols[TOKENS:NUM_OUT + 1, at] += 1
            cols[N, at] = 0
            rb.last_token[at] = now
            for req in reqs[first:]:
                req.first_token_s = now
            done = [i for i, target in enumerate(cols[TARGET_OUT, at].tolist(), first) if target <= 1]
        return self._finish_slots(done, now, not self.delay_free_blocks) if done else []

    def _commit_async(self, now: float) -> list[Request]:
        """Async: apply the output of the oldest step in flight (vLLM's update_from_output with
        two batches in flight; the next step is already scheduled). Steps:
        1. find its samplers: at their slots if no request left the running batch since (the
           version), else by id; those no longer running were preempted after it was
           scheduled (stale output);
        2. running samplers: the placeholder resolves into an output token emitted now (first
           token or an inter-token gap); the prefix cache hashes the blocks the step filled
           (vLLM's cache_blocks at update) when no later step did;
        3. those that reached their output target finish: KV freed, out of the batch (vLLM
           frees a finished request's blocks here, one step after the step that knew it);
        4. stale outputs still reach the client (vLLM delivers them); one that was the request's
           last token finishes it."""
        fl = self._inflight.popleft()
        rb = self.running
        kv = self.kv
        caching = kv.caches_full_blocks
        stale: list[Request] = []
        idx = fl.idx
        fl_reach = fl.reach
        if fl.version != rb.version and len(idx):  # 1.
            # their slots now, in the step's sampler order, and whether they still run: through
            # the departures since (RunningBatch.slots_now), else by req_id over numpy
            moved = rb.slots_now(fl.version, idx)
            if moved is not None:
                at, hit = moved
            elif m := len(rb.reqs):
                old = np.array([fl.reqs[i].req_id for i in idx.tolist()], np.int64)
                cur = rb.ids[:m]
                sorter = cur.argsort()
                at = sorter[np.minimum(cur.searchsorted(old, sorter=sorter), m - 1)]
                hit = cur[at] == old
            else:
                at = idx
                hit = np.zeros(len(idx), bool)
            if _nnz(hit) < len(hit):
                reqs = fl.reqs
                stale = [reqs[i] for i in idx[~hit].tolist()]
                if caching:
                    fl_reach = fl_reach[hit]
                idx = at[hit]
            else:
                idx = at
        finished: list[Request] = []
        gaps = None
        done = None
        k = len(idx)
        # the samplers' slots ascend (a departure keeps the order, arrivals join the end): when
        # they are 0..k-1 (every running request sampled, or those admitted since did not),
        # the columns are read through a slice, not by fancy indexing (hot path)
        prefix = k and idx.item(-1) == k - 1
        sel = slice(0, k) if prefix else idx

        def slots(mask: np.ndarray) -> list[int]:
            return (mask.nonzero()[0] if prefix else idx[mask]).tolist()
        if k:  # 2.
            if prefix:
                ph = rb.ph[:k]
                ph -= 1
                last = rb.last_token[:k]
            else:
                ph = rb.ph[idx] - 1
                rb.ph[idx] = ph
                last = rb.last_token[idx]
            mat = rb.num_out[sel] - ph
            first = mat == self._ones[:k]
            if _nnz(first):
                gaps = now - last[~first]
                reqs = rb.reqs
                for i in slots(first):
                    reqs[i].first_token_s = now
            else:
                gaps = now - last
            if prefix:
                last[:] = now
            else:
                rb.last_token[idx] = now
            done = mat >= rb.target_out[sel]
            if caching:
                bs = kv.block_size
                late = (fl_reach // bs > rb.hashed[sel] // bs) & ~done
                if _nnz(late):
                    for i, r in zip(slots(late), fl_reach[late].tolist()):
                        kv.allocate_slots(rb.reqs[i], 0, r,
                                          num_tokens=int(rb.tokens[i] - rb.ph[i]))
                        rb.hashed[i] = r
            if not len(gaps):
                gaps = None
        if done is not None and _nnz(done):  # 3.
            finished.extend(self._finish_slots(slots(done), now))
        if stale:  # 4.
            extra = []
            for req in stale:
                gap = req.add_output_token(now)
                if gap is not None:
                    extra.append(gap)
                if req.req_id in self._finishing:
                    self._finishing.discard(req.req_id)
                    req.finish_s = now
                    req.status = Status.FINISHED
                    finished.append(req)
            if extra:
                gaps = np.asarray(extra) if gaps is None else np.concatenate((gaps, extra))
        self._gaps = gaps
        self._quiet = self._pure and not finished
        return finished

    def decode_run(self, now: float, until_s: float, run_times: Callable[..., np.ndarray],
                   max_steps: int = 4096, inflight_s: float | None = None,
                   straddle: bool = False, step_time: Callable[[StepShape], float] | None = None,
                   ahead: Lookahead | None = None) -> DecodeRun | None:
        """The next k pure-decode steps at once (engine/advance.py), or None when the next step
        may differ from the last (the caller then steps). Steps:
        1. precondition: the last step was a pure decode of every running request, committed
           with no finish, and nothing arrived since; then admission fails again (same queue,
           same budget, free blocks only fall) and every request decodes again. Or: the queue
           is empty and every running request is a decode (one token left to compute);
        2. the run goes in parts, each up to and including the next finishing step (the step
           that gives a request its last token), <= max_steps in all; after a finishing step
           it goes on only where the loop's next step is sure to be a pure decode of those left
           (`_runs_past_finish`);
        3. per part, the blocks the steps take, in the loop's order (step, then running order):
           request i needs one at steps capacity - computed + q * block_size; the part stops
           before the step whose block the free queue (`decode_room`) cannot give;
        4. the durations (`run_times`: CostModel.decode_run_times' signature) and start times
           (sequential float sums, as SimPy adds them); the run stops so its last step ends
           strictly before `until_s` (the next arrival), or with `straddle` (an arrival only
           joins the queue) at the step that ends after it, unless that step finishes someone;
           the end is reachable by one exact SimPy delay;
        5. apply the part: blocks popped in order, counters advanced, the records as columns;
           a finishing step then finishes its requests as commit does (`_finish_in_run`: KV
           freed in running order, popped first by the next part's steps)."""
        if self.async_scheduling:
            return self._decode_run_async(now, until_s, run_times, max_steps, inflight_s, straddle)
        rb = self.running
        m = rb.m
        if self._cut_at == (now, until_s):
            return None
        if (not self._quiet and step_time is not None and len(self.queue) == 1
                and self._opens_with_prompt):
            if ahead is not None:  # a span: the arrivals ahead admitted in the same run
                run = span_run(self, now, until_s, run_times, max_steps, step_time, ahead)
                if run is not None:
                    return run
            run = self._prompt_then_run(now, until_s, run_times, max_steps, straddle, step_time)
            if run is not None:
                return run
        if not m:
            return None
        kv = self.kv
        if not self._quiet:
            # an empty queue admits nobody whatever the free blocks, nor does one whose head
            # cannot be admitted now (free blocks only fall in a run, arrivals join the tail):
            # a batch of decodes only (each one token to compute, the budget holding them
            # all) decodes again
            if (self.kv_holding or m > self.max_num_batched_tokens
                    or (len(self.queue) and not self._head_waits(m))
                    or not (self._decoding or self._all_decodes(m))):
                return None
        room = kv.decode_room()
        if room is None:
            return None
        # a finishing step may run here unless something outside reads it (offload offers,
        # P/D's kept blocks)
        finishes = self.offload is None and not self.delay_free_blocks
        past = finishes and self._runs_past_finish()
        if past and not self.window_tokens and kv.decode_run_frees:
            return self._decode_run_through(now, until_s, run_times, max_steps, straddle, room)
        parts: list[RunPart] = []
        all_starts: list[np.ndarray] = []
        t = now
        steps = 0
        delay = 0.0
        straddled = False
        carry = None  # what the last part's finishing step left: (KV stats, sum computed, sum capacity)
        while True:
            m = rb.m
            left = int(_min(rb.target_out[:m] - rb.num_out[:m]))  # steps through the next finish
            k = min(left if finishes else left - 1, max_steps - steps)  # 2.
            if k < 1:
                break
            events = self._decode_block_events(k, room)  # 3.
            if events is None:
                break
            k, ev_i, ev_j = events
            if carry is None:
                carry = (None, *rb.computed_and_capacity(m))
            c_sum = carry[1]  # 4.
            _, durations = self._decode_shapes(k, c_sum, run_times)
            starts = np.empty(k + 1)
            starts[0] = t
            starts[1:] = durations
            # a finishing step may not straddle the arrival: it would finish before the arrival
            cut = self._cut_to_arrival(now, until_s, starts, k, (k - (k == left)) if straddle else 0)
            if cut is None:
                break
            k, delay, straddled = cut
            starts, durations = starts[:k + 1], durations[:k]
            reqs = list(rb.reqs)
            columns, gaps = self._apply_decode_run(k, starts, durations, ev_i, ev_j, c_sum, reqs,
                                                   carry[0], carry[2])  # 5.
            if k == left:
                finished, carry = self._finish_in_run(columns, float(starts[k]),
                                                      rb.num_out[:m] >= rb.target_out[:m])
            else:  # (the run ends here: _next_part goes on only past a finish)
                finished, carry = [], None
            steps += k
            t = float(starts[k])
            room = self._next_part(parts, all_starts, RunPart(columns, gaps, reqs, finished), starts,
                                   straddled or not past or steps >= max_steps)
            if room is None:
                break
        if not parts:
            return None
        self._pure = self._decoding = True  # as the loop leaves it after the run's last step
        self._quiet = not parts[-1].finished
        return DecodeRun(delay, self._run_starts(all_starts), parts, straddles=straddled)

    def _prompt_then_run(self, now: float, until_s: float, run_times: Callable[..., np.ndarray],
                         max_steps: int, straddle: bool, step_time: Callable[[StepShape], float]
                         ) -> DecodeRun | None:
        """A sync prefill-first run that opens with the loop's next step when that step is the
        prompt of the one waiting request, admitted alone (`_opens_with_prompt`): a fresh
        request (nothing computed, no output, never preempted) whose whole prompt fits the
        budget, the sequence cap and the free blocks, that makes more than one output, beside
        a batch of decodes only that all decode in one step with it (m + 1 <= the budget); the
        step must end strictly before the next arrival. The step
        is `_schedule_prefill_first` + `_commit_prompts` in closed form (the same allocation,
        shape, duration and record), then the run goes on from its end as a run through
        finishes (`_decode_run_through`; the queue is empty now). With `straddle` (one replica)
        the step may be the one during which the next arrival comes: the run is that step alone.
        None (nothing changed) where that does not hold: the loop takes the step."""
        req = self.queue.peek()
        rb = self.running
        m = rb.m
        num_new = req.num_tokens
        if not (self._opens_alone(m) and self._admits_alone(req, m)):
            return None
        # _summarise_prompts' shape of one prompt with nothing computed (n = t, c = 0)
        shape = StepShape(num_new, 1, float(num_new * num_new + num_new) / 2.0, num_new, 1, num_new, -1)
        duration = step_time(shape) + 0.0  # (Replica.run adds the step's swap time, None: 0.0)
        end = now + duration  # (SimPy's env.now after the step's timeout)
        # an arrival during the step only joins the queue (one replica): the run is this step
        alone = not end < until_s
        delay = exact_delay(now, end)
        if (alone and not (straddle and end > until_s)) or delay is None:
            return None
        kv = self.kv
        kv.now = now
        cap = kv.allocate_slots(req, num_new, 0, full_sequence_must_fit=self.reserve_full_isl)
        if cap is None:
            return None
        # schedule: admitted (_admit_waiting, admit); commit: _commit_prompts
        self.step_swap_s = 0.0
        self._admitted = []
        self.queue.pop()
        slot = self.admit(req, 0, cap, now)
        rb.n[slot] = num_new
        self._commit_prompts(slot, end)  # (it makes > 1 output: nobody finishes)
        self._pure = False
        # what the loop records for the step: its Batch (_summarise_prompts') and the stats
        # after its commit
        batch = Batch(shape, 1, num_new, 0, 0, 1, None, [], self._admitted)
        counts = rb.computed_and_capacity_lists(rb.m)
        stats = self.stats((sum(counts[0]), sum(counts[1])))
        run = None if alone else self._decode_run_through(now, until_s, run_times, max_steps,
                                                          straddle, kv.decode_room(), end, stats.kv,
                                                          counts)
        if run is None:  # the prompt step alone
            run = DecodeRun(delay, np.array([now, end]), [], straddles=alone)
        run.prompt = (now, duration, batch, stats)
        self._decoding = True  # (the prompt step's request decodes next: it makes > 1 output)
        return run

    def _opens_alone(self, m: int) -> bool:
        """Whether a prompt step of one request admitted alone may open a run now (beside the m
        running requests): nothing outside watches the finishes or holds blocks, and the m are
        all decodes."""
        return not (self.kv_holding or self.watched_finishes or self.delay_free_blocks
                    or (m and not (self._decoding or self._all_decodes(m))))

    def _admits_alone(self, req: Request, m: int) -> bool:
        """Whether the loop's prompt step would admit `req` alone, whole, beside m running
        decodes, the step making its first output only: a fresh request (nothing computed, no
        output, never preempted) making more than one output, its prompt within the budget,
        under the sequence cap, and the m + 1 decodes after it in one step (else the loop takes
        them: decode_run's own precondition). The free blocks are the caller's to check."""
        return not (req.num_computed_tokens or req.num_output_tokens or req.num_preemptions
                    or req.output_tokens <= 1 or req.num_tokens > self.max_num_batched_tokens
                    or m >= self.max_num_seqs or m + 1 > self.max_num_batched_tokens)

    def _decode_run_through(self, now: float, until_s: float, run_times: Callable[..., np.ndarray],
                            max_steps: int, straddle: bool, room: int, start: float | None = None,
                            stats0: KVStats | None = None, counts: list[list[int]] | None = None
                            ) -> DecodeRun | None:
        """decode_run (sync) where the run goes on past every finish (`_runs_past_finish`) and the
        blocks a finish frees are room like any other (the KV manager's `decode_run_frees`):
        the run's segments (the steps between two finishing steps) found and applied in one
        pass, the same steps, blocks, records and finishes as decode_run's parts. Request i
        (slot i, L_i = target - outputs steps left) decodes in steps 0..L_i - 1 and finishes
        at the end of step L_i - 1. Steps:
        1. the blocks each request takes below min(L_i, horizon), in the loop's order (step,
           then slot: one sorted grid, as _decode_block_events);
        2. segment by segment (ends: the distinct L, ascending): its needs against the room
           (the run stops before the step of the need the free queue cannot give; a segment's
           finishes free their blocks: room for the next), its durations (the m_s requests
           left, KV entries C_s + m_s (j + 1)) and start times summed on from the last end;
           the segment the next arrival falls in is the last (a finishing step may not
           straddle it);
        3. counters advanced by min(L_i, k), the blocks popped segment by segment with each
           finishing step's frees after its pops (same ids), the finished written back as
           commit does (finish time = their last step's end), out of the batch in one pass;
        4. the k records as one block: m_j = #(L > j) decode, #(L > j + 1) left running, the KV
           gauges off the free-block count (free0 - taken + freed through j), the stored
           tokens used - (capacity - computed) (used - capacity is the same on every step: a
           block taken adds bs to both, a finish takes its blocks from both).
        `start`: the first step's start when the run began earlier (`_prompt_then_run`: after
        its prompt step; `now` is the run's start, what its SimPy delay counts from);
        `stats0`: the KV stats now, where the caller has them; `counts`: the running requests'
        computed tokens and KV capacities now, as two lists, where the caller has them."""
        rb = self.running
        kv = self.kv
        m0 = rb.m
        bs = kv.block_size
        free0 = room
        if stats0 is None:
            stats0 = kv.stats()
        used0 = stats0.used_slots
        left = rb.target_out[:m0] - rb.num_out[:m0]  # L: steps each request still decodes (>= 1)
        left_list = left.tolist()
        ends = sorted(set(left_list))  # the segments' ends (each one's last step finishes someone)
        t = now if start is None else start
        # the steps looked at: through the last finish, at most max_steps, and no further than
        # the next arrival can be at the shortest step there is (a run that stops short is
        # exact: the next one goes on from its end; this keeps the block grid to the ~k steps
        # a run takes before the next arrival, not the longest output left)
        horizon = min(ends[-1], max_steps, self._steps_before(t, until_s, run_times))
        if counts is None:
            counts = rb.computed_and_capacity_lists(m0)
        c_list, cap_list = counts
        # 1. request i takes a block at steps j0_i + q bs < min(L_i, horizon), no room cut here
        if m0 * (horizon // bs + 1) <= _PY_EVENTS_MAX:
            ev_i, ev_j = _few_block_events(left_list, c_list, cap_list, horizon, bs)
        else:
            _, ev_i, ev_j = self._decode_block_events(horizon, None, np.minimum(left, horizon))
        freed_at: dict[int, int] = {}  # L -> the blocks its finishing step frees (made when needed)

        def freed(n: int) -> int:
            """Blocks the finishers with L == n free: their own plus those they take in the run
            (all before their finish)."""
            if not freed_at:
                for q, x, taken in zip(left_list, cap_list, np.bincount(ev_i, minlength=m0).tolist()):
                    freed_at[q] = freed_at.get(q, 0) + x // bs + taken
            return freed_at[n]
        cap_sum = sum(cap_list)
        # 2. segment by segment: m_s = #(L > a), C_s = their computed (in L order: m0 is small)
        by_left = sorted(zip(left_list, c_list))
        c_total = c_left = sum(c_list)
        a = lo = pos = 0  # the segment's first step, the events and finishers before it
        pieces: list[np.ndarray] = []
        durs: list[np.ndarray] = []
        k = 0
        cut: tuple[int, float, bool] | None = None
        his: list[int] = []  # the events before each segment's end the run went on past
        for end in ends:
            b = min(end, horizon)
            hi = int(ev_j.searchsorted(b))
            if hi - lo > room:  # stop before the step of the need the free queue cannot give
                b = int(ev_j[lo + room])
                hi = lo + room
                if b <= a:
                    k = a
                    break
            m = m0 - pos
            durations = run_times(m, c_left + m * (a + 1), b - a)
            piece = np.empty(b - a + 1)
            piece[0] = t
            piece[1:] = durations
            _accumulate(piece, out=piece)  # (sums on from the last end, as SimPy adds them)
            pieces.append(piece)
            durs.append(durations)
            if piece[-1] >= until_s:  # the next arrival comes during this segment: the last
                pieces = [self._run_starts(pieces)]  # (summed once: the run's starts)
                cut = self._cut_summed(now, until_s, pieces[0], b,
                                       ((b - 1) if b == end else b) if straddle else 0)
                k = 0 if cut is None else cut[0]
                break
            k = b
            if b < end or b == horizon:
                break
            t = float(piece[-1])
            room -= hi - lo
            his.append(hi)
            while pos < m0 and by_left[pos][0] == end:  # its finishers leave, their blocks free
                c_left -= by_left[pos][1]
                pos += 1
            room += freed(end)
            lo = hi
            a = b
        if k < 1:
            return None
        starts = self._run_starts(pieces)[:k + 1]
        if cut is None:
            delay = exact_delay(now, float(starts[k]))
            if delay is None:
                return None
            straddled = False
        else:
            k, delay, straddled = cut
        durations = (durs[0] if len(durs) == 1 else np.concatenate(durs))[:k]
        # 4. the k records (before the counters move: c, cap are views of the columns)
        n_ev = int(ev_j.searchsorted(k))
        ev_i, ev_j = ev_i[:n_ev], ev_j[:n_ev]
        j1 = np.arange(1, k + 1, dtype=np.int64)  # j + 1
        free = free0 - ev_j.searchsorted(j1 - 1, side="right")  # less the blocks taken through step j
        # stored = used - (capacity - computed) of those left = (used0 - cap0) + sum of their
        # computed (c_i + j + 1)
        base = used0 - cap_sum
        fin = [n for n in ends if n <= k]  # the finishing steps (n - 1) of the run
        if not fin:  # the same m0 on every step (one value for the k steps)
            m_step = m_after = np.int64(m0)
            per_step: np.ndarray | int = m0
            first = base + c_total + m0
            stored = np.arange(first, first + m0 * k, m0, dtype=np.int64)
        else:
            # after each finishing step f = n - 1 (through the next one): those with L > n run,
            # their computed summed, the blocks freed so far: constant pieces of the k steps
            lens = [fin[0] - 1] + [b - a for a, b in zip(fin, fin[1:])] + [k - fin[-1] + 1]
            c_run = c_total  # the computed of those left (exact integers)
            m_vals, c_vals, f_vals = [m0], [c_run], [0]
            q = 0
            for n in fin:
                while by_left[q][0] <= n:  # (q < m0: the last end is finished only at n)
                    c_run -= by_left[q][1]
                    q += 1
                    if q == m0:
                        break
                m_vals.append(m0 - q)
                c_vals.append(c_run)
                f_vals.append(f_vals[-1] + freed(n))
            # (the three piecewise-constant columns, repeated in one call)
            m_after, c_after, f_after = np.array((m_vals, c_vals, f_vals), np.int64).repeat(lens, axis=1)
            m_step = np.empty(k, np.int64)  # #(L > j) = those left after step j - 1
            m_step[0] = m0
            m_step[1:] = m_after[:-1]
            per_step = m_step
            stored = base + c_after + j1 * m_after
            free += f_after  # plus the blocks freed so far
        used, usage = kv.free_gauges(free)
        first_gaps = starts[1] - rb.last_token[:m0]
        if k > 1:  # step 0: each one's gap since its last token; then the step's duration, m_j times
            later = (starts[2:] - starts[1:-1]).repeat(m0 if not fin else m_step[1:])
            gaps = np.concatenate((first_gaps, later))
        else:
            gaps = first_gaps
        columns = self._run_columns(starts[:k], durations, m_step, m_after, used, usage, stored,
                                    stats0)
        # 3. counters (request i decoded min(L_i, k) steps, its last token at that step's end),
        # then the blocks popped segment by segment, each finishing step's frees after its pops
        ran = np.minimum(left, k)
        rids = rb.ids[ev_i].tolist()
        times = starts[ev_j] if kv.decode_stamps else None
        if n_ev:
            rb.capacity[:m0] += bs * np.bincount(ev_i, minlength=m0)
        rb.computed[:m0] += ran
        rb.cols[TOKENS:NUM_OUT + 1, :m0] += ran  # tokens and num_out
        rb.last_token[:m0] = starts[ran]
        reqs = list(rb.reqs)
        parts: list[RunPart] = []
        finished_slots: list[int] = []
        lo = a = 0
        for s_i, end in enumerate(ends):
            b = min(end, k)
            hi = his[s_i] if s_i < len(his) else n_ev  # (the segments before the last end at theirs)
            if hi > lo:
                kv.take_decode_blocks(rids[lo:hi], None if times is None else times[lo:hi])
            done: list[Request] = []
            if b == end:  # its last step finishes those with L == end, in slot order (commit's)
                kv.now = float(starts[b - 1])
                t_end = float(starts[b])
                slots = [i for i, n in enumerate(left_list) if n == end]
                done = [self._finish_slot(i, t_end) for i in slots]
                finished_slots += slots
            parts.append(RunPart(None, None, None, done, b - a))
            lo = hi
            a = b
            if b == k:
                break
        if finished_slots:
            rb.remove_slots(sorted(finished_slots))
        kv.now = float(starts[k - 1])
        self._gaps = gaps[-(m0 if not fin else int(m_step[-1])):]
        self._admitted = []
        self.step_swap_s = 0.0
        self._pure = self._decoding = True  # as the loop leaves it after the run's last step
        self._quiet = not parts[-1].finished
        return DecodeRun(delay, starts, parts, straddles=straddled, columns=columns, gaps=gaps,
                         gaps_per_step=per_step, reqs=reqs)

    def _steps_before(self, t: float, until_s: float, run_times: Callable[..., np.ndarray]) -> int:
        """How many decode steps from `t` a run looks at: those that can end before `until_s`
        (the next arrival) at the shortest decode step there is (one request, one KV entry),
        plus 2 (the step that straddles it). A bound for speed only: a run that looks no
        further is exact (it stops short, the next one goes on from its end); without it a
        run through finishes covered every step to the last finish (W4: ~2,300 steps a run
        for the ~40 it takes). (The part-by-part runs look to the next finish only: bounding
        them too gained nothing on W3, callgrind.)"""
        if until_s == math.inf:
            return 1 << 30
        floor = self._shortest_step
        if floor is None:
            floor = self._shortest_step = float(run_times(1, 1, 1)[0])
        if not floor > 0.0:
            return 1 << 30
        return max(int((until_s - t) / floor), 0) + 2

    def _all_decodes(self, m: int) -> bool:
        """Every one of the m running requests is a decode: one token to compute, an output
        made (no prompt left)."""
        rb = self.running
        return _nnz(rb.tokens[:m] - rb.computed[:m] == 1) == m and _nnz(rb.num_out[:m]) == m

    def _head_waits(self, m: int) -> bool:
        """Whether the next step's admission (step 3 of `schedule`, or the prompts of
        `_schedule_prefill_first`) surely admits nobody while m running requests decode: an
        fcfs queue (arrivals join its tail), no swapped or CPU-tier head, and the head does not
        fit the budget, the sequence cap or the KV manager's room (kv.admission_fits)."""
        if not self._arrival_joins_tail or self.kv.decode_room() is None:
            return False
        budget = self.max_num_batched_tokens - (m if self.chunked_prefill else 0)
        if m >= self.max_num_seqs or budget <= 0:
            return True
        req = self.queue.peek()
        if req is None:
            return True
        if req.num_computed_tokens or (self.swap is not None and self.swap.holds(req)):
            return False
        num_new = req.num_tokens
        if not self.chunked_prefill and num_new > budget:
            return True
        return not self.kv.admission_fits(req, min(num_new, budget), self.reserve_full_isl)

    def _runs_past_finish(self) -> bool:
        """Whether the step after a finishing step of a sync decode run is sure to be a pure
        decode of the requests left: nobody can be admitted (an empty queue, or a batching mode
        that admits only into an empty batch) and nothing outside watches the finishes (P/D's
        pull queue, tried after every step of a decode replica: `watched_finishes`)."""
        return not (self.watched_finishes or self.kv_holding
                    or (len(self.queue) and self.batching.admits_waiting))

    def _finish_slot(self, i: int, now: float, free: bool = True) -> Request:
        """The running request at slot i finishes at `now`: written back, FINISHED, its queue
        told, its KV freed unless the caller keeps it (P/D's delayed free); `_finish_slots`
        compresses the running batch afterwards (one pass for all who finish in the step)."""
        return self._finished(self.running.write_back(i), now, free)

    def _finished(self, req: Request, now: float, free: bool = True) -> Request:
        """`req`, its counters written back, finishes at `now` (`_finish_slot`, and a span's
        admissions that finish before it ends, never in the running batch)."""
        req.finish_s = now
        req.status = Status.FINISHED
        self.queue.on_stop(req)
        if free:
            self.kv.free(req)
        return req

    def _finish_slots(self, slots: list[int], now: float, free: bool = True) -> list[Request]:
        """The running requests at `slots` (ascending) finish at `now` (`_finish_slot`, in slot
        order: their KV freed in running order), then leave the batch in one pass."""
        finished = [self._finish_slot(i, now, free) for i in slots]
        self.running.remove_slots(slots)
        return finished

    def _finish_in_run(self, columns: dict[str, Any], now: float, done: np.ndarray
                       ) -> tuple[list[Request], tuple[KVStats, int, int]]:
        """A decode run's finishing step (its last, just applied): the requests at their output
        target finish as `commit` finishes them (written back, KV freed in running order, out of
        the batch); the step's record then shows the batch and the KV after the frees, as the
        loop records them after commit. Returns the finished requests and what the next part
        starts from: (the KV stats, sum of computed, sum of capacity) of those left."""
        rb = self.running
        m = rb.m
        kv = self.kv
        finished = self._finish_slots(done.nonzero()[0].tolist(), now)  # commit's step 3, as it does it
        k = len(columns["start_s"])
        stats = kv.stats()
        left = rb.m
        running = np.empty(k, np.int64)  # (np.full is a Python wrapper: hot path)
        running.fill(m)
        running[-1] = left
        columns["num_running"] = running
        columns["kv_used_slots"][-1] = stats.used_slots
        columns["kv_usage"][-1] = stats.usage
        c_left, cap_left = rb.computed_and_capacity(left)
        columns["kv_tokens_stored"][-1] = stats.used_slots - (cap_left - c_left)
        for name, value in (("prefix_queries_total", stats.prefix_queries),
                            ("prefix_hits_total", stats.prefix_hits),
                            ("evictions_total", stats.num_evictions),
                            ("kv_external_frag_slots", stats.external_frag_slots)):
            before = columns[name]
            if before is not None and before != value:
                col = np.full(k, before)
                col[-1] = value
                columns[name] = col
        return finished, (stats, c_left, cap_left)

    def _decode_run_async(self, now: float, until_s: float, run_times: Callable[..., np.ndarray],
                          max_steps: int, inflight_s: float | None, straddle: bool
                          ) -> DecodeRun | None:
        """decode_run under async scheduling: with step X in flight (started at `now`, lasting
        `inflight_s`), k loop turns at once: schedule X+1..X+k, commit X..X+k-1; X+k is left
        in flight (returned as next_batch). Steps:
        1. precondition: X is a pure decode of every running request (each with one output in
           flight), the commit before it finished nothing, nothing arrived since X was
           scheduled (`_quiet`); then schedule X+1 decides as X did;
        2. parts: with L = min(target - outputs with placeholders), turns 1..L schedule every
           request (no schedule skips a request whose last token is in flight, no commit
           finishes one); turn L + 1 is the finishing turn: its schedule skips those whose last
           token is in flight (vLLM's num_output_placeholders check) and its commit finishes
           them, KV freed a step late as vLLM frees it. A part ends with its finishing turn
           where its schedule is sure to admit nobody and someone is left to schedule; the run
           goes on past it only where the next schedule is sure to be a pure decode of those
           left (an empty queue); <= max_steps turns in all;
        3. blocks: as decode_run (schedule X+1+j' takes request i's next block at the same
           j' = capacity - computed + q * block_size; computed counts the token in flight),
           none for a request its schedule skips;
        4. times: step X+j-1 ends at T_j = T_{j-1} + its duration (X's is `inflight_s`, the
           others the cost model's over numpy); schedule X+j runs at T_{j-1}; k stops so T_k
           < until_s (the next arrival), or with `straddle` at the first turn ending after it
           unless that turn's commit finishes someone; T_k is reachable by one exact SimPy delay;
        5. apply as decode_run; the tokens of step X+j-1 reach the client at T_j."""
        rb = self.running
        if not rb.m or not self._quiet or inflight_s is None or self._cut_at == (now, until_s):  # 1.
            return None
        kv = self.kv
        room = kv.decode_room()
        if room is None:
            return None
        # a finishing turn's schedule gets more budget than X's: nobody is admitted with a
        # waiting queue only if X's admission was tried with budget left (and failed)
        past = not (self.kv_holding or len(self.queue))
        parts: list[RunPart] = []
        all_starts: list[np.ndarray] = []
        t, d_inflight = now, inflight_s
        turns = 0
        delay = 0.0
        straddled = False
        shape: StepShape | None = None
        finished: list[Request] = []
        carry = None  # what the last part's finishing turn left: (KV stats, sum computed, sum capacity)
        while True:
            m = rb.m
            left = rb.target_out[:m] - rb.num_out[:m]
            q = int(_min(left))  # 2. turns before the finishing one
            survivors = left > q
            m_next = int(_nnz(survivors))
            # the last ones leaving: the finishing turn's schedule is empty (nothing left to run)
            finishes = past if not m_next else past or self.max_num_batched_tokens > m
            k = min(q + 1 if finishes else q, max_steps - turns)
            if k < 1:
                break
            events = self._decode_block_events(k, room, np.minimum(left, k) if k > q else None)  # 3.
            if events is None:
                break
            k, ev_i, ev_j = events
            c0 = rb.computed[:m]
            if carry is None:
                carry = (None, *rb.computed_and_capacity(m))
            c_sum = carry[1]  # 4.
            n_pure = min(k, q)
            if n_pure:
                w_next, d_next = self._decode_shapes(n_pure, c_sum, run_times)
            if k > q and not m_next:  # an empty schedule: nothing to run
                d_sched = np.concatenate((d_next[:n_pure], [0.0])) if n_pure else np.zeros(1)
            elif k > q:  # the finishing turn schedules those left (their computed then: c + q)
                c_left = c0[survivors] + q
                kv_skip = int(_sum(c_left)) + m_next
                w_skip = (-1 if not self.window_tokens else
                          int(window_kv_sums(c_left, np.ones(1, np.int64), self.window_tokens)[0]))
                d_skip = (run_times(m_next, kv_skip, 1) if w_skip < 0 else
                          run_times(m_next, kv_skip, 1, np.array([w_skip])))
                d_sched = np.concatenate((d_next[:n_pure], d_skip)) if n_pure else d_skip
            else:
                d_sched = d_next
            starts = np.empty(k + 1)
            starts[0] = t
            starts[1] = d_inflight
            starts[2:] = d_sched[:k - 1]
            cut = self._cut_to_arrival(now, until_s, starts, k, (k - (k > q)) if straddle else 0)
            if cut is None:
                break
            k, delay, straddled = cut
            starts = starts[:k + 1]
            durations = np.concatenate(([d_inflight], d_sched[:k - 1]))
            reqs = list(rb.reqs)
            columns, gaps = self._apply_decode_run(k, starts, durations, ev_i, ev_j, c_sum, reqs,  # 5.
                                                   carry[0], carry[2])
            rb.n[:m] = 1
            if k > q:  # the finishing turn: those skipped took q schedules, their last resolved
                done = ~survivors
                rb.computed[:m][done] -= 1
                rb.tokens[:m][done] -= 1
                rb.num_out[:m][done] -= 1
                rb.ph[:m][done] = 0
                finished, carry = self._finish_in_run(columns, float(starts[k]), done)
                if m_next:
                    shape = StepShape(m_next, m_next, float(kv_skip), kv_skip, m_next, 0, w_skip)
                    d_inflight = float(d_skip[0])
                else:  # the empty schedule commits at once (Replica.run_async): nothing in flight
                    shape = None
            else:  # (the run ends here: _next_part goes on only past a finish)
                finished, carry = [], None
                j = k - 1
                entries = c_sum + m * (j + 1)  # (_decode_shapes' step j)
                shape = StepShape(m, m, float(entries), entries, m, 0,
                                  -1 if w_next is None else int(w_next[j]))
                d_inflight = float(d_sched[j])
            turns += k
            t = float(starts[k])
            room = self._next_part(parts, all_starts, RunPart(columns, gaps, reqs, finished), starts,
                                   straddled or not past or turns >= max_steps)
            if room is None:
                break
        if not parts:
            return None
        self._pure = self._quiet = not finished  # a finishing turn's schedule skipped someone
        m = rb.m
        if shape is None:
            self._inflight.clear()
            self._gaps = None
            return DecodeRun(delay, self._run_starts(all_starts), parts, None, 0.0, True, straddled)
        # the step left in flight: every running request samples (the record X's commit reads)
        self._inflight[0] = _InFlight(np.arange(m), list(rb.reqs), rb.computed[:m].copy(), rb.version)
        nxt = Batch(shape, m, 0, m, 0, 0, None, [], [])
        return DecodeRun(delay, self._run_starts(all_starts), parts, nxt, d_inflight, True, straddled)

    def _next_part(self, parts: list[RunPart], all_starts: list[np.ndarray], part: RunPart,
                   starts: np.ndarray, ends_here: bool) -> int | None:
        """A decode run's part (sync or async) joins the run; the free-block room for the next
        part, or None where the run ends with this one (`ends_here`, no finish in it to go on
        past, nobody left)."""
        parts.append(part)
        all_starts.append(starts)
        if ends_here or not part.finished or not self.running.m:
            return None
        return self.kv.decode_room()

    @staticmethod
    def _run_starts(parts: list[np.ndarray]) -> np.ndarray:
        """The run's start times from its parts' (each part's end is the next one's start)."""
        if len(parts) == 1:
            return parts[0]
        return np.concatenate([*(x[:-1] for x in parts[:-1]), parts[-1]])

    def _decode_shapes(self, k: int, c_sum: int, run_times: Callable[..., np.ndarray]
                       ) -> tuple[np.ndarray | None, np.ndarray]:
        """decode_run's step 4 shapes: k decode steps of the running batch have attention pairs
        and KV entries both C + m (j + 1) at step j (exact integers; C = c_sum); for sliding
        layers the windowed entries, min(c + j + 1, window) summed per request (else None); and
        the steps' durations from `run_times` (CostModel.decode_run_times' signature)."""
        rb = self.running
        m = rb.m
        if not self.window_tokens:
            return None, run_times(m, c_sum + m, k)
        window = window_kv_sums(rb.computed[:m], np.arange(1, k + 1, dtype=np.int64), self.window_tokens)
        return window, run_times(m, c_sum + m, k, window)

    def _cut_to_arrival(self, now: float, until_s: float, starts: np.ndarray, k: int, straddle: int = 0
                        ) -> tuple[int, float, bool] | None:
        """decode_run's step 4 end: `starts` (now, then the step durations) summed in place into
        start times as SimPy adds them; k stops so the last step ends strictly before `until_s`
        (the next arrival), or, when it is one of the first `straddle` steps, at the step that
        ends strictly after it; that end is reachable by one exact SimPy delay: (k, delay,
        whether the last step straddles the arrival), or None when no step is left."""
        _accumulate(starts, out=starts)  # (np.cumsum's sums, without its ~3 us of wrappers)
        return self._cut_summed(now, until_s, starts, k, straddle)

    def _cut_summed(self, now: float, until_s: float, starts: np.ndarray, k: int, straddle: int = 0
                    ) -> tuple[int, float, bool] | None:
        """_cut_to_arrival over start times already summed."""
        k_arr = int(starts[1:].searchsorted(until_s, side="left"))
        straddled = False
        if k_arr < k:
            if k_arr < straddle and starts[k_arr + 1] > until_s:
                k = k_arr + 1
                straddled = True
            else:
                k = k_arr
                self._cut_at = (float(starts[k]), until_s)
        if k < 1:
            return None
        delay = exact_delay(now, float(starts[k]))
        if delay is None:
            return None
        return k, delay, straddled

    def _decode_block_events(self, k: int, room: int | None, horizon: np.ndarray | None = None
                             ) -> tuple[int, np.ndarray, np.ndarray] | None:
        """decode_run's step 3: the blocks k decode steps take, in the loop's order (step, then
        running order) as (request slot, step) pairs; k cut before the step whose block the free
        queue (`room` blocks; None: no cut, the caller checks) cannot give. `horizon`: request
        i is scheduled in steps 0..horizon[i] - 1 only (default k). None: not even one step."""
        rb = self.running
        m = rb.m
        bs = self.kv.block_size
        j0 = rb.capacity[:m] - rb.computed[:m]  # the first step at which each request needs a block
        h = k if horizon is None else horizon
        # NOTE: request i takes a block at steps j0_i + q bs < h_i, q = 0, 1, ... (j0 >= 0, a
        # decode's capacity covers its computed tokens): row q of an (L, m) grid of steps,
        # L = ceil(k / bs) (no horizon is past k),
        #     q = 0:  j0_0        j0_1        ...  j0_(m-1)
        #     q = 1:  j0_0 + bs   j0_1 + bs   ...
        # masked by steps < h; the keys step * m + slot, sorted, are the (step, slot) order
        layers = self._layer_steps(-(-k // bs))  # (a horizon is never past k)
        steps = j0 + layers
        key = steps * m
        key += self._slots[:m]
        key = key[steps < h]
        if not len(key):
            return k, _NO_EVENTS, _NO_EVENTS
        key.sort()
        ev_j, ev_i = np.divmod(key, m)
        if room is not None and len(key) > room:
            k = int(ev_j[room])
            if k < 1:
                return None
        return k, ev_i, ev_j

    def _layer_steps(self, num_layers: int) -> np.ndarray:
        """The column (0, bs, 2 bs, ...) of num_layers steps, bs the KV block size
        (`_decode_block_events`' grid rows), kept per size."""
        col = self._layer_cols.get(num_layers)
        if col is None:
            bs = self.kv.block_size
            col = self._layer_cols[num_layers] = np.arange(0, num_layers * bs, bs, dtype=np.int64)[:, None]
        return col

    def _apply_decode_run(self, k: int, starts: np.ndarray, durations: np.ndarray, ev_i: np.ndarray,
                          ev_j: np.ndarray, c_sum: int, reqs: list[Request],
                          stats: KVStats | None, cap0: int
                          ) -> tuple[dict[str, Any], np.ndarray]:
        """decode_run's step 5 (sync and async): the blocks popped in order, the counters advanced
        by k, the token gaps; returns the k records as columns (constant ones as numpy scalars:
        the recorder keeps one value for the k steps) and the gaps. `reqs`: the running batch;
        `stats`: the KV stats now (None: read here), `cap0`: the capacity sum now.
        NOTE: the KV gauges in closed form: each block a step takes adds block_size used slots
        and block_size capacity, so used - capacity (hence the stored tokens less the computed)
        is the same on all k steps."""
        rb = self.running
        m = len(reqs)
        kv = self.kv
        bs = kv.block_size
        n_ev = int(ev_j.searchsorted(k)) if len(ev_j) else 0
        if stats is None:  # (else the KV stats and capacity sum as the last finish left them)
            stats = kv.stats()
        if n_ev:
            ev_i, ev_j = ev_i[:n_ev], ev_j[:n_ev]
            kv.take_decode_blocks(rb.ids[ev_i].tolist(), starts[ev_j] if kv.decode_stamps else None)
            taken = ev_j.searchsorted(np.arange(k), side="right")  # blocks taken through each step
            rb.capacity[:m] += bs * np.bincount(ev_i, minlength=m)
        else:
            taken = np.zeros(k, np.int64)
        used, usage = kv.decode_gauges(taken)
        # stored = used - (capacity - computed) after each step j (computed: c_sum + m (j + 1))
        first_stored = stats.used_slots - cap0 + c_sum + m
        stored = np.arange(first_stored, first_stored + m * k, m, dtype=np.int64)
        rb.computed[:m] += k
        rb.cols[TOKENS:NUM_OUT + 1, :m] += k  # tokens and num_out
        last = rb.last_token[:m]
        first = starts[1] - last
        gaps = np.concatenate((first, (starts[2:] - starts[1:-1]).repeat(m))) if k > 1 else first
        last[:] = starts[k]
        self._gaps = gaps[-m:]
        kv.now = starts.item(k - 1)
        self._admitted = []
        self.step_swap_s = 0.0
        full = np.int64(m)
        return self._run_columns(starts[:k], durations, full, full, used, usage, stored, stats), gaps

    def _run_columns(self, starts: np.ndarray, durations: np.ndarray, seqs: np.ndarray | np.generic,
                     running: np.ndarray | np.generic, used: np.ndarray, usage: np.ndarray,
                     stored: np.ndarray, stats: KVStats) -> dict[str, Any]:
        """A decode run's k records as MetricsRecorder.record_many columns: `seqs` decode (one
        token each, all sampled) in each step, `running` are left after it (k values, or one
        numpy scalar for the k steps); the KV manager's running totals as they are (`stats`:
        nothing in a run changes them)."""
        # (a total the manager does not keep is None: not kept, else one numpy scalar for the k)
        queries, hits = stats.prefix_queries, stats.prefix_hits
        evictions, frag = stats.num_evictions, stats.external_frag_slots
        return {
            "start_s": starts, "duration_s": durations, "num_seqs": seqs,
            "num_tokens": seqs, "prefill_tokens": _ZERO, "decode_tokens": seqs,
            "num_preempted": _ZERO, "num_admitted": _ZERO, "num_running": running,
            "num_waiting": np.int64(self.num_waiting()), "kv_used_slots": used,
            "kv_usage": usage, "kv_tokens_stored": stored, "num_sampled": seqs,
            "prefix_queries_total": None if queries is None else np.asarray(queries)[()],
            "prefix_hits_total": None if hits is None else np.asarray(hits)[()],
            "evictions_total": None if evictions is None else np.asarray(evictions)[()],
            "swap_s": None if self.swap is None else _ZERO_S,
            "kv_external_frag_slots": None if frag is None else np.asarray(frag)[()]}

    def stats(self, sums: tuple[int, int] | None = None) -> SchedulerStats:
        """`sums`: (sum of computed tokens, sum of KV capacity) of the running requests, where
        the caller has them (else one dot product here)."""
        rb = self.running
        m = len(rb.reqs)
        kv = self.kv.stats()
        # KV slots holding token states: the allocated slots less each running request's unused
        # tail (capacity - computed). Shared prefix blocks are full and counted once, unlike a
        # sum of computed tokens.
        computed, capacity = rb.computed_and_capacity(m) if sums is None else sums
        stored = kv.used_slots - (capacity - computed)
        swap = None if self.swap is None else self.swap.stats()
        return SchedulerStats(m, self.num_waiting(), stored, kv,
                              self.num_preemptions, self._gaps, swap,
                              None if self.offload is None else self.offload.stats)

    def num_waiting(self) -> int:
        return len(self.queue) + len(self.kv_holding)

    def scheduled(self) -> dict[int, int]:
        """{req_id: tokens} of the step just scheduled, in running order (tests, traces)."""
        rb = self.running
        return {r.req_id: int(n) for r, n in zip(rb.reqs, rb.n[: rb.m].tolist()) if n}
