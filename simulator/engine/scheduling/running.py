"""RunningBatch: the running requests in order, with their hot counters as numpy columns.

Invariant: while a request runs, these columns are the truth for its counters (computed tokens,
token count, outputs, KV capacity, tokens scheduled this step, last token time); they are
written back to the Request object when it leaves (preemption or finish).

Async scheduling (`async_scheduling=True`) keeps two more columns and a schedule-time view, as
vLLM's Request does under its AsyncScheduler: `ph` = outputs in flight (vLLM's
num_output_placeholders), counted in `tokens` and `num_out` already; `computed` includes the
tokens of steps in flight; `hashed` = tokens whose full blocks the prefix cache has hashed.
The materialized counts (what the client has) are tokens - ph and num_out - ph.
"""

from __future__ import annotations

import numpy as np

from simulator.workload.request import Request


class RunningBatch:
    def __init__(self, max_num_seqs: int, async_scheduling: bool = False) -> None:
        self.reqs: list[Request] = []
        self.version = 0  # bumped whenever membership or order changes (async commits check it)
        self.computed = np.zeros(max_num_seqs, np.int64)
        self.tokens = np.zeros(max_num_seqs, np.int64)
        self.num_out = np.zeros(max_num_seqs, np.int64)
        self.target_out = np.zeros(max_num_seqs, np.int64)
        self.capacity = np.zeros(max_num_seqs, np.int64)
        self.n = np.zeros(max_num_seqs, np.int64)  # tokens scheduled this step
        self.last_token = np.zeros(max_num_seqs, np.float64)
        self.ph = np.zeros(max_num_seqs, np.int64)  # async: outputs in flight
        self.hashed = np.zeros(max_num_seqs, np.int64)  # async: tokens of hashed full blocks
        self.ids = np.zeros(max_num_seqs, np.int64)  # async: req_id (commits find their samplers)
        self._cols = (self.computed, self.tokens, self.num_out, self.target_out, self.capacity,
                      self.n, self.last_token) + ((self.ph, self.hashed, self.ids)
                                                  if async_scheduling else ())

    def _columns(self) -> tuple[np.ndarray, ...]:
        return self._cols

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
        self.ph[i] = 0
        self.hashed[i] = num_computed
        self.ids[i] = req.req_id
        self.version += 1
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
        self.version += 1

    def compress(self, keep: np.ndarray) -> None:
        m = len(self.reqs)
        k = int(np.count_nonzero(keep))
        for col in self._columns():
            col[:k] = col[:m][keep]
        self.reqs = [r for r, kept in zip(self.reqs, keep.tolist()) if kept]
        self.version += 1
