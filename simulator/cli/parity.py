"""`kvsim parity [CONFIG.yaml] [--set key=value ...] [--case NAME|all] [--seeds N]`: run the same
workload on kvsim's scheduler and on vLLM's own (engine.backend vllm), compare their step
traces, and print "identical" or the first diverging step with both sides' decisions, the
end-to-end metrics of both, and the wall-time ratio of the simulation loops.

Without --case the config (YAML / --set) is run as given; with --case it is one of the parity
matrix's workloads (simulator/analysis/parity.py CASES), --seeds N seeds each, --num-requests each.
Exit status 0 when every run is identical, 1 otherwise."""

from __future__ import annotations

from pathlib import Path

from simulator.cli.common import check_out_dir, check_out_file, make_console
from simulator.errors import ConfigError

METRICS = (("TTFT p50 s", ("latency_s", "ttft", "p50")), ("TTFT p99 s", ("latency_s", "ttft", "p99")),
           ("TPOT p50 s", ("latency_s", "tpot", "p50")), ("TPOT p99 s", ("latency_s", "tpot", "p99")),
           ("out tok/s", ("throughput", "output_tokens_per_s")),
           ("req/s", ("throughput", "requests_per_s")),
           ("preempted reqs", ("requests", "preempted_at_least_once")))

DESCRIPTION = """Run the same workload on kvsim's scheduler and on vLLM's own (engine.backend vllm,
same cost model) and compare their step traces: prints "identical" or the first step where
they diverge with both sides' decisions, the end-to-end metrics of both, and how much
slower vLLM's scheduler loop is. Without --case the config (YAML / --set) runs as given;
with --case, one of the parity matrix's workloads (--seeds seeds each, --num-requests
requests). Exit status 0 when every run is identical, 1 otherwise. Needs the vllm extra
(docs/parity.md)."""

EPILOG = """examples:
  kvsim parity --case all --seeds 3
  kvsim parity my.yaml --set workload.num_requests=300 --trace-dir runs/parity"""


def register(sub, help: str) -> None:
    p = sub.add_parser("parity", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("config", nargs="?", help="YAML config (default: built-in)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (as kvsim run)")
    p.add_argument("--case", help="a parity workload: fcfs-nocache, fcfs-cache, priority-nocache, "
                                  "priority-cache (async scheduling, vLLM's default), "
                                  "fcfs-nocache-sync, fcfs-cache-sync, priority-nocache-sync, "
                                  "priority-cache-sync (synchronous); or all")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--seeds", type=int, default=1, metavar="N", help="seeds per case (default 1)")
    p.add_argument("--num-requests", type=int, default=500, metavar="N",
                   help="requests per --case run (default 500)")
    p.add_argument("--trace-dir", metavar="DIR",
                   help="write both step traces of every run here (JSONL)")
    p.add_argument("--json", dest="json_out", metavar="FILE", help="write the results as JSON")
    p.set_defaults(func=main)


def _get(summary: dict, path: tuple[str, ...]):
    for key in path:
        summary = summary.get(key) if isinstance(summary, dict) else None
    return summary


def _configs(args) -> list:
    """(case, seed, SimConfig) of every run, all built (and so validated) before the first runs."""
    from simulator.analysis.parity import CASES, case_config
    from simulator.config.schema import build_config

    if args.case is None:
        return [("config", args.seed, build_config(args.config, args.overrides, {"seed": args.seed}))]
    if args.config:
        raise ConfigError("kvsim parity: give a CONFIG or --case, not both")
    if args.case != "all" and args.case not in CASES:
        raise ConfigError(f"--case {args.case!r}: unknown; valid: {', '.join(CASES)}, all")
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be an integer >= 1, got {args.seeds}")
    if args.num_requests < 1:
        raise ConfigError(f"--num-requests must be an integer >= 1, got {args.num_requests}")
    cases = list(CASES) if args.case == "all" else [args.case]
    return [(case, seed, case_config(case, seed, args.num_requests, args.overrides))
            for case in cases for seed in range(args.seed, args.seed + args.seeds)]


def main(args) -> int:
    import json

    from simulator.analysis.parity import run_pair
    from simulator.backends.vllm import VLLM_VERSION, import_vllm, vllm_version

    runs = _configs(args)
    check_out_dir(args.trace_dir, "--trace-dir")
    check_out_file(args.json_out, "--json")
    import_vllm()  # a missing vLLM: one line on how to install the extra
    console = make_console()
    console.print(f"vLLM {vllm_version()} (parity verified against {VLLM_VERSION}); "
                  "AsyncScheduler (async cases, two batches in flight) and sync Scheduler (-sync)",
                  highlight=False)
    rows, all_identical = [], True
    total = {"kvsim": 0.0, "vllm": 0.0}
    for case, seed, config in runs:
        pair = run_pair(config)
        walls = {b: pair.results[b].wall_s for b in ("kvsim", "vllm")}
        for b in total:
            total[b] += walls[b]
        n_steps = len(pair.traces["kvsim"]), len(pair.traces["vllm"])
        verdict = pair.describe_divergence()
        all_identical &= pair.identical
        ratio = walls["vllm"] / max(walls["kvsim"], 1e-9)
        console.print(f"{case} seed {seed}: {n_steps[0]} / {n_steps[1]} steps (kvsim / vllm), "
                      f"{verdict}; loop wall kvsim {walls['kvsim']:.2f} s, vllm "
                      f"{walls['vllm']:.2f} s (vllm / kvsim {ratio:.1f}x)", highlight=False)
        if args.trace_dir:
            from simulator.engine.steptrace import StepTrace
            for b in ("kvsim", "vllm"):
                t = StepTrace()
                t.rows = pair.traces[b]
                t.write(Path(args.trace_dir) / f"{case}-seed{seed}-{b}.jsonl")
        rows.append(_row(case, seed, pair, walls))
    if len(rows) > 0:
        _print_metrics(console, rows)
    if total["kvsim"] > 0:
        console.print(f"simulation loop wall time: kvsim {total['kvsim']:.2f} s, vllm "
                      f"{total['vllm']:.2f} s; vllm / kvsim = {total['vllm'] / total['kvsim']:.1f}x",
                      highlight=False)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"vllm_version": vllm_version(), "runs": rows},
                                                  indent=2, sort_keys=True) + "\n")
    return 0 if all_identical else 1


def _row(case: str, seed: int, pair, walls: dict[str, float]) -> dict:
    return {"case": case, "seed": seed, "identical": pair.identical,
            "divergence": None if pair.identical else list(pair.divergence),
            "steps": {b: len(pair.traces[b]) for b in ("kvsim", "vllm")},
            "wall_s": walls,
            "metrics": {b: {name: _get(pair.summaries[b], path) for name, path in METRICS}
                        for b in ("kvsim", "vllm")}}


def _print_metrics(console, rows: list[dict]) -> None:
    from rich.table import Table

    table = Table(title="end-to-end metrics, kvsim | vllm (same cost model)")
    table.add_column("case / seed")
    for name, _ in METRICS:
        table.add_column(name, justify="right")
    for r in rows:
        cells = []
        for name, _ in METRICS:
            a, b = r["metrics"]["kvsim"][name], r["metrics"]["vllm"][name]
            fmt = (lambda v: "-" if v is None else f"{v:.4g}")
            cells.append(fmt(a) if a == b else f"{fmt(a)} | {fmt(b)}")
        table.add_row(f"{r['case']} / {r['seed']}", *cells)
    console.print(table)
