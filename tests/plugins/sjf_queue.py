"""Queue policy `sjf`: shortest job first (prompt + output tokens), ties by arrival; the victim
is the longest running job (the latest admitted among equals)."""

from __future__ import annotations

import heapq

from simulator.engine.scheduling.queues import QUEUE_POLICIES


@QUEUE_POLICIES.register("sjf")
class ShortestJobFirst:
    continue_after_self_preemption = False

    def __init__(self, ctx) -> None:
        self._heap: list = []

    def push(self, req) -> None:
        heapq.heappush(self._heap, (req.prompt_tokens + req.output_tokens, req.arrival_s,
                                    req.req_id, req))

    prepend = push

    def peek(self):
        return self._heap[0][-1]

    def pop(self):
        return heapq.heappop(self._heap)[-1]

    def __len__(self) -> int:
        return len(self._heap)

    def pick_victim(self, running) -> int:
        # NOTE: only a request's spec fields are current while it runs (RunningBatch holds its
        # counters), so the victim is chosen by size, not by progress
        return max(range(len(running)), key=lambda i: (running[i].prompt_tokens
                                                        + running[i].output_tokens, i))

    def on_run(self, req) -> None:
        pass

    def on_stop(self, req) -> None:
        pass
