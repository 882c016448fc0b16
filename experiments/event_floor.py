"""What one W1-shaped request costs at the least in CPython + numpy + SimPy: a lower bound for
the event-level engine (docs/performance.md, "What a bare event costs").

Run from the project root:
    python experiments/event_floor.py                 # 200,000 requests
    python experiments/event_floor.py --requests 50000

Per request it does only what the engine cannot skip in W1's shape (prefill-first, a batch of
~6 decoding, Poisson arrivals): one SimPy timeout; the prompt's blocks taken from a free stack
(one slice) and its prefill step recorded (one row into 14 columns); then a decode run to the
next arrival: its durations a strided view of a per-batch-size table, their cumulative sum, the
cut at the arrival (searchsorted), the k steps recorded as one block (a list append, as the
recorder keeps them), the blocks the run takes (a grid of steps j0 + q * block_size); and one
finishing request's blocks handed back (one slice). No scheduling policy, no request objects,
no KV accounting, no outputs: the engine does all of those too, so its per-request cost can
only be higher. Prints microseconds per request (CPU time of this process, min of --repeat).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import simpy

COLUMNS = 14  # the recorder's kept columns in a W1 run (no prefix-cache or swap columns)
BLOCK = 16
BATCH = 6  # W1's mean running batch (summary.json: queue.running_mean ~5.9)
STEPS_PER_RUN = 50  # W1: 516,245 steps / 10,000 requests


def bare_run(num_requests: int, seed: int) -> float:
    """CPU seconds of the skeleton loop over num_requests W1-shaped requests."""
    rng = np.random.default_rng(seed)
    table = np.sort(rng.uniform(0.01, 0.02, (BATCH + 2, 8192 * BATCH)), axis=1)  # durations by KV size
    gaps = rng.exponential(1.0, num_requests)
    prompts = rng.integers(1000, 5000, num_requests) // BLOCK + 1  # blocks of an arXiv-length prompt
    free = np.arange(1, 200_000, dtype=np.int64)
    top = [len(free)]
    rows: list[tuple] = []
    blocks: list[tuple] = []
    layers = np.arange(0, 4 * BLOCK, BLOCK, dtype=np.int64)[:, None]
    held: list[np.ndarray] = []

    def loop(env: simpy.Environment):
        for i in range(num_requests):
            yield env.timeout(float(gaps[i]))
            # the prefill step: its blocks, one cost lookup, one row
            n = int(prompts[i])
            t = top[0]
            held.append(free[t - n:t].copy())
            top[0] = t - n
            d = float(table[1, n])
            rows.append((env.now, d) + (n,) * (COLUMNS - 2))
            # the decode run to the next arrival
            first = (i * 7919) % (8192 * BATCH - BATCH * STEPS_PER_RUN)
            durations = table[BATCH, first:first + BATCH * STEPS_PER_RUN:BATCH]
            starts = np.cumsum(durations)
            k = int(starts.searchsorted(float(gaps[i]) * STEPS_PER_RUN * 0.015, side="left"))
            k = max(1, min(k, STEPS_PER_RUN))
            steps = (np.arange(BATCH, dtype=np.int64) * 3) + layers
            key = (steps * BATCH + np.arange(BATCH))[steps < k]
            key.sort()
            blocks.append((len(rows), k, [starts[:k], durations[:k]] + [np.int64(BATCH)] * (COLUMNS - 2)))
            # one request finishes: its blocks back on the stack
            if len(held) > BATCH:
                done = held.pop(0)
                t = top[0]
                free[t:t + len(done)] = done[::-1]
                top[0] = t + len(done)
            if len(rows) >= 1 << 16:
                rows.clear()
                blocks.clear()

    env = simpy.Environment()
    env.process(loop(env))
    c0 = time.process_time()
    env.run()
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.requests < 1 or args.repeat < 1:
        raise SystemExit("--requests and --repeat must be >= 1")
    best = min(bare_run(args.requests, seed) for seed in range(args.repeat))
    print(f"bare W1-shaped request: {best / args.requests * 1e6:.1f} us CPU "
          f"({args.requests:,} requests, min of {args.repeat})")


if __name__ == "__main__":
    main()
