"""`tiered`: requests are placed in tiers by a rule; tier 0 is served first, under share caps.

The rule (`by`): prompt-token boundaries, or an explicit class read from `priority`, `tenant` or
the workload's `tier` column. Each tier has a maximum share of the running slots (max_num_seqs)
and of the KV pool (by the final KV size of its running requests); a tier at its cap admits
nobody, even at the head of the queue, and the next tier gets the turn, so lower tiers are
never starved. The victim is the most recently admitted request of the lowest tier that has
one running.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
from pydantic import model_validator

from simulator.engine.protocols import PluginParams, QueueContext
from simulator.engine.scheduling.queues import QUEUE_POLICIES
from simulator.errors import ConfigError, did_you_mean
from simulator.workload.request import Request


class TieredParams(PluginParams):
    """engine.queue_params of `tiered`; validate_tiers checks every rule (one line each)."""

    tiers: Any = None  # [{name, max_seq_share, max_kv_share, max_prompt_tokens | match}, ...]
    by: Any = "prompt_tokens"  # prompt_tokens | priority | tenant | tier

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if isinstance(data, dict) and not set(data) - {"tiers", "by"}:
            by = data.get("by", "prompt_tokens")
            data = {**data, "tiers": validate_tiers(data.get("tiers"), by)}
        return data


@QUEUE_POLICIES.register("tiered", params=TieredParams)
class Tiered:
    """tiers: list of {name, max_seq_share, max_kv_share, and one of max_prompt_tokens / match}.

    Rule `by`: "prompt_tokens" (a request goes to the first tier whose max_prompt_tokens is >=
    its prompt; the last tier may omit it), "priority" / "tenant" (a request goes to the tier
    whose `match` list contains its value; unmatched requests go to the last tier), or "tier"
    (the workload's tier column names the tier; an unknown name is an error before the run).
    """

    continue_after_self_preemption = False

    def __init__(self, ctx: QueueContext, tiers: list[dict[str, Any]] | None = None,
                 by: str = "prompt_tokens") -> None:
        self.by = by
        self.tiers = validate_tiers(tiers, by)
        self._index_by_name = {t["name"]: i for i, t in enumerate(self.tiers)}
        k = len(self.tiers)
        self._queues: list[deque[Request]] = [deque() for _ in range(k)]
        self._running: list[list[Request]] = [[] for _ in range(k)]
        self._kv_tokens = [0] * k
        self._max_seqs = [max(1, int(t["max_seq_share"] * ctx.max_num_seqs)) for t in self.tiers]
        self._max_kv = [t["max_kv_share"] * ctx.total_slots for t in self.tiers]
        self._n = 0
        self._peeked: int | None = None
        if by == "tier":
            self._check_names(ctx.workload_tiers)

    def _check_names(self, tiers: np.ndarray | None) -> None:
        if tiers is None:
            raise ConfigError("engine.queue_params.by is 'tier' but the workload has no tier column")
        unknown = sorted(set(np.unique(tiers.astype(str)).tolist()) - set(self._index_by_name))
        if unknown:
            raise ConfigError(f"workload tier {unknown[0]!r} is not a tier of engine.queue_params"
                              f"{did_you_mean(unknown[0], list(self._index_by_name))}; tiers: "
                              f"{', '.join(self._index_by_name)}")

    def tier_of(self, req: Request) -> int:
        if self.by == "prompt_tokens":
            for i, t in enumerate(self.tiers):
                if t.get("max_prompt_tokens") is None or req.prompt_tokens <= t["max_prompt_tokens"]:
                    return i
            return len(self.tiers) - 1
        if self.by == "tier":
            return self._index_by_name[req.tier]
        value = req.priority if self.by == "priority" else req.tenant
        for i, t in enumerate(self.tiers):
            if value in t.get("match", ()):
                return i
        return len(self.tiers) - 1

    def push(self, req: Request) -> None:
        i = self.tier_of(req)
        req.tier = self.tiers[i]["name"]  # recorded per request, for per-tier metrics
        self._queues[i].append(req)
        self._n += 1

    def prepend(self, req: Request) -> None:
        self._queues[self.tier_of(req)].appendleft(req)
        self._n += 1

    def _open(self, i: int) -> bool:
        head = self._queues[i][0]
        return (len(self._running[i]) < self._max_seqs[i]
                and self._kv_tokens[i] + head.prompt_tokens + head.output_tokens <= self._max_kv[i])

    def peek(self) -> Request | None:
        for i, q in enumerate(self._queues):
            if q and self._open(i):
                self._peeked = i
                return q[0]
        self._peeked = None
        return None

    def pop(self) -> Request:
        i = self._peeked
        if i is None:
            raise IndexError("pop() without a successful peek()")
        self._peeked = None
        self._n -= 1
        return self._queues[i].popleft()

    def __len__(self) -> int:
        return self._n

    def on_run(self, req: Request) -> None:
        i = self.tier_of(req)
        self._running[i].append(req)
        self._kv_tokens[i] += req.prompt_tokens + req.output_tokens

    def on_stop(self, req: Request) -> None:
        i = self.tier_of(req)
        self._running[i].remove(req)
        self._kv_tokens[i] -= req.prompt_tokens + req.output_tokens

    def pick_victim(self, running: list[Request]) -> int:
        for i in range(len(self.tiers) - 1, -1, -1):
            if self._running[i]:
                victim = self._running[i][-1]
                for j in range(len(running) - 1, -1, -1):
                    if running[j] is victim:
                        return j
        return len(running) - 1


def validate_tiers(tiers: list[dict[str, Any]] | None, by: str) -> list[dict[str, Any]]:
    """One ConfigError per rule; fills defaults (shares 1.0)."""
    where = "engine.queue_params.tiers"
    if by not in ("prompt_tokens", "priority", "tenant", "tier"):
        raise ConfigError(f"engine.queue_params.by must be prompt_tokens, priority, tenant or tier "
                          f"(the workload's tier column, matched to tier names), got {by!r}")
    if not tiers or not isinstance(tiers, list):
        raise ConfigError(f"{where}: the tiered policy needs a non-empty list of tiers")
    keys = {"name", "max_seq_share", "max_kv_share", "max_prompt_tokens", "match"}
    out, names, last_bound = [], set(), 0
    for i, t in enumerate(tiers):
        if not isinstance(t, dict):
            raise ConfigError(f"{where}[{i}]: expected a mapping, got {t!r}")
        for k in t:
            if k not in keys:
                raise ConfigError(f"{where}[{i}]: unknown key {k!r}{did_you_mean(k, sorted(keys))}")
        name = str(t.get("name", f"tier{i}"))
        if name in names:
            raise ConfigError(f"{where}[{i}]: duplicate tier name {name!r}")
        names.add(name)
        tier = {"name": name, "max_seq_share": t.get("max_seq_share", 1.0),
                "max_kv_share": t.get("max_kv_share", 1.0)}
        for share in ("max_seq_share", "max_kv_share"):
            v = tier[share]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ConfigError(f"{where}[{i}].{share} must be in (0, 1], got {v!r}")
        if by == "tier":
            pass
        elif by == "prompt_tokens":
            bound = t.get("max_prompt_tokens")
            if bound is None and i != len(tiers) - 1:
                raise ConfigError(f"{where}[{i}]: max_prompt_tokens is required except on the last tier")
            if bound is not None:
                if isinstance(bound, bool) or not isinstance(bound, int) or bound <= last_bound:
                    raise ConfigError(f"{where}[{i}].max_prompt_tokens must be an integer above the "
                                      f"previous tier's ({last_bound}), got {bound!r}")
                last_bound = bound
            tier["max_prompt_tokens"] = bound
        else:
            match = t.get("match", [])
            if not isinstance(match, list):
                raise ConfigError(f"{where}[{i}].match must be a list of {by} values, got {match!r}")
            tier["match"] = list(match)
        out.append(tier)
    total_seq_share = sum(t["max_seq_share"] for t in out)
    if total_seq_share < 1:
        raise ConfigError(f"{where}: max_seq_share values sum to {total_seq_share:g} < 1, so some "
                          f"running slots could never be used; raise them to sum to >= 1")
    if len(out) > 1 and all(t["max_seq_share"] >= 1 and t["max_kv_share"] >= 1 for t in out[:-1]):
        # without a cap on the upper tiers a saturating stream of them starves the rest
        raise ConfigError(f"{where}: at least one tier above the last needs max_seq_share or "
                          f"max_kv_share < 1, else lower tiers can starve")
    return out
