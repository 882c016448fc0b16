"""Per-step decision trace, written by either backend (`kvsim run --trace-steps FILE`).

One JSON object per engine step, one line each (JSONL), in step order:
  step       0-based step index
  t_s        simulated time the step was scheduled: its start (sync), the start of the step
             before it (async scheduling)
  scheduled  [[req_id, tokens], ...] in the order the scheduler scheduled them
  preempted  [req_id, ...] sorted (vLLM reports a set)
  admitted   [[req_id, prefix_hit_tokens], ...] requests (re)admitted this step, in order
  finished   [req_id, ...] sorted
  kv_usage   vLLM's gauge after the step: 1 - free / (num_gpu_blocks - 1)
Two backends made the same decisions exactly when their traces are equal line by line;
`first_divergence` finds the first step where they are not. Under async scheduling step n+1 is
scheduled before step n commits: scheduled rows wait in order until their commit.
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.engine.advance import DecodeRun
    from simulator.engine.protocols import Batch, SchedulerInterface


class StepTrace:
    """Collects steps in memory (`rows`); `write` saves them as JSONL."""

    def __init__(self) -> None:
        self.rows: list[dict] = []
        self._pending: deque[dict] = deque()  # scheduled, not yet committed (two under async)

    def scheduled(self, start_s: float, sched: SchedulerInterface, batch: Batch) -> None:
        """Right after schedule(): the step's decisions."""
        self._pending.append({
            "step": len(self.rows) + len(self._pending),
            "t_s": start_s,
            "scheduled": [[r, n] for r, n in sched.scheduled().items()],
            "preempted": sorted(r.req_id for r in batch.preempted),
            "admitted": [[r, h] for r, h in batch.admitted],
        })

    def committed(self, finished, kv_usage: float) -> None:
        """Right after commit(): what finished, and the KV gauge (of the oldest scheduled step)."""
        row = self._pending.popleft()
        row["finished"] = sorted(r.req_id for r in finished)
        row["kv_usage"] = kv_usage
        self.rows.append(row)

    def decode_run(self, run: DecodeRun) -> None:
        """The steps of an event-level decode run, as step by step would have traced them (a
        part's last step lists the requests it finished). Async: the first was scheduled (and
        traced) before the run, and the run schedules one more, traced here and committed
        after it."""
        if run.trace_rows is not None:  # a span (scheduling/span.py) made its rows (sync)
            for row in run.trace_rows:
                self.rows.append({"step": len(self.rows), **row})
            return
        starts = run.starts.tolist()
        pending = self._pending
        if run.prompt is not None:  # its prompt step (sync): the admitted request's whole prompt
            start, _, batch, stats = run.prompt
            self.rows.append({"step": len(self.rows), "t_s": start,
                              "scheduled": [[r, batch.num_prefill_tokens] for r, _ in batch.admitted],
                              "preempted": [], "admitted": [[r, h] for r, h in batch.admitted],
                              "finished": [], "kv_usage": stats.kv.usage})
        lag = int(run.pipelined)  # async: step j was scheduled when j-1 started
        j = 0
        scheduled: list = []
        merged = run.columns is not None  # one pass: the parts' batches and gauges from the run's
        if merged:
            reqs = run.reqs
            usage_all = run.columns["kv_usage"].tolist()
        for part in run.parts:
            if merged:
                scheduled = [[r.req_id, 1] for r in reqs]
                usage = usage_all[j:j + part.steps]
                if part.finished:
                    gone = set(map(id, part.finished))
                    reqs = [r for r in reqs if id(r) not in gone]
            else:
                scheduled = [[r.req_id, 1] for r in part.reqs]
                usage = part.columns["kv_usage"].tolist()
            last = len(usage) - 1
            for q, u in enumerate(usage):
                row = pending.popleft() if pending else {
                    "step": len(self.rows), "t_s": starts[j - lag], "scheduled": [list(x) for x in scheduled],
                    "preempted": [], "admitted": []}
                row["finished"] = sorted(r.req_id for r in part.finished) if q == last else []
                row["kv_usage"] = u
                self.rows.append(row)
                j += 1
        if run.next_batch is not None:  # async: the step left in flight, those not finished
            gone = {r.req_id for r in run.parts[-1].finished}
            pending.append({"step": len(self.rows), "t_s": starts[-2],
                            "scheduled": [list(x) for x in scheduled if x[0] not in gone],
                            "preempted": [], "admitted": []})

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            for row in self.rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        return path


def read_trace(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


DECISION_KEYS = ("scheduled", "preempted", "admitted", "finished", "kv_usage", "t_s")


def first_divergence(a: list[dict], b: list[dict]) -> tuple[int, str] | None:
    """(step, field) of the first difference between two traces, None if identical."""
    for i, (ra, rb) in enumerate(zip(a, b)):
        for key in DECISION_KEYS:
            if ra.get(key) != rb.get(key):
                return i, key
    if len(a) != len(b):
        return min(len(a), len(b)), "length"
    return None
