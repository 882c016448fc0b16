"""`priority` (vLLM): lower `priority` value first, ties by arrival time (then request id); a
preempted request re-enters by the same key; the victim is the running request with the
largest (priority, arrival)."""

from __future__ import annotations

import heapq

from simulator.engine.protocols import QueueContext
from simulator.engine.scheduling.queues import QUEUE_POLICIES
from simulator.workload.request import Request


@QUEUE_POLICIES.register("priority")
class Priority:
    continue_after_self_preemption = True  # vLLM 0.33: later running requests rank higher

    def __init__(self, ctx: QueueContext | None = None) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []

    def push(self, req: Request) -> None:
        heapq.heappush(self._heap, (req.priority, req.arrival_s, req.req_id, req))

    prepend = push  # vLLM: a preempted request re-enters the heap by its own key

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

    def on_run(self, req: Request) -> None:
        pass

    def on_stop(self, req: Request) -> None:
        pass
