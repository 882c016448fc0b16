"""`kvsim sweep [CONFIG.yaml] --grid key=v1,v2,... [--grid ...] [--seeds N] [--workers K]
[--backend local|ray [--address HOST:PORT]] [--out DIR] [--metric M --x KEY --y KEY]`

Runs the cartesian product of the grid (any key `--set` accepts) x seeds, one task per
(point, seed). Writes OUT/points/<hash>.json per task as it finishes (a rerun skips them),
OUT/sweep.parquet and OUT/sweep.csv (one row per point) and OUT/sweep_<metric>.png (a heatmap
over two grid keys, or a line plot over one). A config file may hold the grid itself:
`sweep: {grid: {engine.block_size: [16, 32]}, seeds: 2}`."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from simulator.cli.common import add_worker_args, check_out_dir, make_console
from simulator.errors import ConfigError, did_you_mean

DESCRIPTION = """Run a grid of configs - the cartesian product of every --grid axis (any key that
--set accepts) times the seeds - in parallel, one task per point and seed. Each finished task
is kept in OUT/points/, so a rerun of the same command resumes where it stopped. Writes
OUT/sweep.parquet and OUT/sweep.csv (one row per point, every summary metric) and a heatmap
over two grid keys or a line plot over one (OUT/sweep_<metric>.png). A config file may hold
the grid itself: `sweep: {grid: {engine.block_size: [16, 32]}, seeds: 2}`."""

EPILOG = """examples:
  kvsim sweep --grid engine.block_size=16,32,64 --grid workload.arrival.rate=5,10,20 --workers 2
  kvsim sweep my.yaml --grid engine.max_num_seqs=64,128,256 --seeds 3 --metric latency_s.e2e.p99"""

# (metric, column title) printed in the table; every metric is in the files
SHOWN = (("throughput.requests_per_s", "req/s"), ("throughput.output_tokens_per_s", "out tok/s"),
         ("latency_s.ttft.p99", "TTFT p99 ms"), ("latency_s.tpot.p99", "TPOT p99 ms"),
         ("kv_cache.usage_mean", "KV use"), ("preemptions.total", "preempt"),
         ("slo.share", "SLO share"))


def register(sub, help: str) -> None:
    p = sub.add_parser("sweep", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("config", nargs="?", help="base YAML config (may hold a sweep: section)")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a grid axis, e.g. --grid engine.block_size=16,32,64 (repeatable)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a base config field for every point")
    p.add_argument("--seeds", type=int, default=None, metavar="N",
                   help="seeds per point (seed, seed+1, ...); > 1 adds 95%% intervals")
    add_worker_args(p)
    p.add_argument("--out", default="runs/sweep", metavar="DIR", help="output directory (default runs/sweep)")
    p.add_argument("--retry-failed", action="store_true", help="rerun points recorded as errors")
    p.add_argument("--metric", default="latency_s.ttft.p99", help="metric to plot (a table column)")
    p.add_argument("--x", default=None, help="plot x axis (default: the first grid key)")
    p.add_argument("--y", default=None, help="plot y axis / line groups (default: the second key)")
    p.add_argument("--plot-kind", default="auto", choices=["auto", "heatmap", "line"])
    p.add_argument("--quiet", action="store_true", help="no progress bar, no table")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    import json

    from simulator.analysis.sweep import build_table, execute, load_sweep, make_tasks, plot_sweep, write_table

    if args.workers < 1:
        raise ConfigError(f"--workers must be an integer >= 1, got {args.workers}")
    check_out_dir(args.out, "--out")
    spec = load_sweep(args.config, args.grid, args.seeds, args.overrides)
    keys = list(spec.grid)
    x = args.x or keys[0]
    y = args.y if args.y is not None else (keys[1] if len(keys) > 1 else None)
    for k in (x, y):
        if k is not None and k not in keys:
            raise ConfigError(f"plot axis {k!r} is not a grid key; grid keys: {', '.join(keys)}")
    tasks = make_tasks(spec.base, spec.grid, spec.seeds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(
        {"base": spec.base, "grid": spec.grid, "seeds": spec.seeds}, indent=1, sort_keys=True,
        default=str) + "\n")
    err = make_console(stderr=True)
    t0 = time.perf_counter()
    outcome = execute(tasks, out, workers=args.workers, backend=args.backend, address=args.address,
                      retry_failed=args.retry_failed, progress=not args.quiet, console=err)
    wall = time.perf_counter() - t0
    df = build_table(tasks, outcome.records)
    pq, csv = write_table(df, out)
    png, note = None, None
    if args.metric not in df:
        metrics = [c for c in df.columns if c not in keys and not c.endswith(".ci95")]
        note = (f"note: no plot: --metric {args.metric} is not a column of the table"
                f"{did_you_mean(args.metric, metrics)}")
    elif (df.status != "missing").any() and df[args.metric].notna().any():
        png = plot_sweep(df, args.metric, x, y, out / f"sweep_{args.metric}.png", args.plot_kind)
    n_points = len(df)
    msg = (f"{n_points} points x {len(spec.seeds)} seeds: {outcome.done} run now "
           f"({outcome.failed} failed), {outcome.skipped} already done; {wall:.1f} s wall "
           f"with {args.workers} worker(s) on {args.backend}")
    if args.quiet:
        print(out)
    else:
        con = make_console()
        print_table(con, df, keys)
        con.print(msg, highlight=False)
        if outcome.stale:
            con.print(f"note: {outcome.stale} reused runs were made by a different version of "
                      f"the simulator's code; delete {out}/points to recompute them",
                      style="yellow", highlight=False)
        for _, r in df[df.status == "error"].iterrows():
            con.print(f"error at {', '.join(f'{k}={r[k]}' for k in keys)}: {r['error']}",
                      style="red", highlight=False)
        con.print(f"wrote {pq}, {csv}" + (f", {png}" if png else "")
                  + f" and {out}/points/ (one JSON per run; rerun to resume)", highlight=False)
    if note:
        err.print(note, style="yellow", highlight=False)
    if outcome.interrupted:
        err.print(f"interrupted: {sum(1 for r in outcome.records.values())} of {len(tasks)} runs "
                  f"are on disk in {out}/points; rerun the same command to resume", highlight=False)
        return 130
    # NOTE: a point that failed fails the command (a CI step must see it); the others are written
    return 1 if (df.status == "error").any() else 0


def print_table(console, df, keys: list[str]) -> None:
    from rich.table import Table

    from simulator.analysis.sweep import metric_label

    table = Table(title="sweep (one row per point; mean over seeds)", title_justify="left")
    for k in keys:
        table.add_column(k.rsplit(".", 1)[-1], justify="right")
    shown = [(m, t) for m, t in SHOWN if m in df]
    for _, t in shown:
        table.add_column(t, justify="right")
    table.add_column("status")
    for _, r in df.iterrows():
        cells = [str(r[k]) for k in keys]
        for m, _ in shown:
            v = r[m]
            scale = metric_label(m)[0]
            if v is None or v != v:
                cells.append("-")
            else:
                ci = r.get(f"{m}.ci95")
                s = _fmt(v * scale)
                cells.append(s if ci is None or ci != ci else f"{s} ± {_fmt(ci * scale)}")
        cells.append(r["status"])
        table.add_row(*cells)
    console.print(table)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"
