"""`kvsim run [CONFIG.yaml] [--set key=value ...] [--seed N] [--out DIR]` and vLLM's flag names."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simulator.config import build_config
from simulator.runner import run

# vLLM CLI flag -> engine field
VLLM_FLAGS = {
    "--block-size": ("block_size", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--max-model-len": ("max_model_len", int),
    "--max-num-seqs": ("max_num_seqs", int),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int),
    "--tensor-parallel-size": ("tensor_parallel_size", int),
}


def register(sub) -> None:
    p = sub.add_parser("run", help="simulate one replica", description=__doc__)
    p.add_argument("config", nargs="?", help="YAML config (default: built-in Llama-3.1-8B on H100)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set engine.block_size=32 or "
                        "--set workload.arrival.rate=5 (bare field names work when unambiguous)")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--model", help="model name or path to a Hugging Face config.json")
    p.add_argument("--gpu", help="GPU profile name or path")
    p.add_argument("--out", default="runs/latest", help="output directory (default runs/latest)")
    p.add_argument("--quiet", action="store_true", help="print only the output directory")
    for flag, (_, typ) in VLLM_FLAGS.items():
        p.add_argument(flag, type=typ, help=f"vLLM flag (engine.{VLLM_FLAGS[flag][0]})")
    p.set_defaults(func=main)


def _progress_factory(console: Console):
    """A progress bar that appears only once a run has taken more than ~2 s of wall time."""
    state = {"t0": time.perf_counter(), "bar": None, "task": None, "n": 0}

    def update(done: int, total: int) -> None:
        state["n"] += 1
        if state["n"] % 256:
            return
        if state["bar"] is None:
            if time.perf_counter() - state["t0"] < 2.0:
                return
            from rich.progress import Progress
            state["bar"] = Progress(console=console, transient=True)
            state["bar"].start()
            state["task"] = state["bar"].add_task("simulating", total=total)
        state["bar"].update(state["task"], completed=done)

    def stop() -> None:
        if state["bar"] is not None:
            state["bar"].stop()

    return update, stop


def main(args: argparse.Namespace) -> int:
    extra = {}
    for flag, (field, _) in VLLM_FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            extra[f"engine.{field}"] = value
    if args.seed is not None:
        extra["seed"] = args.seed
    if args.model:
        extra["model"] = args.model
    if args.gpu:
        extra["gpu"] = args.gpu
    config = build_config(args.config, args.overrides, extra)
    err = Console(stderr=True)
    update, stop = _progress_factory(err)
    try:
        result = run(config, progress=None if args.quiet else update)
    finally:
        stop()
    out = result.write(Path(args.out))
    if args.quiet:
        print(out)
        return 0
    console = Console()
    for line in result.setup.lines():
        console.print(line, highlight=False)
    print_summary(console, result.summary)
    console.print(f"wrote {out}/summary.json, requests.parquet, iterations.parquet, config.yaml "
                  f"(simulated in {result.wall_s:.1f} s wall)", highlight=False)
    return 0


def _fmt(v, scale=1.0, digits=3) -> str:
    return "-" if v is None else f"{v * scale:.{digits}g}"


def print_summary(console: Console, s: dict) -> None:
    r = s["requests"]
    t = s["throughput"]
    console.print(
        f"requests: {r['arrived']} arrived, {r['finished']} finished, {r['rejected']} rejected"
        + (f" {r['rejected_by_reason']}" if r["rejected"] else "")
        + f"; makespan {s['makespan_s']:.1f} s; throughput {t['requests_per_s']:.2f} req/s, "
          f"{t['output_tokens_per_s']:.0f} output tok/s", highlight=False)
    table = Table(title="latency (ms)", title_justify="left")
    for col in ("metric", "mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        st = s["latency_s"][name]
        table.add_row(name.upper(), *(_fmt(st[k], 1e3) for k in ("mean", "p50", "p90", "p99", "max")))
    console.print(table)
    kv = s["kv_cache"]
    b = s["batch"]
    console.print(
        f"KV usage mean {kv['usage_mean']:.1%}, max {kv['usage_max']:.1%}; batch size mean "
        f"{_fmt(b['num_seqs']['mean'])}, p99 {_fmt(b['num_seqs']['p99'])}, max running "
        f"{b['max_running']}; {b['num_iterations']} iterations; preemptions {s['preemptions']['total']}"
        f" ({r['preempted_at_least_once']} requests)", highlight=False)
    if not s["config"]["cost_model_calibrated"]:
        console.print("note: cost model uses uncalibrated default efficiencies for this GPU",
                      style="yellow", highlight=False)


if __name__ == "__main__":
    sys.exit(main(argparse.Namespace()))
