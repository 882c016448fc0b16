"""Contiguous KV cache (FasterTransformer / Orca): one reservation per request in a flat
address space of token slots, placed first-fit.

Reservation size at admission, by `reserve` mode (PagedAttention Fig 2's Orca variants):
- max_model_len: every request reserves max_model_len slots (FasterTransformer, Orca (Max))
- pow2: the next power of two >= prompt + output (Orca (Pow2))
- oracle: exactly prompt + output (Orca (Oracle); needs the true output length)

Free space is a sorted list of holes [start, length); freeing merges neighbours. External
fragmentation is real here: free slots that no hole large enough can use.
"""

from __future__ import annotations

import bisect
from typing import Literal

import numpy as np

from simulator.engine.kvcache import ALLOCATORS, allocate_in_order
from simulator.engine.protocols import KVContext, KVStats, PluginParams
from simulator.workload.request import Request


class ContiguousParams(PluginParams):
    # engine.contiguous_reserve (default max_model_len) fills this when kv_allocator_params omits it
    reserve: Literal["max_model_len", "pow2", "oracle"] = "max_model_len"


@ALLOCATORS.register("contiguous", params=ContiguousParams)
def build_contiguous(ctx: KVContext, reserve: str) -> ContiguousAllocator:
    """engine.kv_allocator contiguous: the whole KV budget as one flat space of token slots."""
    return ContiguousAllocator(ctx.kv_budget_slots, reserve=reserve, max_model_len=ctx.max_model_len)


class ContiguousAllocator:
    block_size = 1
    caches_full_blocks = False
    now = 0.0

    def __init__(self, total_slots: int, reserve: str = "max_model_len", max_model_len: int = 0
                 ) -> None:
        if reserve not in ("max_model_len", "pow2", "oracle"):
            raise ValueError(f"unknown contiguous reserve mode {reserve!r}")
        if reserve == "max_model_len" and max_model_len <= 0:
            raise ValueError("reserve=max_model_len needs max_model_len > 0")
        self.total_slots = total_slots
        self.reserve = reserve
        self.max_model_len = max_model_len
        self._starts: list[int] = [0]  # hole starts, sorted
        self._lengths: list[int] = [total_slots]
        self._used = 0
        self.req_to_region: dict[int, tuple[int, int]] = {}

    def max_request_slots(self, req: Request) -> int:
        total = req.prompt_tokens + req.output_tokens
        if self.reserve == "max_model_len":
            return self.max_model_len
        if self.reserve == "pow2":
            return 1 << (total - 1).bit_length()
        return total

    def get_computed_tokens(self, req: Request) -> int:
        return 0  # no prefix cache

    def lookup_prefix(self, req: Request) -> int:
        return 0

    def allocate_slots(self, req: Request, num_new_tokens: int, num_computed_tokens: int,
                       full_sequence_must_fit: bool = False, num_tokens: int | None = None
                       ) -> int | None:
        """First call reserves the whole region (first fit); later calls fit inside it."""
        region = self.req_to_region.get(req.req_id)
        if region is not None:
            size = region[1]
            return size if num_computed_tokens + num_new_tokens <= size else None
        size = self.max_request_slots(req)
        for i, length in enumerate(self._lengths):
            if length >= size:
                start = self._starts[i]
                if length == size:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] += size
                    self._lengths[i] -= size
                self.req_to_region[req.req_id] = (start, size)
                self._used += size
                return size
        return None

    def allocate_slots_many(self, reqs: list[Request], num_new: list[int],
                            num_computed: list[int], num_tokens: list[int] | None = None
                            ) -> list[int]:
        return allocate_in_order(self, reqs, num_new, num_computed)

    def free(self, req: Request) -> None:
        region = self.req_to_region.pop(req.req_id, None)
        if region is None:
            return
        start, size = region
        self._used -= size
        i = bisect.bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._lengths.insert(i, size)
        # merge with the next hole, then with the previous one
        if i + 1 < len(self._starts) and start + size == self._starts[i + 1]:
            self._lengths[i] += self._lengths.pop(i + 1)
            del self._starts[i + 1]
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start:
            self._lengths[i - 1] += self._lengths.pop(i)
            del self._starts[i]

    # --- event-level advance (engine/advance.py) ------------------------------------------
    def decode_room(self) -> int | None:
        """Decoding stays inside each reservation; a step that would grow one ends the run."""
        return 0

    def admission_fits(self, req: Request, num_new_tokens: int, full_sequence_must_fit: bool) -> bool:
        """Whether allocate_slots could reserve a waiting request's region now (first fit)."""
        return req.req_id in self.req_to_region or self.max_request_slots(req) <= self.largest_hole

    decode_stamps = False  # (take_decode_blocks takes nothing)

    def take_decode_blocks(self, req_ids: list[int], times: np.ndarray | None) -> None:
        if req_ids:
            raise AssertionError("contiguous reservations give decode runs no room to take")

    # a finish frees a region, not blocks a run could take (decode_room is 0): no run goes past it
    decode_run_frees = False

    def free_gauges(self, free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise AssertionError("contiguous reservations: no decode run goes past a finish")

    def decode_gauges(self, taken: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = len(taken)
        return np.full(k, self._used, np.int64), np.full(k, self._used / self.total_slots)

    def stats(self) -> KVStats:
        used = self._used
        return KVStats(used, used / self.total_slots,
                       external_frag_slots=self.total_slots - used - self.largest_hole)

    @property
    def largest_hole(self) -> int:
        return max(self._lengths, default=0)
