"""`fcfs` (vLLM): arrival order; a preempted request goes back to the *front*; the victim is the
most recently admitted running request (the tail of the running list)."""

from __future__ import annotations

from collections import deque

from simulator.engine.protocols import QueueContext
from simulator.engine.scheduling.queues import QUEUE_POLICIES
from simulator.workload.request import Request


@QUEUE_POLICIES.register("fcfs")
class FCFS:
    continue_after_self_preemption = False  # vLLM: nothing ranks after the running tail

    def __init__(self, ctx: QueueContext | None = None) -> None:
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

    def on_run(self, req: Request) -> None:
        pass

    def on_stop(self, req: Request) -> None:
        pass
