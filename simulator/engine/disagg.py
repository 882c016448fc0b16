"""Prefill/decode disaggregation: a prefill pool and a decode pool joined by KV transfer links.

A request's path (vLLM 0.33's P/D through a pull connector such as NIXL; docs/disaggregation.md
cites the lines):
1. arrival -> the prefill router picks a prefill replica; it runs the prompt as a *leg* with
   max_tokens 1 (the proxy's prefill request) and, finished, keeps its blocks
   (connector.request_finished -> delay_free_blocks);
2. the decode router picks a decode replica; the request waits in that replica's pull queue
   (FIFO, head-of-line, behind requests waiting in its scheduler, tried after every step of
   that replica) until the decode KV manager gives it blocks for the prompt, local prefix
   hits first (vLLM: get_num_new_matched_tokens, then allocate_slots with the whole prompt
   as external tokens, WAITING_FOR_REMOTE_KVS);
3. the blocks not hit locally move over the link: a transfer starts once both the prefill
   replica's egress and the decode replica's ingress are free (a FIFO per link end), takes
   bytes / bandwidth, and lands `latency_us` later; the prefill side then frees its blocks
   (vLLM: finished_sending);
4. the request enters the decode scheduler, ahead of other waiting ones (vLLM drains
   kv_holding_waiting first), with num_computed_tokens = prompt - 1 (vLLM recomputes the last
   prompt token to sample the first output token), and decodes.
TTFT is the client's: the decode replica streams the first token (the proxy discards the
prefill leg's). TTFT = prefill queue + prefill + decode queue (pull wait, then wait after the
KV landed) + transfer (link wait + bytes / bandwidth + latency) + the first decode step.

Invariants (tests/test_disagg.py): every block of either pool is free or held by one leg or
request: running or waiting on a prefill replica, held for its pull, in transit (its source and
destination blocks), waiting with its KV or running on a decode replica; at the end arrived =
finished + rejected. Event-level advance: a decode replica advances a decode run only while
nothing can reach it (DisaggClock: the next arrival, the end of any prefill step, a
transfer's landing); prefill legs never decode, so the prefill pool steps one by one anyway.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import simpy

from simulator.config.schema import SimConfig
from simulator.engine.advance import ArrivalClock
from simulator.engine.build import Setup, setup
from simulator.engine.cluster import Cluster, MergedRecorder, cluster_section
from simulator.engine.costmodel import CostModel, StepShape
from simulator.engine.protocols import RouterContext
from simulator.engine.replica import Replica, feed_arrivals, progress_tick, run_env
from simulator.engine.routers import ROUTERS
from simulator.errors import ConfigError
from simulator.metrics.recorder import MetricsRecorder
from simulator.metrics.summary import summarize
from simulator.workload.generators import RequestArrays
from simulator.workload.load import generate
from simulator.workload.request import Request, Status

POOLS = ("prefill", "decode")
# requests.parquet columns added in disaggregated mode (docs/metrics.md); TTFT = the five parts
PD_COLUMNS = ("prefill_replica", "decode_replica", "ttft_prefill_queue_s", "ttft_prefill_s",
              "ttft_decode_queue_s", "ttft_transfer_s", "ttft_first_decode_s", "kv_link_wait_s",
              "kv_transfer_bytes", "kv_transfer_blocks")


@dataclass(frozen=True, slots=True)
class DisaggSpec:
    """The two pools' setups and the link in force."""

    prefill: Setup
    decode: Setup
    kind: str
    bandwidth_gbps: float
    latency_us: float


def pool_config(config: SimConfig, pool: str) -> SimConfig:
    """The config one pool's replicas run: its GPU and tensor parallelism over the shared model
    and engine, a colocated cluster of its replicas behind its router."""
    spec = config.cluster.prefill if pool == "prefill" else config.cluster.decode
    engine = config.engine.to_dict()
    # NOTE: vLLM's KV connectors run under async scheduling too; kvsim's P/D pools are modelled on
    # the synchronous loop only so far (resolve_disagg refuses an explicit true)
    engine["async_scheduling"] = False
    if spec.tensor_parallel_size is not None:
        engine["tensor_parallel_size"] = spec.tensor_parallel_size
    return config.replace(gpu=spec.gpu or config.gpu, engine=engine,
                          cluster={"replicas": spec.replicas, "router": spec.router,
                                   "router_params": spec.router_params})


