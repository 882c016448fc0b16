"""Engine speed benchmark: W1-W4 of ../shared/bench, event-level advance vs the step loop.

Run from the project root:
    python experiments/bench_core.py                       # W1-W4 (W4 at 100,000 requests)
    python experiments/bench_core.py --only w4 --w4-requests 1000000 --no-step
    python experiments/bench_core.py --only w4 --w4-requests 1000000 --w4-growth-from 100000
    python experiments/bench_core.py --w4-memory 100000 200000 300000   # peak RSS per step
Each run is a separate `python -m simulator run` process (wall = the whole command, peak RSS
from wait4, iterations.parquet written unless --no-iterations). Per workload it prints wall,
engine steps, steps per wall second, peak RSS and the speed-up over `engine.advance: step`
measured in the same invocation (W4's step reference runs at --w4-step-requests, a small N,
and the speed-up compares steps per second). --w4-growth-from N also runs W4 at N requests
and prints the cost growth (wall and RSS ratios) from N to --w4-requests. The load average
is printed before and after: walls on a shared machine are only comparable at equal load.
--repeat R runs each workload R times, its runs interleaved (event, step, event, step, ...),
and prints the minimum wall of each (the issue's own method: "interleaved runs, minimum of
two"), with every wall of the event runs after it: this VM's walls vary by ~15 % between runs.
The simulator package is byte-compiled first (as `pip install` does): a machine with
PYTHONDONTWRITEBYTECODE set would otherwise recompile it in every run (~0.3 s of each wall).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path("../shared/bench")
WORKLOADS = {"w1": ["w1.yaml"], "w2": ["w2.yaml"], "w3": ["w3.yaml"], "w4": ["w4_scale.yaml"]}


def fastest(runs: list[dict]) -> dict:
    """The run with the smallest wall; peak RSS the largest of them (memory does not vary
    with the load: the worst is reported)."""
    best = dict(min(runs, key=lambda r: r["wall_s"]))
    best["rss_gb"] = max(r["rss_gb"] for r in runs)
    return best


def one_run(config: str, sets: list[str], advance: str, iterations: bool = True) -> dict:
    """Wall seconds, engine steps, peak RSS (bytes) of one CLI run."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "simulator", "run", str(BENCH / config), "--out", tmp,
               "--set", f"engine.advance={advance}"] + ([] if iterations else ["--no-iterations"])
        for s in sets:
            cmd += ["--set", s]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode() if proc.stderr else ""
        if status != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
        steps = summary["batch"]["num_iterations"]
    return {"wall_s": wall, "steps": steps, "rss_gb": usage.ru_maxrss * 1024 / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", choices=sorted(WORKLOADS), default=sorted(WORKLOADS))
    ap.add_argument("--w4-requests", type=int, default=100_000)
    ap.add_argument("--w4-rate", type=float, default=1.4)
    ap.add_argument("--w4-step-requests", type=int, default=3_000)
    ap.add_argument("--no-step", action="store_true", help="skip the step-loop reference runs")
    ap.add_argument("--repeat", type=int, default=1, metavar="R",
                    help="run each workload R times, interleaved; print the minimum wall of each")
    ap.add_argument("--no-iterations", action="store_true", help="runs skip iterations.parquet")
    ap.add_argument("--w4-growth-from", type=int, metavar="N",
                    help="also run W4 at N requests and print the growth to --w4-requests")
    ap.add_argument("--w4-memory", type=int, nargs="+", metavar="N",
                    help="only W4 at each N requests (--w4-rate): peak RSS and its growth per "
                         "engine step between consecutive sizes")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat must be >= 1, got {args.repeat}")
    compileall.compile_dir("simulator", quiet=1)  # the package the runs import (cwd: project root)
    print("load average (1, 5, 15 min): " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    if args.w4_memory:
        memory_growth(args.w4_memory, args.w4_rate, not args.no_iterations)
        return
    print(f"{'workload':<28} {'wall s':>8} {'steps':>10} {'steps/s':>10} {'RSS GB':>7} "
          f"{'step wall s':>11} {'speed-up':>8}")
    for name in args.only:
        config = WORKLOADS[name][0]
        sets: list[str] = []
        step_sets: list[str] = []
        label = name.upper()
        if name == "w4":
            rate = f"workload.arrival.rate={args.w4_rate}"
            sets = [f"workload.num_requests={args.w4_requests}", rate]
            step_sets = [f"workload.num_requests={args.w4_step_requests}", rate]
            label = f"W4 {args.w4_requests:,} req @ {args.w4_rate}"
        runs: dict[str, list[dict]] = {"base": [], "ev": [], "small": [], "ref": []}
        for _ in range(args.repeat):  # interleaved: each repeat runs them all once
            if name == "w4" and args.w4_growth_from:
                base_sets = [f"workload.num_requests={args.w4_growth_from}", rate]
                runs["base"].append(one_run(config, base_sets, "event", not args.no_iterations))
            runs["ev"].append(one_run(config, sets, "event", not args.no_iterations))
            if not args.no_step:
                if name == "w4":  # the same engine and traffic at a small N: compare steps per second
                    runs["small"].append(one_run(config, step_sets, "event"))
                    runs["ref"].append(one_run(config, step_sets, "step"))
                else:
                    runs["ref"].append(one_run(config, [], "step"))
        if runs["base"]:
            base = fastest(runs["base"])
            print(f"{f'W4 {args.w4_growth_from:,} req @ {args.w4_rate}':<28} {base['wall_s']:>8.2f} "
                  f"{base['steps']:>10,} {base['steps'] / base['wall_s']:>10,.0f} {base['rss_gb']:>7.2f}",
                  flush=True)
        ev = fastest(runs["ev"])
        line = (f"{label:<28} {ev['wall_s']:>8.2f} {ev['steps']:>10,} "
                f"{ev['steps'] / ev['wall_s']:>10,.0f} {ev['rss_gb']:>7.2f}")
        if not args.no_step:
            ref = fastest(runs["ref"])
            if name == "w4":
                small = fastest(runs["small"])
                speedup = (small["steps"] / small["wall_s"]) / (ref["steps"] / ref["wall_s"])
                line += f" {ref['wall_s']:>11.2f} {speedup:>7.1f}x (at {args.w4_step_requests:,} req)"
            else:
                line += f" {ref['wall_s']:>11.2f} {ref['wall_s'] / ev['wall_s']:>7.1f}x"
        if args.repeat > 1:
            line += "  walls " + " ".join(f"{r['wall_s']:.2f}" for r in runs["ev"])
        print(line, flush=True)
        if name == "w4" and args.w4_growth_from:
            print(f"W4 growth {args.w4_growth_from:,} -> {args.w4_requests:,} requests: wall "
                  f"{ev['wall_s'] / base['wall_s']:.2f}x, steps {ev['steps'] / base['steps']:.2f}x, "
                  f"peak RSS {ev['rss_gb'] / base['rss_gb']:.2f}x", flush=True)
    print("load average (1, 5, 15 min): " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)


def memory_growth(sizes: list[int], rate: float, iterations: bool) -> None:
    """Peak RSS of W4 at each size and the bytes per engine step it grows by from the size
    before (what is kept per step, whatever the fixed cost of the process)."""
    print(f"{'W4 requests':>12} {'steps':>11} {'wall s':>8} {'peak RSS GB':>11} {'bytes/step':>10}")
    last = None
    for n in sizes:
        r = one_run("w4_scale.yaml", [f"workload.num_requests={n}", f"workload.arrival.rate={rate}"],
                    "event", iterations)
        growth = (f"{(r['rss_gb'] - last['rss_gb']) * 1e9 / (r['steps'] - last['steps']):>10.1f}"
                  if last is not None and r["steps"] > last["steps"] else f"{'-':>10}")
        print(f"{n:>12,} {r['steps']:>11,} {r['wall_s']:>8.1f} {r['rss_gb']:>11.3f} {growth}", flush=True)
        last = r
    print("load average (1, 5, 15 min): " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)


if __name__ == "__main__":
    main()
