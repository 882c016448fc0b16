"""A span: a sync prefill-first decode run that admits the arrivals ahead of it itself.

W4's engine at ~70 % load (one replica, prefill-first, no prefix caching) runs one request in
three loop turns: its arrival (the feed's SimPy event), then a run that opens with its prompt
step and decodes the batch until the step during which the next request arrives
(`Scheduler._prompt_then_run`, `_decode_run_through`), then the replica's next turn. Each run
costs ~60 numpy calls and the records of ~40 steps, whatever its length. A span takes the
arrivals ahead (advance.Lookahead, one replica only) into one run: the queued request's prompt
step, the decode steps until the step during which the next one arrives, that one's prompt
step, and so on, as long as each arrival is one the step loop would admit alone in the prompt
step right after the step it came in. Same steps, same blocks, same records as the loop:
1. plan (nothing changes yet): epoch by epoch, the prompt step's shape and duration
   (`step_time`), then the decode segments (between two finishes) with their durations
   (`run_times`), the blocks each request takes (request g takes one at decode steps
   first_g + q block_size, first_g = its start + capacity - computed), the free-block count
   (the loop's order: a step's blocks, then its finishes' frees, then the next prompt's), and
   where the next arrival falls. The span stops where `_prompt_then_run` and
   `_decode_run_through` stop a run: a step ending exactly at an arrival, an arrival during a
   finishing step, a need the free blocks cannot give, an arrival the loop would not admit
   alone right after (two arrivals in one step, one the replica rejects, one that does not fit);
   the last step may straddle the next arrival (it only joins the queue);
2. apply, in the loop's order: each prompt's allocation, each segment's blocks, each finish's
   frees; the counters of the running requests once, those who finish written back, those
   admitted appended to the running batch;
3. the records as one block of columns, piecewise constant over the planned chunks, with the
   KV gauges from the free-block count after each step and the token gaps (a prompt step makes
   none; a decode step's gap is the time since the request's last token: the last decode
   step's end, its own prompt step's end, or its last token before the span).
The feed, woken at the first admitted arrival's time, goes on after the last one, landing its
next timeout where the loop's would (Lookahead.last_f).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.engine.advance import DecodeRun, Lookahead, RunPart, exact_delay, landing
from simulator.engine.costmodel import StepShape
from simulator.engine.scheduling.running import NUM_OUT, TOKENS

if TYPE_CHECKING:
    from simulator.engine.scheduling.scheduler import Scheduler

_accumulate = np.add.accumulate


def span_run(s: Scheduler, now: float, until_s: float, run_times: Callable[..., np.ndarray],
             max_steps: int, step_time: Callable[[StepShape], float], ahead: Lookahead
             ) -> DecodeRun | None:
    """The span from `now` (module docstring), or None where it cannot open (the caller goes on
    as without lookahead). `max_steps`: the most decode steps it takes."""
    rb = s.running
    kv = s.kv
    queue = s.queue
    req = queue.peek()
    m0 = rb.m
    times = ahead.times
    n_arr = len(times)
    ai = ahead.next_i  # the next arrival the feed would submit (its SimPy time is until_s)
    if (req is None or len(queue) != 1 or kv.decode_stamps or not s._opens_alone(m0)
            or until_s != (landing(ahead.last_f, times[ai]) if ai < n_arr else math.inf)):
        return None
    free0 = free = kv.decode_room()
    if free is None:
        return None
    bs = kv.block_size
    comp0, cap0 = rb.computed_and_capacity_lists(m0)
    # members g: the running requests (slot g), then those admitted, in order. Member g decodes
    # in decode steps start[g] .. end[g] - 1 (it finishes at the end of end[g] - 1), with c[g]
    # tokens computed and a capacity of k[g] at start[g]; it takes a block at decode steps
    # first[g] + q bs < end[g]
    reqs = list(rb.reqs)
    start = [0] * m0
    end = (rb.target_out[:m0] - rb.num_out[:m0]).tolist()
    c = comp0
    k = cap0
    first = [x - y for x, y in zip(cap0, comp0)]
    live = list(range(m0))  # members decoding now, in slot order
    ends = list(end)  # the live's finish steps (a heap; equal ones repeat)
    heapq.heapify(ends)
    csum = sum(comp0)  # sum over the live of c - start: the KV entries at decode step d are csum + m (d + 1)
    # the next arrival not admitted: A is its SimPy time (where the feed's timeout lands, which
    # may be an ulp off its time in the workload), what every decision about it compares
    A = until_s
    f_last = ahead.last_f
    f_first = until_s  # when the feed wakes (its pending timeout)
    # the plan, in time order
    t = now
    d = 0  # decode steps planned
    rows = 0  # rows planned (prompt steps and decode steps)
    pieces: list[Any] = []  # the rows' start times (an array a segment, a tuple a prompt step)
    durs: list[Any] = []  # their durations
    # chunks of rows with the same values: (rows, seqs, tokens, prefill, decode, admitted,
    # running after, waiting after)
    chunks: list[tuple[int, int, int, int, int, int, int, int]] = []
    joined: list[tuple[int, int, float, int]] = []  # (member, row, prompt end, blocks) an admission
    ops: list[tuple] = []  # what is applied, in the loop's order
    pop_rows: list[int] = []  # the row of each block a decode step takes
    fins: list[tuple[int, int, int]] = []  # (row, blocks freed, capacity - computed freed)
    # with a step trace: per chunk, who it schedules ((req_id, tokens) pairs), who it admits and
    # who its last row finishes
    traced: list[tuple] | None = [] if ahead.traced else None
    straddled = False
    cut_at = None
    taken = 0
    opening = True
    while True:
        # -- the prompt step of `req` at t, as _prompt_then_run makes it
        m = len(live)
        prompt = req.num_tokens
        need = -(-prompt // bs)
        if need > free or not s._admits_alone(req, m):
            if opening:
                return None
            break  # (the last step straddles its arrival: the loop takes it)
        after = A if opening else (landing(A, times[ai + 1]) if ai + 1 < n_arr else math.inf)
        dur = step_time(StepShape(prompt, 1, float(prompt * prompt + prompt) / 2.0, prompt, 1,
                                  prompt, -1)) + 0.0
        p_end = t + dur
        if p_end == after:  # it ends exactly as the next request arrives: the loop orders them
            if opening:
                return None
            break
        if not opening:  # arrival ai admitted
            taken += 1
            f_last = A
            ai += 1
            A = after
        opening = False
        g = len(reqs)
        reqs.append(req)
        start.append(d)
        end.append(d + req.output_tokens - 1)
        c.append(prompt)
        k.append(need * bs)
        first.append(d + need * bs - prompt)
        heapq.heappush(ends, end[g])
        live.append(g)
        csum += prompt - d
        free -= need
        joined.append((g, rows, p_end, need))
        ops.append((_PROMPT, g, t, p_end))
        pieces.append((t,))
        durs.append((dur,))
        waiting = 1 if A < p_end else 0
        chunks.append((1, 1, prompt, prompt, 0, 1, m + 1, waiting))
        if traced is not None:
            traced.append((((req.req_id, prompt),), ((req.req_id, 0),), ()))
        rows += 1
        t = p_end
        if waiting:  # the next request arrives during this prompt step
            req = _next(ahead, ai, A, p_end, f_first)
            if req is None:
                straddled = True
                break
            continue
        # -- decode steps, segment by segment (between finishes), through the step A comes in
        stop = arrive = False
        while True:
            m = len(live)
            if not m:  # everyone finished before the next arrival: the replica idles
                stop = True
                break
            f = ends[0]
            b = min(f, max_steps, d + s._steps_before(t, A, run_times))
            if b <= d:
                stop = True
                break
            # the blocks the segment's steps take, as (step, member) keys
            width = len(reqs)
            ev: list[int] = []
            for gg in live:
                j = first[gg]
                if j < d:
                    j += -(-(d - j) // bs) * bs
                h = end[gg] if end[gg] < b else b
                while j < h:
                    ev.append(j * width + gg)
                    j += bs
            n = b - d
            if len(ev) > free:  # stop before the step whose block the free queue cannot give
                ev.sort()
                n = ev[free] // width - d
                stop = True
                if n < 1:
                    break
            durations = run_times(m, csum + m * (d + 1), n)
            piece = np.empty(n + 1)
            piece[0] = t
            piece[1:] = durations
            _accumulate(piece, out=piece)  # (sums on from t, as SimPy adds them)
            finishing = d + n == f and not stop
            if piece[-1] >= A:  # the next request arrives during the segment
                x = int(piece[1:].searchsorted(A, side="left"))
                if piece[x + 1] == A or (finishing and x == n - 1):
                    # a step ending exactly at the arrival, or a finishing step it comes during:
                    # the span ends before that step (_cut_summed)
                    n = x
                    cut_at = (float(piece[x]), A)
                    stop = True
                else:
                    n = x + 1
                    arrive = True
                finishing = False
            if n:
                if ev:
                    lim = (d + n) * width
                    ev = sorted(e for e in ev if e < lim)
                    if ev:
                        ops.append((_TAKE, [reqs[e % width].req_id for e in ev]))
                        pop_rows.extend(rows + e // width - d for e in ev)
                        free -= len(ev)
                pieces.append(piece[:n])
                durs.append(durations[:n])
                done = [gg for gg in live if end[gg] == f] if finishing else []
                last = 1 if (arrive or done) else 0
                if n > last:
                    chunks.append((n - last, m, m, 0, m, 0, m, 0))
                if last:
                    chunks.append((1, m, m, 0, m, 0, m - len(done), 1 if arrive else 0))
                if traced is not None:
                    batch = tuple((reqs[gg].req_id, 1) for gg in live)
                    if n > last:
                        traced.append((batch, (), ()))
                    if last:
                        traced.append((batch, (), tuple(sorted(reqs[gg].req_id for gg in done))))
                rows += n
                d += n
                t = float(piece[n])
                if done:
                    freed = slack = 0
                    for gg in done:
                        cap = k[gg] + bs * _taken(first[gg], end[gg], bs)
                        freed += cap // bs
                        slack += cap - (c[gg] + end[gg] - start[gg])
                        csum -= c[gg] - start[gg]
                    while ends and ends[0] == f:
                        heapq.heappop(ends)
                    live = [gg for gg in live if end[gg] != f]
                    free += freed
                    fins.append((rows - 1, freed, slack))
                    ops.append((_FINISH, done, float(piece[n - 1]), t))
            if stop or arrive:
                break
        if stop:  # (a cut where the free queue runs out may still end with the arrival's step)
            straddled = arrive
            break
        # the step just planned straddles arrival ai: admit it next if the loop would
        req = _next(ahead, ai, A, t, f_first)
        if req is None:
            straddled = True
            break
    delay = exact_delay(now, t)
    if delay is None:
        return None
    plan = _Plan(rows, d, reqs, start, end, first, c, k, joined, ops, pieces, durs, chunks,
                 pop_rows, fins, free0, traced)
    run = _apply(s, plan, m0, now, delay, straddled, taken)
    if cut_at is not None:
        s._cut_at = cut_at
    if taken:
        ahead.next_i = ai
        ahead.last_f = f_last
    return run


_PROMPT, _TAKE, _FINISH = range(3)


def _taken(first: int, end: int, bs: int) -> int:
    """Blocks a member takes at decode steps first + q bs < end."""
    return -(-(end - first) // bs) if end > first else 0


def _next(ahead: Lookahead, ai: int, A: float, row_end: float, f_first: float):
    """The request of arrival ai, which comes (SimPy time A) during the row ending at row_end,
    where the span may admit it in the prompt step right after: the next arrival comes after
    that row ends, the feed (woken at f_first, the first admitted one's time) can land exactly
    where it would have landed after this one, and the replica would accept it; else None (the
    span ends: the feed submits it)."""
    times = ahead.times
    n = len(times)
    if ai >= n or not A < row_end:
        return None
    if ai + 1 < n:
        after = landing(A, times[ai + 1])
        if not after > row_end or exact_delay(f_first, after) is None:
            return None
    req = ahead.make(ai)
    return req if ahead.accept(req) else None


@dataclass(slots=True)
class _Plan:
    """What span_run planned (its locals of the same names)."""

    rows: int
    steps: int  # decode steps
    reqs: list
    start: list[int]
    end: list[int]
    first: list[int]
    c: list[int]
    k: list[int]
    joined: list[tuple[int, int, float, int]]
    ops: list[tuple]
    pieces: list[Any]
    durs: list[Any]
    chunks: list[tuple]
    pop_rows: list[int]
    fins: list[tuple[int, int, int]]
    free0: int
    traced: list[tuple] | None


def _apply(s: Scheduler, p: _Plan, m0: int, now: float, delay: float, straddled: bool, taken: int
           ) -> DecodeRun:
    """Phases 2 and 3 of the module docstring: the plan applied, the run with its records."""
    rb = s.running
    kv = s.kv
    bs = kv.block_size
    R = p.rows
    D = p.steps
    starts = np.concatenate(p.pieces)
    durations = np.concatenate(p.durs)
    row_end = starts + durations  # (each row's end: the sum the plan made)
    lens = [ch[0] for ch in p.chunks]
    seqs, tokens, prefill, decode, admitted, running, waiting = np.repeat(
        np.array(p.chunks, np.int64).T[1:], lens, axis=1)
    # the decode steps: their rows, ends and batch sizes
    dec_rows = (prefill == 0).nonzero()[0]
    dec_end = row_end[dec_rows]
    m_dec = seqs[dec_rows]
    # token gaps: a member's gap at decode step d is dec_end[d] - its last token: dec_end[d - 1],
    # else (its first step in the span) its prompt step's end, or its last token before
    step_gap = dec_end.copy()
    step_gap[1:] -= dec_end[:-1]
    gaps = step_gap.repeat(m_dec)
    if D:
        gaps[:m0] = dec_end[0] - rb.last_token[:m0]
        ends_at = np.cumsum(m_dec).tolist()  # one past each decode step's entries
        # those joining at decode step sd are its last entries, in admission order: the last
        # one admitted is the step's last entry
        back: dict[int, int] = {}
        for g, _, p_end, _ in reversed(p.joined):
            sd = p.start[g]
            if sd < D:
                back[sd] = back.get(sd, 0) + 1
                gaps[ends_at[sd] - back[sd]] = dec_end[sd] - p_end
    # the free blocks after each row: the blocks taken (prompts, decode steps), those freed
    delta = np.zeros(R, np.int64)
    slack = np.zeros(R, np.int64)  # the change of sum(capacity - computed) of the running
    slack -= decode
    if p.pop_rows:
        taken_at = np.bincount(np.array(p.pop_rows, np.intp), minlength=R)
        delta -= taken_at
        slack += bs * taken_at
    for g, row, _, need in p.joined:
        delta[row] -= need
        slack[row] += need * bs - p.c[g]
    for row, freed, gone in p.fins:
        delta[row] += freed
        slack[row] -= gone
    free = p.free0 + np.cumsum(delta)
    used, usage = kv.free_gauges(free)
    x0 = sum(p.k[:m0]) - sum(p.c[:m0])
    stored = used - (x0 + np.cumsum(slack))
    stats = kv.stats()  # (its running totals: nothing in a span changes them)
    # the running requests' counters, once (their finishes below read them back)
    ends0 = np.minimum(np.array(p.end[:m0], np.int64), D)
    if m0 and D:
        rb.computed[:m0] += ends0
        rb.cols[TOKENS:NUM_OUT + 1, :m0] += ends0
        rb.last_token[:m0] = dec_end[ends0 - 1]
        took = [_taken(f, e, bs) for f, e in zip(p.first[:m0], ends0.tolist())]
        rb.capacity[:m0] += bs * np.array(took, np.int64)
    # the plan's operations in the loop's order
    queue = s.queue
    reqs = p.reqs
    finished = []
    gone: list[int] = []
    opened = False
    for op in p.ops:
        kind = op[0]
        if kind == _TAKE:
            kv.take_decode_blocks(op[1], None)
        elif kind == _PROMPT:
            _, g, t0, t1 = op
            req = reqs[g]
            if not opened:  # the queued request; the others were never queued
                queue.pop()
                opened = True
            kv.now = t0
            cap = kv.allocate_slots(req, p.c[g], 0, full_sequence_must_fit=s.reserve_full_isl)
            if cap != p.k[g]:
                raise AssertionError(f"span: request {req.req_id} got {cap} slots, planned {p.k[g]}")
            s._started(req, 0, t0)
            req.first_token_s = t1
        else:
            _, done, t0, t1 = op
            kv.now = t0
            for g in done:
                if g < m0:
                    finished.append(s._finish_slot(g, t1))
                    gone.append(g)
                    continue
                req = reqs[g]
                req.num_computed_tokens = p.c[g] + p.end[g] - p.start[g]
                req.num_output_tokens = req.output_tokens
                req.last_token_s = t1
                finished.append(s._finished(req, t1))
    if gone:
        rb.remove_slots(sorted(gone))
    for g, _, p_end, _ in p.joined:
        if p.end[g] <= D:  # finished in the span
            continue
        ran = D - p.start[g]
        slot = rb.append(reqs[g], 0, p.k[g] + bs * _taken(p.first[g], D, bs))
        rb.computed[slot] = p.c[g] + ran
        rb.tokens[slot] += 1 + ran
        rb.num_out[slot] = 1 + ran
        rb.last_token[slot] = dec_end[D - 1] if ran else p_end
    last_prompt = bool(prefill[-1])
    kv.now = float(starts[-1])
    s._admitted = []
    s.step_swap_s = 0.0
    s._decoding = True
    if last_prompt:
        s._pure = s._quiet = False
        s._gaps = None
    else:
        s._pure = True
        s._quiet = not (p.fins and p.fins[-1][0] == R - 1)
        s._gaps = gaps[-int(m_dec[-1]):]
    # a decode run's columns, with the prompt steps' tokens, admissions and waiting
    columns = s._run_columns(starts, durations, seqs, running, used, usage, stored, stats)
    columns.update(num_tokens=tokens, prefill_tokens=prefill, decode_tokens=decode,
                   num_admitted=admitted, num_waiting=waiting)
    trace_rows = None
    if p.traced is not None:  # the step trace's rows (StepTrace.decode_run), as the loop's
        trace_rows = []
        t_s, kv_usage = starts.tolist(), usage.tolist()
        t_s[0] = now  # (the loop's env.now: SimPy's int 0 at the start, which JSON writes as 0)
        row = 0
        for n, (batch, admits, done) in zip(lens, p.traced):
            for q in range(n):
                trace_rows.append({"t_s": t_s[row], "scheduled": [list(x) for x in batch],
                                   "preempted": [], "admitted": [list(x) for x in admits],
                                   "finished": list(done) if q == n - 1 else [],
                                   "kv_usage": kv_usage[row]})
                row += 1
    return DecodeRun(delay, np.append(starts, row_end[-1]), [RunPart(None, None, None, finished, R)],
                     straddles=straddled, columns=columns, gaps=gaps, gaps_per_step=decode,
                     taken=taken, trace_rows=trace_rows)
