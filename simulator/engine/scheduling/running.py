"""RunningBatch: the running requests in order, with their hot counters as numpy columns.

Invariant: while a request runs, these columns are the truth for its counters (computed tokens,
token count, outputs, KV capacity, tokens scheduled this step, last token time); they are
written back to the Request object when it leaves (preemption or finish).
"""

from __future__ import annotations

import numpy as np

from simulator.workload.request import Request


class RunningBatch:
    def __init__(self, max_num_seqs: int) -> None:
        self.reqs: list[Request] = []
        self.computed = np.zeros(max_num_seqs, np.int64)
        self.tokens = np.zeros(max_num_seqs, np.int64)
        self.num_out = np.zeros(max_num_seqs, np.int64)
        self.target_out = np.zeros(max_num_seqs, np.int64)
        self.capacity = np.zeros(max_num_seqs, np.int64)
        self.n = np.zeros(max_num_seqs, np.int64)  # tokens scheduled this step
        self.last_token = np.zeros(max_num_seqs, np.float64)

    def _columns(self) -> tuple[np.ndarray, ...]:
        return (self.computed, self.tokens, self.num_out, self.target_out, self.capacity, self.n,
                self.last_token)

    @property
    def m(self) -> int:
        return len(self.reqs)

    def append(self, req: Request, num_computed: int, capacity: int) -> int:
        i = len(self.reqs)
        self.reqs.append(req)
        self.computed[i] = num_computed
        self.tokens[i] = req.num_tokens
        self.num_out[i] = req.num_output_tokens
        self.target_out[i] = req.output_tokens
        self.capacity[i] = capacity
        self.n[i] = 0
        self.last_token[i] = req.last_token_s
        return i

    def write_back(self, i: int) -> Request:
        req = self.reqs[i]
        req.num_computed_tokens = int(self.computed[i])
        req.num_output_tokens = int(self.num_out[i])
        req.last_token_s = float(self.last_token[i])
        return req

    def remove(self, i: int) -> None:
        m = len(self.reqs)
        for col in self._columns():
            col[i:m - 1] = col[i + 1:m]
        self.reqs.pop(i)

    def compress(self, keep: np.ndarray) -> None:
        m = len(self.reqs)
        k = int(keep.sum())
        for col in self._columns():
            col[:k] = col[:m][keep]
        self.reqs = [r for r, kept in zip(self.reqs, keep.tolist()) if kept]
