"""The engine's boundaries: one typing.Protocol per part, and the small records they exchange.

    Replica --schedule(now) -> Batch, commit(now) -> finished, stats()--> SchedulerInterface
    SchedulerInterface --get_computed_tokens / allocate_slots -> slots | None / free--> KVCacheManager
    Replica, Router --max_request_slots / lookup_prefix / stats--> KVCacheView (any backend's KV)
    SchedulerInterface --push / peek / pop / pick_victim--> QueuePolicy
    KVCacheManager's BlockPool --append / popleft--> EvictionPolicy (the free-block order)
    Cluster --choose(req, view) -> replica index--> Router

Invariants:
- callers use only the members declared here (no hasattr/getattr probes); what differs between
  kinds is told by the values returned: a KVStats field is None where a manager does not keep it
  (no prefix cache: no hit counters; paged: no external fragmentation), a Batch's swap_s is None
  without a swap space. The metrics layer turns None into "column absent";
- the KV manager never sees queues and never picks victims: on None from allocate_slots the
  scheduler asks the queue policy for a victim, preempts it and retries (vLLM v1);
- every engine step yields one Batch (what runs, for the cost model) and, after commit, one
  StepRecord (simulator.metrics.recorder) that the replica hands to the metrics recorder;
- plug-ins (allocators, eviction/queue policies, routers) are built through their registries
  (simulator.config.registry) from one context dataclass below plus their own validated params
  model (a PluginParams subclass), so a new plug-in is one module and one registry line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict

from simulator.engine.costmodel import StepShape
from simulator.metrics.recorder import StepRecord
from simulator.workload.request import Request

if TYPE_CHECKING:
    from simulator.config.schema import SimConfig
    from simulator.engine.advance import DecodeRun, Lookahead
    from simulator.engine.build import Setup
    from simulator.workload.generators import RequestArrays

__all__ = ["Backend", "Batch", "BatchingMode", "ClusterView", "EvictionPolicy", "KVCacheManager",
           "KVCacheView", "KVContext", "KVStats", "OffloadStats", "PluginParams", "QueueContext",
           "QueuePolicy", "Router",
           "RouterContext", "SchedulerInterface", "SchedulerStats", "StepRecord", "SwapStats"]


class PluginParams(BaseModel):
    """Base of every plug-in's params model: unknown keys are errors, no type coercion
    (a YAML string is not a number), values frozen once validated."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- what the parts report -------------------------------------------------------------------
@dataclass(slots=True)
class KVStats:
    """A KV manager's gauges and running totals at one instant (None: not kept by this kind)."""

    used_slots: int  # slots allocated or reserved (what vLLM's usage gauge counts)
    usage: float  # vLLM's kv_cache_usage: share of the pool not free
    prefix_queries: int | None = None  # tokens looked up so far (vLLM's prefix_cache_queries)
    prefix_hits: int | None = None  # tokens found so far (vLLM's prefix_cache_hits)
    num_evictions: int | None = None  # cached blocks evicted so far
    evicted_idle_s: Sequence[float] | None = None  # now - last access of each evicted block
    external_frag_slots: int | None = None  # free slots no request could use (contiguous)


@dataclass(slots=True)
class SwapStats:
    """Swap traffic so far (vLLM v0's swap_space)."""

    num_swap_outs: int
    num_swap_ins: int
    bytes_moved: int
    seconds: float


@dataclass(slots=True)
class OffloadStats:
    """CPU offload tier traffic so far (kvcache/offload.py; vLLM's --kv-offloading-size)."""

    size_gib: float
    num_cpu_blocks: int
    block_size: int
    hit_tokens: int = 0  # tokens loaded from the CPU tier at first admissions
    num_loads: int = 0
    loaded_blocks: int = 0
    num_stores: int = 0
    stored_blocks: int = 0
    store_failures: int = 0  # offers refused (too few evictable CPU blocks), retried
    num_deferred: int = 0  # lookups deferred (a block of the hit still in flight)
    num_evictions: int = 0
    bytes_loaded: int = 0
    bytes_stored: int = 0
    load_seconds: float = 0.0  # host-link time of the loads (not charged to steps)
    store_seconds: float = 0.0
    load_wait_s: float = 0.0  # sum over loads of (end - start), queueing on the link included


@dataclass(slots=True)
class SchedulerStats:
    """What the scheduler knows after a commit: gauges, the step's token gaps, running totals."""

    num_running: int
    num_waiting: int
    kv_tokens_stored: int  # KV slots holding token states (allocated less unused tails)
    kv: KVStats
    num_preemptions: int  # so far (recompute and swap)
    token_gaps: np.ndarray | None = None  # inter-token gaps sampled by the last commit
    swap: SwapStats | None = None  # None: no swap space
    offload: OffloadStats | None = None  # None: no CPU offload tier


