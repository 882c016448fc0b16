"""Allocator `toy_bump` with a parameter: a free-slot counter, no placement and no prefix cache.
Each request reserves its final KV size plus `extra_slots` at first allocation."""

from __future__ import annotations

from pydantic import Field

from simulator.engine.kvcache import ALLOCATORS, allocate_in_order
from simulator.engine.protocols import KVContext, KVStats, PluginParams


class ToyParams(PluginParams):
    extra_slots: int = Field(0, ge=0)


class ToyBump:
    block_size = 1
    caches_full_blocks = False

    def __init__(self, total_slots: int, extra_slots: int) -> None:
        self.total_slots = total_slots
        self.extra_slots = extra_slots
        self.now = 0.0
        self._used = 0
        self._held: dict[int, int] = {}

    def max_request_slots(self, req) -> int:
        return req.final_kv_tokens + self.extra_slots

    def get_computed_tokens(self, req) -> int:
        return 0

    def lookup_prefix(self, req) -> int:
        return 0

    def allocate_slots(self, req, num_new_tokens, num_computed_tokens, full_sequence_must_fit=False,
                       num_tokens=None):
        held = self._held.get(req.req_id)
        if held is None:
            held = self.max_request_slots(req)
            if held > self.total_slots - self._used:
                return None
            self._held[req.req_id] = held
            self._used += held
        return held if num_computed_tokens + num_new_tokens <= held else None

    def allocate_slots_many(self, reqs, num_new, num_computed, num_tokens=None):
        return allocate_in_order(self, reqs, num_new, num_computed)

    def free(self, req) -> None:
        self._used -= self._held.pop(req.req_id, 0)

    def decode_room(self) -> int | None:  # no event-level decode runs: every step is looped
        return None

    def take_decode_blocks(self, req_ids, times) -> None:
        raise AssertionError("not used when decode_room() is None")

    decode_run_frees = False  # (decode_room is None: never read)
    decode_stamps = False  # (decode_room is None: never read)

    def free_gauges(self, free):
        raise AssertionError("not used when decode_room() is None")

    def decode_gauges(self, taken):
        raise AssertionError("not used when decode_room() is None")

    def stats(self) -> KVStats:
        return KVStats(self._used, self._used / self.total_slots)


@ALLOCATORS.register("toy_bump", params=ToyParams)
def build_toy(ctx: KVContext, extra_slots: int) -> ToyBump:
    return ToyBump(ctx.kv_budget_slots, extra_slots)
