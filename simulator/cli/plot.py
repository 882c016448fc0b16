"""`kvsim plot RUN_DIR [--out DIR]`: PNG plots of a run directory (see simulator/report/plots.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.report.plots import first_seed_dir, plot_run


def register(sub) -> None:
    p = sub.add_parser("plot", help="plot a run directory (PNG)", description=__doc__)
    p.add_argument("run_dir", help="a directory written by `kvsim run --out`")
    p.add_argument("--out", help="output directory (default RUN_DIR/plots)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    seed_dir = first_seed_dir(run_dir)
    if seed_dir is not None:
        print(f"{run_dir} holds several seeds; plotting the first, {seed_dir.name}")
        run_dir = seed_dir
    for path in plot_run(run_dir, args.out):
        print(path)
    return 0
