"""A request: what arrives (immutable spec fields) and what the engine does to it (state).

Token accounting follows vLLM v1: `num_tokens` = prompt + outputs so far; the engine computes
KV for `num_computed_tokens` of them; a step schedules `num_tokens - num_computed_tokens` (or
a chunk of it); after a step that reaches `num_tokens`, one output token is sampled.
The final KV need of a request is prompt + output - 1 tokens: the last sampled token's KV is
never computed.
"""

from __future__ import annotations

from enum import Enum


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    REJECTED = "rejected"


class Request:
    __slots__ = (
        "req_id", "index", "arrival_s", "prompt_tokens", "output_tokens", "priority", "tenant",
        "prefix", "status", "num_computed_tokens", "num_output_tokens", "first_scheduled_s",
        "first_token_s", "last_token_s", "finish_s", "num_preemptions", "num_cached_tokens",
        "reject_reason", "block_hashes", "tier",
    )

    def __init__(self, req_id: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 priority: int = 0, tenant: str = "", prefix=None) -> None:
        self.req_id = req_id  # per-run counter, also the row in requests.parquet
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens  # target (max_tokens with ignore_eos)
        self.priority = priority
        self.tenant = tenant
        self.tier = ""  # workload's explicit class (queue policy `tiered` with by: tier)
        self.prefix = prefix  # content identity for prefix caching (None: all unique)
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        self.last_token_s = -1.0
        self.finish_s = -1.0
        self.num_preemptions = 0
        self.num_cached_tokens = -1  # prefix-cache hit tokens at first admission
        self.reject_reason = ""
        self.block_hashes: list[int] | None = None  # filled lazily by the prefix cache

    def add_output_token(self, now: float) -> float | None:
        """One more output token, sampled at `now`: the gap since the previous one (the ITL
        sample), None for the first token (its time is the TTFT)."""
        self.num_output_tokens += 1
        if self.num_output_tokens == 1:
            self.first_token_s = now
            gap = None
        else:
            gap = now - self.last_token_s
        self.last_token_s = now
        return gap

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.num_output_tokens

    @property
    def final_kv_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens - 1

    def __repr__(self) -> str:
        return (f"Request(id={self.req_id}, prompt={self.prompt_tokens}, out={self.num_output_tokens}/"
                f"{self.output_tokens}, computed={self.num_computed_tokens}, {self.status.value})")
