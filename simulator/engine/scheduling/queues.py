"""Queue policies: order the waiting queue and pick preemption victims.

A policy is a small class: the waiting-queue operations, `pick_victim`, and two hooks that
tell it who is running (`on_run` / `on_stop`), for policies that cap shares.
- `fcfs` (vLLM): arrival order; preempted requests go back to the *front*; the victim is the
  most recently admitted running request (the tail of the running list).
- `priority` (vLLM): lower `priority` value first, ties by arrival time (then request id);
  preempted requests re-enter by the same key; the victim is the running request with the
  largest (priority, arrival).
- `tiered`: requests are placed in tiers by a rule (prompt-token boundaries, or an explicit
  class read from `priority` or `tenant`); tier 0 is served first. Each tier has a maximum share
  of the running slots (max_num_seqs) and of the KV pool (by the final KV size of its running
  requests); a tier at its cap admits nobody, even at the head of the queue, and the next tier
  gets the turn, so lower tiers are never starved. The victim is the most recently admitted
  request of the lowest tier that has one running.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, Protocol

from simulator.config.registry import Registry
from simulator.errors import ConfigError, did_you_mean
from simulator.workload.request import Request


class QueuePolicy(Protocol):
    def push(self, req: Request) -> None: ...  # a new arrival
    def prepend(self, req: Request) -> None: ...  # a preempted request, back in line
    def peek(self) -> Request | None: ...  # next to admit (None: nobody may be admitted now)
    def pop(self) -> Request: ...  # remove the request peek() returned
    def __len__(self) -> int: ...
    def pick_victim(self, running: list[Request]) -> int: ...  # index into running


QUEUE_POLICIES: Registry = Registry("queue_policy")


class _NoShares:
    continue_after_self_preemption = False  # vLLM: only `priority` goes on past its own victim

    def configure(self, max_num_seqs: int, total_slots: int) -> None:
        pass

    def on_run(self, req: Request) -> None:
        pass

    def on_stop(self, req: Request) -> None:
        pass


@QUEUE_POLICIES.register("fcfs")
class FCFS(_NoShares):
    def __init__(self, **_: Any) -> None:
        self._q: deque[Request] = deque()

    def push(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request | None:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def __len__(self) -> int:
        return len(self._q)

    def pick_victim(self, running: list[Request]) -> int:
        return len(running) - 1


@QUEUE_POLICIES.register("priority")
class Priority(_NoShares):
    def __init__(self, **_: Any) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_s, req.req_id, req))

    prepend = push  # vLLM: a preempted request re-enters the heap by its own key
    continue_after_self_preemption = True  # vLLM 0.33: later running requests rank higher

    def peek(self) -> Request | None:
        return self._heap[0][-1]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[-1]

    def __len__(self) -> int:
        return len(self._heap)

    def pick_victim(self, running: list[Request]) -> int:
        best, best_key = 0, None
        for i, r in enumerate(running):
            key = (r.priority, r.arrival_s)
            if best_key is None or key > best_key:  # first max wins, like Python's max()
                best, best_key = i, key
        return best


@QUEUE_POLICIES.register("tiered")
class Tiered:
    """tiers: list of {name, max_seq_share, max_kv_share, and one of max_prompt_tokens / match}.

    Rule `by`: "prompt_tokens" (a request goes to the first tier whose max_prompt_tokens is >=
    its prompt; the last tier may omit it), "priority" / "tenant" (a request goes to the tier
    whose `match` list contains its value; unmatched requests go to the last tier), or "tier"
    (the workload's tier column names the tier; an unknown name is an error before the run).
    """

    continue_after_self_preemption = False

    def check_names(self, names) -> None:
        if self.by != "tier":
            return
        unknown = sorted(set(names) - set(self._index_by_name))
        if unknown:
            raise ConfigError(f"workload tier {unknown[0]!r} is not a tier of engine.queue_params"
                              f"{did_you_mean(unknown[0], list(self._index_by_name))}; tiers: "
                              f"{', '.join(self._index_by_name)}")

    def __init__(self, tiers: list[dict[str, Any]] | None = None, by: str = "prompt_tokens",
                 **_: Any) -> None:
        self.by = by
        self.tiers = validate_tiers(tiers, by)
        self._index_by_name = {t["name"]: i for i, t in enumerate(self.tiers)}
        k = len(self.tiers)
        self._queues: list[deque[Request]] = [deque() for _ in range(k)]
        self._running: list[list[Request]] = [[] for _ in range(k)]
        self._kv_tokens = [0] * k
        self._max_seqs = [0] * k
        self._max_kv = [0.0] * k
        self._n = 0
        self._peeked: int | None = None

    def configure(self, max_num_seqs: int, total_slots: int) -> None:
        for i, t in enumerate(self.tiers):
            self._max_seqs[i] = max(1, int(t["max_seq_share"] * max_num_seqs))
            self._max_kv[i] = t["max_kv_share"] * total_slots

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

    def tier_name(self, req: Request) -> str:
        return self.tiers[self.tier_of(req)]["name"]

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