def resolve_disagg(config: SimConfig) -> DisaggSpec:
    """Steps: 1. what P/D models (kvsim's scheduler, paged blocks); 2. each pool's setup (names,
    memory, cost model), its errors prefixed with the pool; 3. the link."""
    if config.engine.backend != "kvsim":
        raise ConfigError(f"cluster.mode disaggregated: engine.backend must be kvsim (vLLM's own "
                          f"scheduler runs colocated only), got {config.engine.backend}")
    if config.engine.scheduler != "continuous":
        # NOTE: a landed request joins the running batch at a step's admission, which static
        # batching does not hold
        raise ConfigError(f"cluster.mode disaggregated: engine.scheduler must be continuous, got "
                          f"{config.engine.scheduler}")
    if config.engine.async_scheduling:
        raise ConfigError("cluster.mode disaggregated: engine.async_scheduling true is not modelled for "
                          "P/D pools yet (kvsim runs them synchronously); set it false or leave it unset")
    if config.engine.kv_offloading_size:
        # NOTE: both features hold blocks outside the GPU pool (a load in flight, a pull in
        # flight); their interplay is not modelled, so the run is refused rather than guessed
        raise ConfigError(f"cluster.mode disaggregated: engine.kv_offloading_size must be off (the CPU "
                          f"offload tier runs colocated only), got {config.engine.kv_offloading_size}")
    setups = {}
    for pool in POOLS:
        try:
            s = setup(pool_config(config, pool))
        except ConfigError as e:  # the pool's own section named where the error lies
            msg = str(e).replace("cluster.router", f"cluster.{pool}.router")
            raise ConfigError(msg if f"cluster.{pool}" in msg else f"cluster.{pool}: {msg}") from None
        if s.kv_allocator != "paged":
            raise ConfigError(f"cluster.mode disaggregated: the {pool} pool's KV allocator must be "
                              f"paged (the connectors move paged blocks), got {s.kv_allocator}")
        setups[pool] = s
    bandwidth, latency = config.cluster.transfer.link()
    return DisaggSpec(setups["prefill"], setups["decode"], config.cluster.transfer.kind,
                      bandwidth, latency)


class DisaggClock:
    """What a decode replica's decode run must end before (advance.ArrivalClock's role): the
    next arrival, the end of every prefill step (a leg may finish and be pulled at it, or the
    next step start) and every transfer's landing. `next_s` is read when a decode replica asks."""

    def __init__(self, env: simpy.Environment, arrivals: ArrivalClock) -> None:
        self.env = env
        self.arrivals = arrivals
        self._events: list[float] = []  # a heap of future times

    def add(self, t: float) -> None:
        heapq.heappush(self._events, t)

    @property
    def next_s(self) -> float:
        ev, now = self._events, self.env.now
        while ev and ev[0] < now:
            heapq.heappop(ev)
        return min(ev[0] if ev else math.inf, self.arrivals.next_s)


class _DecodeReplicaClock:
    """DisaggClock as decode replica j of two or more sees it: its runs also end before the end
    of the step (or run) each other decode replica is in. Another replica's step end may pull
    a request into that replica, whose landing frees a prefill leg's blocks, whose prefill
    step may then finish a leg that the decode router sends to j, all inside j's run; every
    way in goes through such an end (an idle replica wakes only at events the shared clock
    holds). `busy[i]`: the end of replica i's current step or run (`Replica.on_busy`)."""

    def __init__(self, clock: DisaggClock, busy: list[float], j: int) -> None:
        self.clock = clock
        self.busy = busy
        self.j = j

    @property
    def next_s(self) -> float:
        t = self.clock.next_s
        now = self.clock.env.now
        for i, end in enumerate(self.busy):
            if i != self.j and now <= end < t:
                t = end
        return t

    def set_busy(self, end: float) -> None:
        self.busy[self.j] = end


class _PrefillCost:
    """A prefill replica's cost model that tells the DisaggClock when each step ends (a lower
    bound: swap time only adds). Every step, not only those that sample: the step after a
    prompt chunk may finish the leg, and it starts with no other event."""

    def __init__(self, cost: CostModel, env: simpy.Environment, clock: DisaggClock) -> None:
        self.cost = cost
        self.async_scheduling = cost.async_scheduling  # False: P/D pools run synchronously
        self.env = env
        self.clock = clock

    def step_time(self, shape: StepShape) -> float:
        d = self.cost.step_time(shape)
        self.clock.add(self.env.now + d)
        return d

    def step_times(self, *args: Any) -> np.ndarray:
        return self.cost.step_times(*args)