@dataclass(slots=True)
class Batch:
    """What one step runs, summarised for the cost model, the metrics and step traces."""

    shape: StepShape
    num_seqs: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_preempted: int
    num_admitted: int
    swap_s: float | None = None  # GPU<->CPU swap time charged to this step (None: no swap space)
    preempted: list[Request] = field(default_factory=list)  # victims, in preemption order
    admitted: list[tuple[int, int]] = field(default_factory=list)  # (req_id, prefix-hit tokens)
    # nothing runnable but transfers in flight (CPU offload tier): sleep until then (or an arrival)
    wait_until_s: float | None = None


# --- build contexts: what a plug-in may know when it is built --------------------------------
@dataclass(frozen=True, slots=True)
class KVContext:
    """Everything an allocator factory gets besides its own engine.kv_allocator_params."""

    num_gpu_blocks: int  # vLLM's num_gpu_blocks (block 0 is the null block)
    block_size: int
    kv_budget_slots: int  # token slots the KV budget holds, for allocators without blocks
    max_model_len: int
    enable_prefix_caching: bool
    eviction_policy: str
    eviction_params: dict[str, Any]  # validated (engine.eviction_params)
    prefix_chunk_tokens: int  # tokens per prefix chunk id of the workload (prefix.py)


@dataclass(frozen=True, slots=True)
class QueueContext:
    max_num_seqs: int
    total_slots: int  # the KV pool's token slots
    workload_tiers: np.ndarray | None = None  # the workload's tier column, if it has one


@dataclass(frozen=True, slots=True)
class RouterContext:
    num_replicas: int
    enable_prefix_caching: bool
    prefix_chunk_tokens: int


# --- the protocols ---------------------------------------------------------------------------
class KVCacheView(Protocol):
    """What replicas and routers read of a replica's KV memory (either backend)."""

    block_size: int  # allocation granularity in tokens (1: contiguous)
    total_slots: int  # token slots the pool holds

    def max_request_slots(self, req: Request) -> int:
        """Slots the request occupies at its final size (reservation or whole blocks)."""
        ...

    def lookup_prefix(self, req: Request) -> int:
        """Tokens of req's leading blocks cached now (0 without caching); no side effect."""
        ...

    def stats(self) -> KVStats: ...


