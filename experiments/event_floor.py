"""What one W1-shaped request costs at the least in CPython + numpy + SimPy: a floor estimate
for the event-level engine (docs/performance.md, "What a bare event costs").

Run from the project root:
    python experiments/event_floor.py                 # 200,000 requests, and the engine on W1
    python experiments/event_floor.py --requests 50000 --no-engine

Per request it does only what the engine cannot skip in W1's shape (prefill-first, a batch of
~6 decoding, Poisson arrivals): one SimPy timeout; the prompt's blocks taken from a free stack
(one slice) and its prefill step recorded (one row into 14 columns); then a decode run to the
next arrival: its durations a strided view of a per-batch-size table, their cumulative sum, the
cut at the arrival (searchsorted), the k steps recorded as one block (a list append, as the
recorder keeps them), the blocks the run takes (a grid of steps j0 + q * block_size); and one
finishing request's blocks handed back (one slice). No scheduling policy, no request objects,
no KV accounting, no outputs, which the engine does too: an estimate of the floor, not a proof
(a specialised engine might skip some of this). Prints CPU microseconds per request, min of
--repeat; then, measured the same way, the engine's simulation loop on ../shared/bench/w1.yaml
(`run()` of its 10,000 requests, iterations kept nowhere, less a 10-request run's CPU: set-up,
workload, summary and outputs of a short run cancel out).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

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
            starts = np.add.accumulate(durations)  # (the engine's _accumulate: no Python wrapper)
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


def engine_cpu(config: Path, num_requests: int) -> float:
    """CPU seconds of one in-process run() of `config` at num_requests (no iterations kept)."""
    from simulator.config.schema import build_config
    from simulator.engine.run import run

    cfg = build_config(config, [f"workload.num_requests={num_requests}"])
    c0 = time.process_time()
    run(cfg, keep_iterations=False)
    return time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-engine", action="store_true", help="skip the engine's W1 runs")
    args = ap.parse_args()
    if args.requests < 1 or args.repeat < 1:
        raise SystemExit("--requests and --repeat must be >= 1")
    best = min(bare_run(args.requests, seed) for seed in range(args.repeat))
    print(f"bare W1-shaped request: {best / args.requests * 1e6:.1f} us CPU "
          f"({args.requests:,} requests, min of {args.repeat})")
    w1 = Path("../shared/bench/w1.yaml")
    if args.no_engine or not w1.is_file():
        return
    engine_cpu(w1, 10)  # (imports and caches warm)
    full = min(engine_cpu(w1, 10_000) for _ in range(args.repeat))
    short = min(engine_cpu(w1, 10) for _ in range(args.repeat))
    print(f"engine, W1 ({w1}): {(full - short) / (10_000 - 10) * 1e6:.1f} us CPU a request "
          f"(run() of 10,000 requests less one of 10, min of {args.repeat} each)")


if __name__ == "__main__":
    main()
