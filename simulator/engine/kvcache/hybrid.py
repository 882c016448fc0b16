"""Hybrid KV cache (vLLM v1's HybridKVCacheCoordinator): one block table per KV cache group, every
group drawing block ids from one BlockPool (block_pool.py, used as it is).

A model whose layers mix attention kinds (gpt-oss: sliding window 128 and full; Gemma 3: five
sliding-1024 layers to one full; Llama 4: chunked local 8192 and full) has one KV cache group
per set of layers sharing a table (hardware/kv_spec.py: vLLM's get_kv_cache_groups). A block id
holds one page of every layer of its group, so one token position costs one block id in every
group. Per group, as vLLM's single-type managers (single_type_kv_cache_manager.py):

    full / MLA       the table grows to cdiv(tokens, block_size); nothing freed before the end
    sliding window   before each allocation the whole blocks before the window are freed and
                     their slots nulled (SlidingWindowManager.get_num_skipped_tokens:
                     computed - window + 1): a decoding request holds at most
                     window / block_size + 1 blocks (the window need not start on an edge)
    chunked local    the blocks of finished chunks (computed // chunk * chunk) are freed

    tables[r] = [[ 0,  0, b7, b9],      sliding 128, block 16, 56 tokens... positions 0-1 freed
                 [b3, b4, b8, b2]]      full attention: every position held
    capacity  = len(table) * block_size (every group's table has the same length), or less:
                the token count at which a recycling group next frees a block, so that the
                scheduler calls again at that step (below)

Admission (vLLM 0.33 allocate_slots with full_sequence_must_fit): the request's whole sequence
must fit with each recycling group capped at its max_admission_blocks_per_request
(kv_spec.LayerKVSpec.max_blocks_per_request: cdiv(window - 1 + in_flight, block_size) + 1),
the cap vLLM's start-up check and max concurrency use.

Prefix caching is off here (`enable_prefix_caching` is ignored; KVStats carries no hit counters):
vLLM 0.33 hits a hybrid model only where every group hits - full groups a leading run, sliding
groups cdiv(window - 1, block_size) contiguous cached blocks ending at the hit, found by the
coordinator's fixed point over groups, and it caches sliding blocks only at reachable boundaries
(SlidingWindowManager.reachable_block_mask). Until that is modelled a hybrid run recomputes every
prefix: its prefill cost is an upper bound, its KV capacity is exact.

NOTE: kvsim's scheduler calls the manager only when a request outgrows the capacity it was given,
not every step as vLLM does. So the capacity returned is the smaller of the slots held and the
computed-token count at which a sliding / chunked group next has a whole block out of its window
(sliding: (freed + 1) * block_size + window - 1; chunked: the next chunk edge past it): the call
comes at the step where vLLM's remove_skipped_blocks would free it. The capacity can then be below
computed + new (after a long prefill chunk), which makes the next step call again at once.
NOTE: `used_slots` counts block ids of every group times block_size, and the scheduler's stored-KV
gauge subtracts each request's unused tail once (not per group): for hybrid runs it is an upper
bound of the token states held.
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from simulator.engine.kvcache import ALLOCATORS, allocate_in_order
from simulator.engine.kvcache.block_pool import BlockPool, PoolClock
from simulator.engine.protocols import KVContext, KVStats, PluginParams
from simulator.hardware.kv_spec import KVCacheLayout, LayerKVSpec, cdiv
from simulator.workload.request import Request

GROUP_KINDS = ("full_attention", "mla", "sliding_window", "chunked_local")


def group_name(spec: LayerKVSpec) -> str:
    """A group as HybridParams names it: 'full_attention', 'mla', 'sliding_window:128',
    'chunked_local:8192'."""
    if spec.kind == "sliding_window":
        return f"sliding_window:{spec.sliding_window}"
    if spec.kind == "chunked_local":
        return f"chunked_local:{spec.attention_chunk_size}"
    return spec.kind


def layout_params(layout: KVCacheLayout, max_in_flight_tokens: int) -> dict[str, Any]:
    """The params build.py gives the hybrid allocator for a memory plan's KV cache layout."""
    return {"groups": tuple(group_name(g.spec) for g in layout.groups),
            "max_in_flight_tokens": max_in_flight_tokens}


def _group_spec(name: str, block_size: int) -> LayerKVSpec:
    kind, _, size = name.partition(":")
    if kind not in GROUP_KINDS or (kind in ("sliding_window", "chunked_local")) != bool(size) or (
            size and not (size.isdigit() and int(size) > 0)):
        raise ValueError(f"group {name!r}: expected full_attention, mla, sliding_window:<tokens> or "
                         f"chunked_local:<tokens>")
    n = int(size) if size else None
    return LayerKVSpec(kind, block_size, 1, 1, 1, 1,
                       sliding_window=n if kind == "sliding_window" else None,
                       attention_chunk_size=n if kind == "chunked_local" else None)


