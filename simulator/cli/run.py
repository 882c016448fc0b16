"""`kvsim run [CONFIG.yaml] [--set key=value ...] [--seed N] [--seeds N] [--out DIR]` and vLLM's
flag names.

The setup lines (model, memory plan, blocks, cost model) are printed as soon as the engine is
built, before the simulation (as vLLM logs them at start-up), then the summary at the end.
--seeds N runs seeds seed, seed+1, ..., seed+N-1 (each identical to `--seed s` on its own),
writes each to OUT/seed_<s>/ and the mean and 95 % t-interval over seeds of every summary
metric to OUT/seeds_summary.json (metrics.aggregate_seeds)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from simulator.cli.common import (
    check_out_dir,
    check_out_file,
    make_console,
    quiet_on_broken_pipe,
    rejections_table,
)
from simulator.errors import ConfigError

# vLLM CLI flag -> engine field
VLLM_FLAGS = {
    "--block-size": ("block_size", int),
    "--gpu-memory-utilization": ("gpu_memory_utilization", float),
    "--max-model-len": ("max_model_len", int),
    "--max-num-seqs": ("max_num_seqs", int),
    "--max-num-batched-tokens": ("max_num_batched_tokens", int),
    "--tensor-parallel-size": ("tensor_parallel_size", int),
    "--kv-cache-dtype": ("kv_cache_dtype", str),
    "--quantization": ("quantization", str),
}
# vLLM boolean flags -> engine field (set to true when given)
VLLM_SWITCHES = {
    "--enable-expert-parallel": "enable_expert_parallel",
    "--disable-hybrid-kv-cache-manager": "disable_hybrid_kv_cache_manager",
}

DESCRIPTION = """Simulate serving a workload: requests arrive, vLLM's scheduler batches them, the
KV cache fills and frees, and a calibrated cost model times every step. Prints the setup
(model, memory, KV blocks, cost model) at start and a summary at the end (latency
percentiles, throughput, KV use, preemptions, SLO share, alerts); writes the run directory
(summary.json, requests.parquet, iterations.parquet, config.yaml, timeseries.parquet,
openmetrics.txt, alerts.json)."""

EPILOG = """examples:
  kvsim run                                            built-in Llama-3.1-8B on an H100
  kvsim run workloads/chat.yaml --gpu a100-80gb --out runs/chat
  kvsim run --set workload.arrival.rate=20 --block-size 32 --max-num-seqs 128
  kvsim run my.yaml --seeds 5                          mean and 95% intervals over 5 seeds"""


def register(sub, help: str) -> None:
    p = sub.add_parser("run", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("config", nargs="?", help="YAML config (default: built-in Llama-3.1-8B on H100)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set engine.block_size=32 or "
                        "--set workload.arrival.rate=5 (bare field names work when unambiguous)")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run N seeds (seed, seed+1, ...) and report mean and 95%% interval")
    p.add_argument("--metrics-interval-s", type=float, default=None, metavar="S",
                   help="sampling interval of timeseries.parquet / openmetrics.txt (default 1 s, "
                        "or longer for runs over ~5.5 simulated hours: at most 20,000 samples)")
    p.add_argument("--no-iterations", dest="iterations", action="store_false",
                   help="do not write iterations.parquet (one row per engine step; sweeps)")
    p.add_argument("--model", help="model name (e.g. llama-3.1-8b) or path to a Hugging Face config.json")
    p.add_argument("--gpu", help="GPU profile name (e.g. h100, a100-80gb) or path to a profile YAML")
    p.add_argument("--out", default="runs/latest", metavar="DIR",
                   help="output directory (default runs/latest)")
    p.add_argument("--quiet", action="store_true", help="print only the output directory")
    p.add_argument("--trace-steps", metavar="FILE", help="write each step's decisions as JSONL "
                   "(scheduled tokens, preemptions, admissions with prefix hits, finishes, KV "
                   "usage), for either engine.backend")
    vllm = p.add_argument_group("vLLM engine flags (same names as `vllm serve`)")
    for flag, (field, typ) in VLLM_FLAGS.items():
        vllm.add_argument(flag, type=typ, metavar=typ.__name__.upper(), help=f"engine.{field}")
    for flag, field in VLLM_SWITCHES.items():
        vllm.add_argument(flag, action="store_true", default=None, help=f"engine.{field}: true")
    vllm.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                      help="engine.async_scheduling (default: vLLM 0.33's, on unless the mode "
                           "schedules synchronously)")
    p.set_defaults(func=main)


def _progress_factory(err):
    """A progress bar on stderr that appears only once a run has taken more than ~2 s of wall
    time (the run calls it every few hundred steps)."""
    state = {"t0": time.perf_counter(), "bar": None, "task": None}

    def update(done: int, total: int) -> None:
        if state["bar"] is None:
            if time.perf_counter() - state["t0"] < 2.0:
                return
            from rich.progress import Progress
            state["bar"] = Progress(console=err, transient=True)
            state["bar"].start()
            state["task"] = state["bar"].add_task("simulating", total=total)
        state["bar"].update(state["task"], completed=done)

    def stop() -> None:
        if state["bar"] is not None:
            state["bar"].stop()

    return update, stop


def print_setup(out, setup) -> None:
    """The setup lines, flushed at once: a piped or logged long run shows them before it starts."""
    for line in setup.lines():
        out.print(line, highlight=False)
    try:
        out.file.flush()
    except BrokenPipeError:  # the reader left: the run goes on (common.quiet_on_broken_pipe)
        quiet_on_broken_pipe(out)


def main(args: argparse.Namespace) -> int:
    from simulator.config.schema import build_config
    from simulator.engine.run import run
    from simulator.metrics.timeseries import check_interval

    extra = {}
    for flag, (field, _) in VLLM_FLAGS.items():
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        if value is not None:
            extra[f"engine.{field}"] = value
    for flag, field in VLLM_SWITCHES.items():
        if getattr(args, flag.lstrip("-").replace("-", "_")):
            extra[f"engine.{field}"] = True
    if args.async_scheduling is not None:
        extra["engine.async_scheduling"] = args.async_scheduling
    if args.seed is not None:
        extra["seed"] = args.seed
    if args.model:
        extra["model"] = args.model
    if args.gpu:
        extra["gpu"] = args.gpu
    config = build_config(args.config, args.overrides, extra)
    if args.metrics_interval_s is not None:
        try:
            check_interval(args.metrics_interval_s)
        except ConfigError:
            # NOTE: named as the user typed it (check_interval names the writer's interval_s)
            raise ConfigError(f"--metrics-interval-s must be a finite number of seconds >= 0.001 "
                              f"(Prometheus stores milliseconds), got {args.metrics_interval_s!r}") from None
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be an integer >= 1, got {args.seeds}")
    check_out_dir(args.out, "--out")
    check_out_file(args.trace_steps, "--trace-steps")
    if args.seeds > 1:
        return _main_seeds(args, config)
    # NOTE: --quiet prints one line: no rich console (nor its import) at all
    out_console = None if args.quiet else make_console()
    update, stop = (None, lambda: None) if args.quiet else _progress_factory(make_console(stderr=True))
    trace = None
    if args.trace_steps:
        from simulator.engine.steptrace import StepTrace
        trace = StepTrace()

    def on_setup(setup) -> None:  # run() calls it before any simulation work, clusters included
        if not args.quiet:
            print_setup(out_console, setup)
    try:
        result = run(config, progress=update, trace=trace, on_setup=on_setup,
                     **_iterations_args(Path(args.out), args.iterations))
    finally:
        stop()
    out = result.write(Path(args.out), interval_s=args.metrics_interval_s, iterations=args.iterations)
    if trace is not None:
        trace.write(args.trace_steps)
    if args.quiet:
        print(out)
        return 0
    print_summary(out_console, result.summary)
    its = "iterations.parquet, " if args.iterations else ""
    out_console.print(f"wrote {out}/summary.json, requests.parquet, {its}config.yaml, "
                      f"timeseries.parquet, openmetrics.txt, alerts.json "
                      f"(simulated in {result.wall_s:.1f} s wall); `kvsim report {out}` for a report",
                      highlight=False)
    return 0


def _iterations_args(out: Path, iterations: bool) -> dict:
    """run()'s memory arguments: iterations.parquet streamed into the run directory as the run
    goes (a partial name until Result.write), or no iterations table at all (--no-iterations)."""
    if not iterations:
        return {"keep_iterations": False}
    out.mkdir(parents=True, exist_ok=True)
    return {"iterations_path": out / ".iterations.parquet.partial"}


def _main_seeds(args: argparse.Namespace, config) -> int:
    import json

    from simulator.engine.run import run
    from simulator.metrics.summary import aggregate_seeds, clean_floats

    out = Path(args.out)
    seeds = [config.seed + i for i in range(args.seeds)]
    out_console, err = make_console(), make_console(stderr=True)
    summaries = []

    def on_setup(setup) -> None:  # every seed has the same setup: show it once, at the start
        if not args.quiet and not summaries:
            print_setup(out_console, setup)
    for seed in seeds:
        result = run(config.replace(seed=seed), on_setup=on_setup,
                     **_iterations_args(out / f"seed_{seed}", args.iterations))
        result.write(out / f"seed_{seed}", interval_s=args.metrics_interval_s,
                     iterations=args.iterations)
        summaries.append(result.summary)
        if not args.quiet:
            err.print(f"seed {seed}: done ({result.wall_s:.1f} s wall)", highlight=False)
    agg = aggregate_seeds(seeds, summaries)
    (out / "seeds_summary.json").write_text(
        json.dumps(clean_floats(agg), indent=2, sort_keys=True) + "\n")
    if args.quiet:
        print(out)
        return 0
    print_seeds_summary(out_console, agg)
    out_console.print(f"wrote {out}/seeds_summary.json and one run directory per seed "
                      f"({', '.join(f'seed_{s}' for s in seeds)})", highlight=False)
    return 0


SEED_TABLE = (
    ("throughput.requests_per_s", "throughput (req/s)", 1.0),
    ("throughput.output_tokens_per_s", "output tok/s", 1.0),
    ("latency_s.ttft.mean", "TTFT mean (ms)", 1e3),
    ("latency_s.ttft.p99", "TTFT p99 (ms)", 1e3),
    ("latency_s.tpot.mean", "TPOT mean (ms)", 1e3),
    ("latency_s.e2e.p99", "E2E p99 (s)", 1.0),
    ("kv_cache.usage_mean", "KV usage mean", 1.0),
    ("queue.pending_mean", "waiting mean", 1.0),
    ("preemptions.rate", "preemption rate", 1.0),
    ("slo.share", "SLO share", 1.0),
)


def print_seeds_summary(out, agg: dict) -> None:
    from rich.table import Table

    table = Table(title=f"{len(agg['seeds'])} seeds: mean, 95% interval of the mean (ci95) and "
                        f"95% prediction interval for one seed (pi95)", title_justify="left")
    for col in ("metric", "mean", "ci95", "pi95"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for path, label, scale in SEED_TABLE:
        m = agg["metrics"].get(path)
        if m is not None:
            table.add_row(label, _fmt(m["mean"], scale),
                          f"{_fmt(m['ci95_low'], scale)} .. {_fmt(m['ci95_high'], scale)}",
                          f"{_fmt(m['pi95_low'], scale)} .. {_fmt(m['pi95_high'], scale)}")
    out.print(table)
    fired = {k: v for k, v in agg["alerts_fired_in"].items() if v}
    out.print("alerts fired: " + (", ".join(f"{k} in {v}/{len(agg['seeds'])} seeds"
                                                for k, v in fired.items()) or "none"), highlight=False)


def _fmt(v, scale=1.0, digits=3) -> str:
    if v is None:
        return "-"
    x = v * scale
    return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"  # 12,345 not 1.23e+04


def _pct(v) -> str:
    return "-" if v is None else f"{v:.1%}"


def print_summary(out, s: dict) -> None:
    from rich.table import Table

    r = s["requests"]
    t = s["throughput"]
    out.print(
        f"requests: {r['arrived']} arrived, {r['finished']} finished, {r['rejected']} rejected"
        f"; makespan {s['makespan_s']:.1f} s; throughput {t['requests_per_s']:.2f} req/s, "
        f"{t['output_tokens_per_s']:.0f} output tok/s", highlight=False)
    if r["rejected"]:
        out.print(rejections_table(r["rejected_by_reason"]))
    table = Table(title="latency (ms)", title_justify="left")
    for col in ("metric", "mean", "p50", "p90", "p99", "max"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    for name in ("ttft", "tpot", "itl", "e2e", "queue"):
        st = s["latency_s"][name]
        table.add_row(name.upper(), *(_fmt(st[k], 1e3) for k in ("mean", "p50", "p90", "p99", "max")))
    out.print(table)
    kv = s["kv_cache"]
    b = s["batch"]
    q = s["queue"]
    fr = s["fragmentation"]
    slo = s["slo"]
    out.print(
        f"KV usage mean {_pct(kv['usage_mean'])}, p95 {_pct(kv['usage_p95'])}, max "
        f"{_pct(kv['usage_max'])}; token-state share {_pct(fr['token_state_share'])}; prefix-cache "
        f"hits {_pct(s['prefix_cache']['request_hit_rate'])} of prompt tokens", highlight=False)
    if s.get("swap"):
        sw = s["swap"]
        out.print(f"swap: {sw['swap_outs']} out, {sw['swap_ins']} in, {sw['bytes'] / 2**30:.2f} GiB, "
                  f"{_pct(sw['time_share'])} of busy time; {sw['fallbacks_to_recompute']} "
                  f"preemptions fell back to recompute", highlight=False)
    out.print(
        f"batch size mean {_fmt(b['num_seqs']['mean'])}, p99 {_fmt(b['num_seqs']['p99'])} seqs, "
        f"{_fmt(b['num_tokens']['mean'])} tokens; max running {b['max_running']}; "
        f"{b['num_iterations']} iterations; waiting mean {_fmt(q['pending_mean'])}, max "
        f"{_fmt(q['pending_max'])}", highlight=False)
    out.print(
        f"preemptions {s['preemptions']['total']} ({r['preempted_at_least_once']} requests, "
        f"{_fmt(s['preemptions']['per_s'])}/s); SLO (TTFT <= {_fmt(slo['ttft_s'])} s, TPOT <= "
        f"{_fmt(slo['tpot_s'])} s) met by {_pct(slo['share'])}, goodput "
        f"{_fmt(slo['goodput_requests_per_s'])} req/s", highlight=False)
    fired = s["alerts"]["fired"]
    out.print("alerts fired: " + (", ".join(
        f"{n} ({s['alerts']['rules'][n]['num_firings']}x)" for n in fired) if fired else "none"),
        style="red" if fired else None, highlight=False)
    if not s["config"]["cost_model_calibrated"]:
        out.print("note: no kernel measurements for this GPU: its cost-model efficiencies are "
                  "extrapolated from the nearest measured GPU (see the cost model line above)",
                  style="yellow", highlight=False)
