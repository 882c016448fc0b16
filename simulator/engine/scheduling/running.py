"""RunningBatch: the running requests in order, with their hot counters as numpy columns.

Invariant: while a request runs, these columns are the truth for its counters (computed tokens,
token count, outputs, KV capacity, tokens scheduled this step, last token time); they are
written back to the Request object when it leaves (preemption or finish).

Async scheduling (`async_scheduling=True`) keeps two more columns and a schedule-time view, as
vLLM's Request does under its AsyncScheduler: `ph` = outputs in flight (vLLM's
num_output_placeholders), counted in `tokens` and `num_out` already; `computed` includes the
tokens of steps in flight; `hashed` = tokens whose full blocks the prefix cache has hashed.
The materialized counts (what the client has) are tokens - ph and num_out - ph.

The integer columns are the rows of one matrix (`cols`), so a request leaving shifts them all in
one numpy call; row 0 is all ones, so `cols[:3, :m] @ cols[:3, :m].T` holds every sum a step's
summary needs (m, sum c, sum n, c @ n, n @ n) in one call, and tokens / num_out / ph (rows 3-5)
advance together by a row-block add.
`version` counts departures only: an append leaves every other request in its slot, so a slot
taken at one step still names the same request later while the version is unchanged. The last
departures are kept (`departures`: the version each made and the slots it took), so a slot
taken at an earlier version is followed to where it is now (`slots_now`).
"""

from __future__ import annotations

from collections import deque
from itertools import islice

import numpy as np

from simulator.workload.request import Request

_DEPARTURES = 32  # departures RunningBatch keeps (a step in flight sees one or two)

# rows of RunningBatch.cols; ONE is all ones; TOKENS:PH + 1 is the block a step's samplers advance
ONE, COMPUTED, N, TOKENS, NUM_OUT, PH, TARGET_OUT, CAPACITY, HASHED, IDS = range(10)
_COMPUTED_CAPACITY = slice(COMPUTED, CAPACITY + 1, CAPACITY - COMPUTED)  # the two rows, one view


class RunningBatch:
    def __init__(self, max_num_seqs: int, async_scheduling: bool = False) -> None:
        self.reqs: list[Request] = []
        self.version = 0  # bumped whenever a request leaves (the slots after it shift)
        # async: (version made, slots taken: one int, or an ascending array), the last _DEPARTURES
        # (only an async commit reads them)
        self.departures: deque[tuple[int, int | np.ndarray]] = deque(maxlen=_DEPARTURES)
        self.cols = cols = np.zeros((10, max_num_seqs), np.int64)
        cols[ONE] = 1
        self.ones = cols[ONE]  # never written
        self.computed = cols[COMPUTED]
        self.tokens = cols[TOKENS]
        self.num_out = cols[NUM_OUT]
        self.ph = cols[PH]  # async: outputs in flight
        self.target_out = cols[TARGET_OUT]
        self.capacity = cols[CAPACITY]
        self.n = cols[N]  # tokens scheduled this step
        self.hashed = cols[HASHED]  # async: tokens of hashed full blocks
        self.ids = cols[IDS]  # async: req_id (commits find their samplers)
        self.last_token = np.zeros(max_num_seqs, np.float64)
        self.async_scheduling = async_scheduling

    @property
    def m(self) -> int:
        return len(self.reqs)

    def append(self, req: Request, num_computed: int, capacity: int) -> int:
        i = len(self.reqs)
        self.reqs.append(req)
        self.cols[COMPUTED:, i] = (num_computed, 0, req.num_tokens, req.num_output_tokens, 0,
                                   req.output_tokens, capacity, num_computed, req.req_id)
        self.last_token[i] = req.last_token_s
        return i

    def write_back(self, i: int) -> Request:
        req = self.reqs[i]
        req.num_computed_tokens = self.computed.item(i)
        req.num_output_tokens = self.num_out.item(i)
        req.last_token_s = self.last_token.item(i)
        return req

    def remove(self, i: int) -> None:
        m = len(self.reqs)
        cols = self.cols
        cols[:, i:m - 1] = cols[:, i + 1:m]
        self.last_token[i:m - 1] = self.last_token[i + 1:m]
        # a new list (not popped in place): a step in flight keeps the list it was scheduled from
        self.reqs = self.reqs[:i] + self.reqs[i + 1:]
        self.version += 1
        if self.async_scheduling:
            self.departures.append((self.version, int(i)))

    def remove_slots(self, slots: list[int]) -> None:
        """The requests at `slots` (ascending) leave, the others keep their order."""
        if len(slots) == 1:  # one leaves (the common case): slices, not a mask and a gather
            self.remove(slots[0])
            return
        keep = np.ones(len(self.reqs), bool)
        keep[slots] = False
        self.compress(keep)

    def computed_and_capacity(self, m: int) -> tuple[int, int]:
        """(sum of computed tokens, sum of KV capacity) over the first m requests: one dot
        product of the two rows (exact integers)."""
        sums = self.cols[_COMPUTED_CAPACITY, :m].dot(self.ones[:m])  # (~0.3 us under `@`)
        return sums.item(0), sums.item(1)

    def computed_and_capacity_lists(self, m: int) -> list[list[int]]:
        """[computed tokens, KV capacities] of the first m requests, as two lists (one call)."""
        return self.cols[_COMPUTED_CAPACITY, :m].tolist()

    def compress(self, keep: np.ndarray) -> None:
        """Keep the requests where `keep` is True, in order."""
        at = keep.nonzero()[0]
        k = len(at)
        cols = self.cols
        cols[:, :k] = cols[:, at]
        self.last_token[:k] = self.last_token[at]
        reqs = self.reqs
        self.reqs = [reqs[i] for i in at.tolist()]
        self.version += 1
        if self.async_scheduling:
            self.departures.append((self.version, (~keep).nonzero()[0]))

    def slots_now(self, version: int, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Where the requests at `slots` at `version` are now, and which of them are still
        running: each departure since moved those after it down by the number it took (only
        departures move a request: an append joins the end). None where the departures since
        are no longer all kept."""
        deps = self.departures
        if not deps or deps[0][0] > version + 1:
            return None
        alive = None
        # each departure made one version: those since `version` are the last self.version - version
        for _, gone in islice(deps, len(deps) - (self.version - version), None):
            if type(gone) is int:  # (one left: the common case)
                out = slots == gone
                slots = slots - (slots > gone)
            elif len(gone):
                below = gone.searchsorted(slots)
                out = gone[np.minimum(below, len(gone) - 1)] == slots
                slots = slots - below
            else:  # (a compression that kept everyone)
                continue
            alive = ~out if alive is None else alive & ~out
        return slots, np.ones(len(slots), bool) if alive is None else alive