class KVCacheManager(KVCacheView, Protocol):
    """KV memory behind vLLM v1's boundary, as kvsim's scheduler drives it: lookup, allocate
    (None = no room), free. Allocators track token slots and report token states vs allocated
    slots, so fragmentation is measured, not assumed."""

    caches_full_blocks: bool  # True: call allocate_slots whenever a step fills a block
    now: float  # simulated time; the scheduler sets it before each step

    def get_computed_tokens(self, req: Request) -> int:
        """lookup_prefix for a request about to be admitted; the hits are held for its next
        allocate_slots."""
        ...

    def allocate_slots(self, req: Request, num_new_tokens: int, num_computed_tokens: int,
                       full_sequence_must_fit: bool = False,
                       num_tokens: int | None = None) -> int | None:
        """Room for computed + new tokens: the request's slot capacity, or None (no room)."""
        ...

    def allocate_slots_many(self, reqs: list[Request], num_new: list[int],
                            num_computed: list[int], num_tokens: list[int] | None = None
                            ) -> list[int]:
        """allocate_slots for each in order, stopping at the first failure; the capacities of
        those served (the fast path for the running batch)."""
        ...

    def free(self, req: Request) -> None: ...

    # event-level advance (engine/advance.py): blocks for k pure-decode steps in one pass
    def decode_room(self) -> int | None:
        """Blocks decode steps may take in one run without changing anything else (None:
        every step must go through the loop)."""
        ...

    def admission_fits(self, req: Request, num_new_tokens: int, full_sequence_must_fit: bool) -> bool:
        """Whether a waiting request's first allocation could be served now, without side
        effects (True where the manager cannot tell): a decode run's `_head_waits`."""
        ...

    # whether take_decode_blocks reads its `times` (False: a run passes None, not finding them)
    decode_stamps: bool

    def take_decode_blocks(self, req_ids: list[int], times: np.ndarray | None) -> None:
        """One new block per entry (a request id), popped in order, stamped with its step's
        start time (`times`, one per entry; None where `decode_stamps` is False)."""
        ...

    def decode_gauges(self, taken: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(used_slots, usage) after each step of a run, given the blocks taken through it."""
        ...

    # read only where decode_room() is not None: True where a decode run may go on past a
    # finish in one pass (Scheduler._decode_run_through): the blocks a finish frees are room
    # like any other, a request's capacity is its blocks' slots and the gauges are a function
    # of the free-block count alone (free_gauges)
    decode_run_frees: bool

    def free_gauges(self, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(used_slots, usage) at each free-block count of `free` (where decode_run_frees)."""
        ...


class EvictionPolicy(Protocol):
    """Orders the *free* blocks of a BlockPool: only ref-count-0 blocks are here; popping one
    that still has a hash evicts it from the prefix cache (lazy, as vLLM). Built as
    cls(pool, block_ids, **params); it may read the pool's per-block `freed_s`,
    `last_access_s`, `num_hits` and `now`. Every policy reuses unhashed blocks first."""

    def append(self, block_id: int) -> None: ...  # a hashed block's ref count fell to 0
    def prepend(self, block_ids: list[int]) -> None: ...  # freed blocks with no hash
    def remove(self, block_id: int) -> None: ...  # a free block was hit (touched)
    def popleft(self) -> int: ...  # the block to reuse next
    def __len__(self) -> int: ...
    def __contains__(self, block_id: int) -> bool: ...


class QueuePolicy(Protocol):
    """Orders the waiting queue and picks preemption victims. Built as cls(QueueContext,
    **params). `on_run` / `on_stop` say who is running, for policies that cap shares."""

    continue_after_self_preemption: bool  # vLLM 0.33: only `priority` goes on past itself

    def push(self, req: Request) -> None: ...  # a new arrival
    def prepend(self, req: Request) -> None: ...  # a preempted request, back in line
    def peek(self) -> Request | None: ...  # next to admit (None: nobody may be admitted now)
    def pop(self) -> Request: ...  # remove the request peek() returned
    def __len__(self) -> int: ...
    def pick_victim(self, running: list[Request]) -> int: ...  # index into running
    def on_run(self, req: Request) -> None: ...
    def on_stop(self, req: Request) -> None: ...


class BatchingMode(Protocol):
    """Who may join the running batch, and when (scheduling/batching.py)."""

    admits_waiting: bool  # False: only form_batch admits (static batching)

    def form_batch(self, sched: Any, now: float) -> int: ...  # requests admitted


class SchedulerInterface(Protocol):
    """One replica's step loop (vLLM v1's Scheduler): kvsim's own or vLLM's (backends/)."""

    kv: KVCacheView

    def add_request(self, req: Request, holds_kv: bool = False) -> None: ...

    @property
    def has_work(self) -> bool: ...

    def schedule(self, now: float) -> Batch: ...

    def commit(self, now: float) -> list[Request]:
        """Apply the step that just ran: tokens advance, first tokens, finishes (returned)."""
        ...

    def stats(self) -> SchedulerStats: ...

    def num_waiting(self) -> int:
        """stats().num_waiting alone (a decode run's straddled step reads it after every run)."""
        ...

    def scheduled(self) -> dict[int, int]:
        """{req_id: tokens} of the step just scheduled, in running order (tests, traces)."""
        ...

    def decode_run(self, now: float, until_s: float, run_times: Callable[..., np.ndarray],
                   max_steps: int = 4096, inflight_s: float | None = None,
                   straddle: bool = False, step_time: Callable[[StepShape], float] | None = None,
                   ahead: Lookahead | None = None) -> DecodeRun | None:
        """The next pure-decode steps at once, ending before until_s (engine/advance.py);
        None: step instead. `run_times(m, first, k[, window_kv_tokens])`: the durations of k
        pure-decode steps of m requests whose KV entries are first + m j
        (CostModel.decode_run_times, advance.decode_run_fn). `inflight_s`: async scheduling,
        the duration of the step in flight (it started at `now`). `straddle`: an arrival only
        joins this replica's queue (one replica), so the run's last step may be the one during
        which it arrives. `step_time`: the cost model's (sync), for a run that opens with a
        prompt step (DecodeRun.prompt); None: no such run. `ahead`: the arrivals ahead of a
        replica alone, which such a run may admit itself (scheduling/span.py; DecodeRun.taken);
        None: none."""
        ...


class ClusterView(Protocol):
    """What a router may read about the replicas behind it. (A router runs only where there
    are two or more replicas; with one, Cluster keeps no loads: these stay 0.)"""

    num_replicas: int
    outstanding: list[int]  # routed-but-unfinished requests per replica
    outstanding_tokens: list[int]  # their prompt + output tokens

    def pending_prompt_tokens(self, i: int) -> int: ...  # routed, not yet scheduled
    def kv(self, i: int) -> KVCacheView: ...


class Router(Protocol):
    """Picks the replica of each arriving request; built as cls(RouterContext, **params)."""

    def choose(self, req: Request, cluster: ClusterView) -> int: ...


class Backend(Protocol):
    """Whose scheduler runs the steps (engine.backend): kvsim's, or vLLM's own."""

    def check(self, config: SimConfig) -> None:
        """ConfigError for settings this backend does not model (before any work)."""
        ...

    def build(self, setup: Setup, workload: RequestArrays, *, vectorized: bool = True
              ) -> SchedulerInterface: ...

    def lines(self) -> list[str]: ...  # setup lines printed before the run

    def info(self) -> dict[str, str]: ...  # added to summary["config"]