class HybridParams(PluginParams):
    # one entry per KV cache group, in vLLM's group order; build.py fills them from the layout
    groups: tuple[str, ...] = ("full_attention",)
    # vLLM's max_in_flight_tokens (sizes the admission cap of sliding / chunked groups); kvsim
    # schedules synchronously: max_num_batched_tokens
    max_in_flight_tokens: int = 8192

    @field_validator("groups", mode="before")
    @classmethod
    def _groups(cls, v: Any) -> Any:
        v = tuple(v) if isinstance(v, list) else v
        if isinstance(v, tuple):
            if not v:
                raise ValueError("needs at least one group")
            for name in v:
                if isinstance(name, str):
                    _group_spec(name, 16)
        return v

    @field_validator("max_in_flight_tokens")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"must be a positive integer, got {v}")
        return v


@ALLOCATORS.register("hybrid", params=HybridParams)
def build_hybrid(ctx: KVContext, groups: tuple[str, ...], max_in_flight_tokens: int) -> HybridAllocator:
    """engine.kv_allocator hybrid: chosen by build.py for a model with several KV cache groups or
    a sliding-window / chunked-local one; num_gpu_blocks block ids shared by every group."""
    specs = [_group_spec(g, ctx.block_size) for g in groups]
    return HybridAllocator(ctx.num_gpu_blocks, ctx.block_size, specs, max_model_len=ctx.max_model_len,
                           max_in_flight_tokens=max_in_flight_tokens, eviction=ctx.eviction_policy,
                           eviction_params=ctx.eviction_params)


