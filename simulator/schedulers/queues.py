"""Queue policies: order the waiting queue and pick preemption victims.

A policy is a small class with the waiting-queue operations and `pick_victim`:
- `fcfs` (vLLM): arrival order; preempted requests go back to the *front*; the victim is the
  most recently admitted running request (the tail of the running list).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from simulator.registry import Registry
from simulator.request import Request


class QueuePolicy(Protocol):
    def push(self, req: Request) -> None: ...  # a new arrival
    def prepend(self, req: Request) -> None: ...  # a preempted request, back in line
    def peek(self) -> Request: ...
    def pop(self) -> Request: ...
    def __len__(self) -> int: ...
    def pick_victim(self, running: list[Request]) -> int: ...  # index into running


QUEUE_POLICIES: Registry = Registry("queue_policy")


@QUEUE_POLICIES.register("fcfs")
class FCFS:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def push(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def __len__(self) -> int:
        return len(self._q)

    def pick_victim(self, running: list[Request]) -> int:
        return len(running) - 1