class DisaggCluster:
    """Stands where feed_arrivals expects a replica (`submit`, `close`): the two pools, the pull
    queues and the links (module docstring). Per-request P/D times are kept in arrays indexed by
    req_id (the workload row)."""

    def __init__(self, env: simpy.Environment, spec: DisaggSpec, prefill: Cluster, decode: Cluster,
                 clock: DisaggClock, num_requests: int) -> None:
        self.env = env
        self.spec = spec
        self.prefill = prefill
        self.decode = decode
        self.clock = clock
        self.arrivals: ArrivalClock | None = None  # feed_arrivals' clock (build_disaggregated)
        d = spec.decode
        self.bytes_per_token = d.memory.kv_bytes_per_token * d.engine.tensor_parallel_size
        self.bytes_per_s = spec.bandwidth_gbps * 1e9
        self.latency_s = spec.latency_us * 1e-6
        self.reserve_full_isl = d.config.engine.scheduler_reserve_full_isl
        self.front = MetricsRecorder(0)  # requests rejected at arrival
        self.num_arrived = 0
        self.num_pending = 0  # accepted, not yet handed to a decode scheduler
        self.arrivals_done = False
        self.reqs: dict[int, Request] = {}  # client requests before their KV landed
        self.held: dict[int, Request] = {}  # finished prefill legs whose blocks are kept
        self.in_transit: set[int] = set()
        self.pull: list[deque[Request]] = [deque() for _ in decode.replicas]
        self.egress_free = [0.0] * prefill.num_replicas
        self.ingress_free = [0.0] * decode.num_replicas
        n = num_requests
        self.p_replica = np.full(n, -1, np.int64)
        self.d_replica = np.full(n, -1, np.int64)
        self.t_leg_start = np.full(n, np.nan)  # prefill leg first scheduled
        self.t_prefilled = np.full(n, np.nan)  # prefill leg finished
        self.t_pulled = np.full(n, np.nan)  # decode blocks allocated
        self.t_wire = np.full(n, np.nan)  # transfer on the wire
        self.t_landed = np.full(n, np.nan)
        self.leg_preemptions = np.zeros(n, np.int64)
        self.blocks = np.zeros(n, np.int64)
        for rep in prefill.replicas:
            rep.may_stall = True
            rep.scheduler.delay_free_blocks = True
            rep.on_request_end = self._prefill_ended
        for j, rep in enumerate(decode.replicas):
            rep.may_stall = True
            rep.scheduler.watched_finishes = True  # the pull queue reacts to each step's finishes
            rep.on_iteration = self._decode_stepped(j, rep.on_iteration)

    # --- arrival and the prefill leg ------------------------------------------------------
    def _reject_reason(self, req: Request, leg: Request) -> str:
        """Replica's rules, the leg against the prefill pool and the request against the decode
        pool (a request either can never hold is rejected at arrival)."""
        for pool, cluster, r in (("prefill", self.prefill, leg), ("decode", self.decode, req)):
            reason = cluster.replicas[0].reject_reason(r, pool)
            if reason:
                return reason
        return ""

    def submit(self, req: Request) -> None:
        """1. reject what either pool can never hold; 2. the prefill leg (max_tokens 1) goes to
        the prefill router's replica."""
        self.num_arrived += 1
        leg = Request(req.req_id, req.arrival_s, req.prompt_tokens, 1, req.priority,
                      tenant=req.tenant, prefix=req.prefix)
        leg.tier = req.tier
        reason = self._reject_reason(req, leg)
        if reason:
            req.status = Status.REJECTED
            req.reject_reason = reason
            self.front.request_ended(req)
            return
        self.num_pending += 1
        self.reqs[req.req_id] = req
        i = self.prefill.route(leg)
        self.p_replica[req.req_id] = i
        self.prefill.replicas[i].submit(leg)

    def close(self) -> None:
        self.arrivals_done = True
        self.prefill.close()
        self._maybe_close_decode()

    def _maybe_close_decode(self) -> None:
        if self.arrivals_done and not self.num_pending:
            self.decode.close()

    def _prefill_ended(self, leg: Request) -> None:
        """The leg finished (its blocks kept): the decode router picks a replica and the
        request joins its pull queue."""
        self.prefill.request_ended(leg)
        rid = leg.req_id
        assert leg.status is Status.FINISHED, leg  # _reject_reason covers the prefill pool
        req = self.reqs[rid]
        self.t_leg_start[rid] = leg.first_scheduled_s
        self.t_prefilled[rid] = leg.finish_s
        self.leg_preemptions[rid] = leg.num_preemptions
        req.num_cached_tokens = leg.num_cached_tokens  # the prompt's prefix hits (prefill side)
        self.held[rid] = leg
        j = self.decode.route(req)
        self.d_replica[rid] = j
        self.pull[j].append(req)
        self._try_pull(j)

    # --- pull and transfer ----------------------------------------------------------------
    def _try_pull(self, j: int) -> None:
        """Decode replica j's pull queue, head first, while its KV manager gives blocks for the
        whole prompt (local hits first): each pulled request's missing blocks go on the wire."""
        q = self.pull[j]
        sched = self.decode.replicas[j].scheduler
        kv = sched.kv
        env = self.env
        # NOTE: a pull is a waiting request to vLLM's decode scheduler: it queues behind those
        # already waiting there (preempted ones), head-of-line
        while q and not len(sched.queue):
            req = q[0]
            local = kv.get_computed_tokens(req)
            if kv.allocate_slots(req, req.prompt_tokens - local, local,
                                 full_sequence_must_fit=self.reserve_full_isl) is None:
                return
            q.popleft()
            rid = req.req_id
            now = env.now
            bs = kv.block_size
            blocks = -(-req.prompt_tokens // bs) - local // bs
            i = int(self.p_replica[rid])
            start = max(now, self.egress_free[i], self.ingress_free[j])
            done = start + blocks * bs * self.bytes_per_token / self.bytes_per_s
            self.egress_free[i] = self.ingress_free[j] = done
            delay = done + self.latency_s - now
            self.t_pulled[rid] = now
            self.t_wire[rid] = start
            self.blocks[rid] = blocks
            self.in_transit.add(rid)
            self.clock.add(now + delay)  # the time SimPy will fire it at
            ev = env.timeout(delay)
            ev.callbacks.append(lambda _ev, req=req: self._landed(req))

    def _landed(self, req: Request) -> None:
        """The KV arrived: the prefill side frees the leg's blocks; the request enters the
        decode scheduler with prompt - 1 tokens computed."""
        rid = req.req_id
        self.in_transit.discard(rid)
        self.t_landed[rid] = self.env.now
        leg = self.held.pop(rid)
        prep = self.prefill.replicas[int(self.p_replica[rid])]
        prep.scheduler.kv.free(leg)
        prep.poke()
        del self.reqs[rid]
        req.num_computed_tokens = req.prompt_tokens - 1
        self.num_pending -= 1
        self.decode.replicas[int(self.d_replica[rid])].submit(req, holds_kv=True)
        self._maybe_close_decode()

    def _decode_stepped(self, j: int, tick: Callable[[], None] | None) -> Callable[[], None]:
        """After each step of decode replica j (vLLM's scheduler admits pulls every step)."""
        def stepped() -> None:
            self._try_pull(j)
            if tick is not None:
                tick()
        return stepped

    # --- outputs --------------------------------------------------------------------------
    def num_ended(self) -> int:
        return self.front.num_ended + sum(r.recorder.num_ended for r in self.decode.replicas)


class DisaggRecorder(MergedRecorder):
    """What `summarize` reads (MergedRecorder's members) over both pools: the client requests
    (the decode replicas' and those rejected at arrival) with the P/D columns, every step of
    every replica (prefill replicas first: `replica` 0..P-1, then decode P..P+D-1, and `pool`),
    the decode side's token gaps."""

    def __init__(self, dc: DisaggCluster) -> None:
        super().__init__([r.recorder for r in dc.prefill.replicas]
                         + [r.recorder for r in dc.decode.replicas])
        self.dc = dc

    def requests_frame(self) -> pd.DataFrame:
        """1. the client rows, by req_id; 2. first_scheduled_s and num_preemptions as the client
        sees them (the prefill leg's start; both legs' preemptions); 3. the P/D columns."""
        if self._reqs is not None:
            return self._reqs
        dc = self.dc
        frames = [r.recorder.requests_frame() for r in dc.decode.replicas] + [dc.front.requests_frame()]
        df = pd.concat(frames, ignore_index=True).sort_values("req_id", kind="stable") \
            .reset_index(drop=True)
        rid = df.req_id.to_numpy()
        decode_start = df.first_scheduled_s.to_numpy()
        df["first_scheduled_s"] = dc.t_leg_start[rid]
        df["num_preemptions"] = df.num_preemptions.to_numpy() + dc.leg_preemptions[rid]
        bs = dc.spec.decode.engine.block_size
        cols = {
            "prefill_replica": dc.p_replica[rid],
            "decode_replica": dc.d_replica[rid] + dc.prefill.num_replicas * (dc.d_replica[rid] >= 0),
            "ttft_prefill_queue_s": dc.t_leg_start[rid] - df.arrival_s.to_numpy(),
            "ttft_prefill_s": dc.t_prefilled[rid] - dc.t_leg_start[rid],
            "ttft_decode_queue_s": (dc.t_pulled[rid] - dc.t_prefilled[rid])
            + (decode_start - dc.t_landed[rid]),
            "ttft_transfer_s": dc.t_landed[rid] - dc.t_pulled[rid],
            "ttft_first_decode_s": df.first_token_s.to_numpy() - decode_start,
            "kv_link_wait_s": dc.t_wire[rid] - dc.t_pulled[rid],
            "kv_transfer_bytes": dc.blocks[rid] * bs * dc.bytes_per_token,
            "kv_transfer_blocks": dc.blocks[rid],
        }
        for name in PD_COLUMNS:
            df[name] = cols[name]
        self._reqs = df
        return df

    def iterations_frame(self) -> pd.DataFrame:
        it = super().iterations_frame()
        if "pool" not in it:
            it.insert(1, "pool", np.where(it.replica.to_numpy() < self.dc.prefill.num_replicas,
                                          "prefill", "decode"))
        return it



def _dist(x: np.ndarray) -> dict[str, float | None]:
    x = x[np.isfinite(x)]
    if not len(x):
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": float(x.mean()), "p50": float(np.median(x)), "p99": float(np.percentile(x, 99))}


def disagg_section(dc: DisaggCluster, rec: DisaggRecorder, config: SimConfig) -> dict[str, Any]:
    """summary["disaggregation"]: each pool (size, GPU, blocks, busy share, per replica), the link
    and its traffic, TTFT's split and the transfer's share of it (finished requests)."""
    reqs = rec.requests_frame()
    iters = rec.iterations_frame()
    done = reqs[reqs.status == "finished"]
    end = float((iters.start_s + iters.duration_s).max()) if len(iters) else 0.0
    start = float(reqs.arrival_s.min()) if len(reqs) else 0.0
    span = end - start
    pools = {}
    for pool, cluster, s in (("prefill", dc.prefill, dc.spec.prefill), ("decode", dc.decode, dc.spec.decode)):
        busy = float(iters.duration_s[iters["pool"] == pool].sum())
        recs = [r.recorder for r in cluster.replicas]
        section = cluster_section(s.cluster, cluster, recs, s.config)
        pools[pool] = {"replicas": cluster.num_replicas, "gpu": s.gpu.name,
                       "tensor_parallel_size": s.engine.tensor_parallel_size,
                       "num_gpu_blocks": s.memory.num_gpu_blocks, "router": s.cluster.router,
                       "busy_s": busy,
                       "utilization": busy / (cluster.num_replicas * span) if span > 0 else None,
                       "imbalance": section["imbalance"], "per_replica": section["per_replica"]}
    ttft = (done.first_token_s - done.arrival_s).to_numpy()
    parts = {name: done[f"ttft_{name}_s"].to_numpy()
             for name in ("prefill_queue", "prefill", "decode_queue", "transfer", "first_decode")}
    moved = reqs[reqs.kv_transfer_blocks > 0]
    wire = (moved.kv_transfer_bytes / (dc.spec.bandwidth_gbps * 1e9)).to_numpy()
    total_ttft = float(ttft.sum())
    return {
        "prefill": pools["prefill"], "decode": pools["decode"],
        "transfer": {"kind": dc.spec.kind, "bandwidth_gbps": dc.spec.bandwidth_gbps,
                     "latency_us": dc.spec.latency_us, "num_transfers": int(len(moved)),
                     "bytes": int(moved.kv_transfer_bytes.sum()), "wire_s": float(wire.sum()),
                     "time_s": _dist(moved.ttft_transfer_s.to_numpy()),
                     "link_wait_s": _dist(moved.kv_link_wait_s.to_numpy())},
        "ttft_split_s": {name: _dist(v) for name, v in parts.items()},
        "transfer_share_of_ttft": float(parts["transfer"].sum()) / total_ttft if total_ttft > 0 else None,
    }


def build_disaggregated(config: SimConfig, workload: RequestArrays, *,
                        spec: DisaggSpec | None = None,
                        on_iteration: Callable[[], None] | None = None,
                        vectorized: bool = True) -> DisaggCluster:
    """A SimPy environment (`dc.env`) holding each pool's replicas behind its router, the pull
    queues and links between them; nothing submitted yet (run_disaggregated feeds the workload,
    tests submit requests themselves). `dc.arrivals`: the arrival clock (None: step by step)."""
    spec = spec or resolve_disagg(config)
    env = simpy.Environment()
    arrivals = ArrivalClock() if config.engine.advance == "event" else None
    clock = DisaggClock(env, arrivals or ArrivalClock())
    pools = []
    for pool, s in (("prefill", spec.prefill), ("decode", spec.decode)):
        n = s.cluster.replicas
        cost = _PrefillCost(s.cost, env, clock) if pool == "prefill" else s.cost
        # NOTE: prefill legs never decode, so the prefill pool steps one by one (clock None)
        rep_clock = clock if (pool == "decode" and arrivals is not None) else None
        busy = [-math.inf] * n  # (two or more decode replicas: each one's step end)
        replicas = []
        for j in range(n):
            sched = s.backend.build(s, workload, vectorized=vectorized)
            view = _DecodeReplicaClock(clock, busy, j) if rep_clock is not None and n > 1 else None
            rep = Replica(env, sched, cost, MetricsRecorder(sched.kv.total_slots),
                          s.engine.max_model_len, on_iteration=on_iteration, clock=view or rep_clock)
            if view is not None:
                rep.on_busy = view.set_busy
            replicas.append(rep)
        router = ROUTERS.build(s.cluster.router, s.params.router, f"cluster.{pool}.router_params",
                               RouterContext(n, config.engine.enable_prefix_caching,
                                             workload.prefix_block_tokens))
        pools.append(Cluster(replicas, router))
    dc = DisaggCluster(env, spec, pools[0], pools[1], clock, len(workload))
    dc.arrivals = arrivals
    return dc


def run_disaggregated(config: SimConfig, workload: RequestArrays | None = None, *,
                      progress: Callable[[int, int], None] | None = None, vectorized: bool = True,
                      on_setup: Callable[[Setup], None] | None = None
                      ) -> tuple[Setup, dict[str, Any], pd.DataFrame, DisaggRecorder, DisaggCluster]:
    """run.run's steps for a P/D cluster: 1. both pools' setups (bad input fails here);
    2. `on_setup` for each; 3. the workload from the seed; 4. build_disaggregated; 5. SimPy until
    every arrival has finished or been rejected; 6. the summary (plus `disaggregation`) and the
    tables. Returns the setup run.Result carries (the prefill pool's, with the whole config), the
    summary, the requests frame, the recorder (its iterations_frame) and the cluster (tests)."""
    spec = resolve_disagg(config)
    if on_setup is not None:
        on_setup(spec.prefill)
        on_setup(spec.decode)
    seeds = np.random.SeedSequence(config.seed).spawn(2)
    if workload is None:
        workload = generate(config.workload, seeds[0])
    box: list[DisaggCluster] = []
    tick = None
    if progress is not None:
        total = len(workload)
        tick = progress_tick(lambda: progress(box[0].num_ended(), total))
    dc = build_disaggregated(config, workload, spec=spec, on_iteration=tick, vectorized=vectorized)
    box.append(dc)
    env = dc.env
    env.process(feed_arrivals(env, workload, dc, dc.arrivals))
    run_env(env)
    ended = dc.num_ended()
    if ended != dc.num_arrived:
        raise RuntimeError(f"P/D run ended with {dc.num_arrived - ended} of {dc.num_arrived} "
                           f"requests neither finished nor rejected")
    rec = DisaggRecorder(dc)
    summary = summarize(rec, dc.num_arrived, slo=config.slo, alerts=config.alerts,
                        kv_allocator=config.engine.kv_allocator)
    summary["disaggregation"] = disagg_section(dc, rec, config)
    return replace(spec.prefill, config=config), summary, rec.requests_frame(), rec, dc