class HybridAllocator(PoolClock):
    """protocols.KVCacheManager over several KV cache groups (module docstring)."""

    caches_full_blocks = False  # no prefix caching; the capacity returned times the calls

    def __init__(self, num_blocks: int, block_size: int, specs: list[LayerKVSpec], *,
                 max_model_len: int, max_in_flight_tokens: int, eviction: str = "lru",
                 eviction_params: dict | None = None) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks, eviction, eviction_params)
        self.total_slots = (num_blocks - 1) * block_size
        self.specs = specs
        self.max_model_len = max_model_len
        # vLLM's max_admission_blocks_per_request (None: uncapped, full attention / MLA)
        self.caps = [s.max_blocks_per_request(max_model_len, max_in_flight_tokens)
                     if s.kind in ("sliding_window", "chunked_local") else None for s in specs]
        self.recycling = [g for g, s in enumerate(specs) if s.kind in ("sliding_window", "chunked_local")]
        self.req_to_blocks: dict[int, list[list[int]]] = {}  # req_id -> one table per group; 0 = null
        self._freed: dict[int, list[int]] = {}  # req_id -> leading null slots per group

    @classmethod
    def from_layout(cls, layout: KVCacheLayout, num_blocks: int, *, max_model_len: int,
                    max_in_flight_tokens: int, **kw: Any) -> HybridAllocator:
        return cls(num_blocks, layout.block_size, [g.spec for g in layout.groups],
                   max_model_len=max_model_len, max_in_flight_tokens=max_in_flight_tokens, **kw)

    def _admission_blocks(self, num_tokens: int) -> list[int]:
        """Blocks per group a sequence of num_tokens is admitted with (recycling groups capped)."""
        n = cdiv(min(num_tokens, self.max_model_len), self.block_size)
        return [n if cap is None else min(n, cap) for cap in self.caps]

    def max_request_slots(self, req: Request) -> int:
        return sum(self._admission_blocks(req.final_kv_tokens)) * self.block_size

    def get_computed_tokens(self, req: Request) -> int:
        return 0  # prefix caching off (module docstring)

    def lookup_prefix(self, req: Request) -> int:
        return 0

    def _remove_skipped(self, tables: list[list[int]], done: list[int], num_computed: int) -> None:
        """vLLM's remove_skipped_blocks: null and free, last first, the whole blocks before each
        recycling group's window, stopping at a slot already nulled (`done`: leading nulls)."""
        bs = self.block_size
        free = self.pool.free_blocks
        for g in self.recycling:
            table = tables[g]
            last = min(self.specs[g].num_skipped_tokens(num_computed) // bs, len(table))
            if last <= done[g]:
                continue
            freed = table[done[g]:last][::-1]
            table[done[g]:last] = [0] * (last - done[g])
            done[g] = last
            free(freed)

    def _capacity(self, tables: list[list[int]], done: list[int]) -> int:
        """Slots held, or the computed-token count at which a recycling group next frees a block
        if that comes first (module docstring)."""
        bs = self.block_size
        cap = len(tables[0]) * bs
        for g in self.recycling:
            s = self.specs[g]
            edge = (done[g] + 1) * bs
            at = (edge + s.sliding_window - 1 if s.kind == "sliding_window"
                  else cdiv(edge, s.attention_chunk_size) * s.attention_chunk_size)
            cap = min(cap, at)
        return cap

    def allocate_slots(self, req: Request, num_new_tokens: int, num_computed_tokens: int,
                       full_sequence_must_fit: bool = False, num_tokens: int | None = None
                       ) -> int | None:
        """1. free what fell out of each window (before checking room, as vLLM); 2. with
        `full_sequence_must_fit`, None unless the whole sequence fits at the admission caps;
        3. per group, positions needed = cdiv(computed + new, block_size) less the table's length
        (a new table starts with nulls for the positions already outside its window); None if
        their sum exceeds the free blocks; 4. pop them. Returns the slot capacity."""
        bs = self.block_size
        pool = self.pool
        tables = self.req_to_blocks.get(req.req_id)
        if tables is not None:
            done = self._freed[req.req_id]
            self._remove_skipped(tables, done, num_computed_tokens)
            lengths = [len(t) for t in tables]
        else:
            lengths = [0] * len(self.specs)
        free = pool.num_free_blocks
        if full_sequence_must_fit:
            want = self._admission_blocks(req.num_tokens)
            if sum(max(w - n, 0) for w, n in zip(want, lengths)) > free:
                return None
        positions = cdiv(num_computed_tokens + num_new_tokens, bs)
        skipped = [0] * len(self.specs)
        if tables is None:  # vLLM pads the skipped blocks of a new request's computed tokens
            for g in self.recycling:
                skipped[g] = min(self.specs[g].num_skipped_tokens(num_computed_tokens) // bs, positions)
        needs = [max(positions - max(n, s), 0) for n, s in zip(lengths, skipped)]
        total = sum(needs)
        if total > free:
            return None
        if tables is None:
            tables = self.req_to_blocks[req.req_id] = [[0] * s for s in skipped]
            done = self._freed[req.req_id] = skipped
        if total:
            new = pool.get_new_blocks(total)
            pos = 0
            for table, need in zip(tables, needs):
                if need:
                    table.extend(new[pos:pos + need])
                    pos += need
        return self._capacity(tables, done)

    def allocate_slots_many(self, reqs: list[Request], num_new: list[int],
                            num_computed: list[int], num_tokens: list[int] | None = None
                            ) -> list[int]:
        return allocate_in_order(self, reqs, num_new, num_computed)

    def free(self, req: Request) -> None:
        """Each group's blocks back to the pool, tail first, group after group (vLLM's
        coordinator frees manager by manager)."""
        tables = self.req_to_blocks.pop(req.req_id, None)
        self._freed.pop(req.req_id, None)
        if tables:
            for table in tables:
                held = [b for b in reversed(table) if b]
                if held:
                    self.pool.free_blocks(held)

    def blocks_held(self, req: Request) -> list[int]:
        """Blocks per group the request holds now (tests, traces)."""
        tables = self.req_to_blocks.get(req.req_id)
        return [sum(1 for b in t if b) for t in tables] if tables else [0] * len(self.specs)

    def stats(self) -> KVStats:
        pool = self.pool
        free = len(pool.free_queue)
        return KVStats((pool.num_blocks - 1 - free) * self.block_size, 1.0 - free / (pool.num_blocks - 1))

    # --- event-level advance (engine/advance.py) ------------------------------------------
    # NOTE: sliding groups free blocks as decoding proceeds, which a decode run's single pass
    # does not model yet: every step of a hybrid model goes through the loop.
    def decode_room(self) -> int | None:
        return None

    def admission_fits(self, req: Request, num_new_tokens: int, full_sequence_must_fit: bool) -> bool:
        return True  # not asked: no decode runs here

    decode_stamps = False  # (decode_room is None: never read)

    def take_decode_blocks(self, req_ids: list[int], times: Any) -> None:
        raise AssertionError("hybrid KV: decode runs are not taken in one pass")

    decode_run_frees = False  # (decode_room is None: never read)

    def free_gauges(self, free):
        raise AssertionError("hybrid KV: decode runs are not taken in one pass")

    def decode_gauges(self, taken):
        raise AssertionError("hybrid KV: decode runs are not taken in one pass")
