"""Benchmark the core loop: wall time, simulated requests per wall second, peak RSS.

    python experiments/bench_core.py [--requests 10000 100000] [--rate 1000]

Saturating load: Poisson arrivals far above what the replica serves, so the waiting queue
holds most requests and the running batch stays full (default model/GPU, ShareGPT-like lengths).
Target (issue 2): 100k requests in <= 60 s on one core. Each size runs in a fresh process so
that peak RSS is per size.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def one(n: int, rate: float) -> dict:
    from simulator.config.schema import build_config
    from simulator.engine.run import run

    cfg = build_config(None, [f"workload.num_requests={n}", f"workload.arrival.rate={rate}",
                              "engine.max_model_len=4096"])
    t0 = time.perf_counter()
    res = run(cfg)
    wall = time.perf_counter() - t0
    s = res.summary
    return {"requests": n, "wall_s": round(wall, 2), "sim_requests_per_wall_s": round(n / wall),
            "iterations": s["batch"]["num_iterations"],
            "iterations_per_wall_s": round(s["batch"]["num_iterations"] / wall),
            "mean_batch": round(s["batch"]["num_seqs"]["mean"], 1),
            "simulated_s": round(s["makespan_s"], 1),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one(args.child, args.rate)))
        return
    print(f"{'requests':>9} {'wall_s':>7} {'req/wall_s':>10} {'iters':>8} {'iters/s':>8} "
          f"{'batch':>6} {'sim_s':>8} {'RSS MiB':>8}")
    for n in args.requests:
        out = subprocess.run([sys.executable, __file__, "--child", str(n), "--rate", str(args.rate)],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(f"{r['requests']:>9} {r['wall_s']:>7} {r['sim_requests_per_wall_s']:>10} "
              f"{r['iterations']:>8} {r['iterations_per_wall_s']:>8} {r['mean_batch']:>6} "
              f"{r['simulated_s']:>8} {r['peak_rss_mib']:>8}")


if __name__ == "__main__":
    main()
