"""`kvsim plot RUN_DIR [--out DIR]`: PNG plots of a run directory (see simulator/report/plots.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.cli.common import check_out_dir

DESCRIPTION = """Draw the PNG plots of a run directory: latency distributions, KV-cache use, queue
and batch size over time, and per-tier latency when priorities differ. For a directory of
several seeds (`kvsim run --seeds N`) the first seed is plotted."""


def register(sub, help: str) -> None:
    p = sub.add_parser("plot", help=help, description=DESCRIPTION)
    p.add_argument("run_dir", help="a directory written by `kvsim run --out`")
    p.add_argument("--out", metavar="DIR", help="output directory (default RUN_DIR/plots)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from simulator.report.plots import first_seed_dir, plot_run

    run_dir = Path(args.run_dir)
    check_out_dir(args.out, "--out")
    seed_dir = first_seed_dir(run_dir)
    if seed_dir is not None:
        print(f"{run_dir} holds several seeds; plotting the first, {seed_dir.name}")
        run_dir = seed_dir
    for path in plot_run(run_dir, args.out):
        print(path)
    return 0
