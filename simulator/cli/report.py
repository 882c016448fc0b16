"""`kvsim report RUN_DIR [--out FILE]`: one self-contained HTML page (config, summary,
alerts, plots embedded) for a capacity review; see simulator/report/html.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.report.html import write_report


def register(sub) -> None:
    p = sub.add_parser("report", help="write a self-contained HTML report of a run directory",
                       description=__doc__)
    p.add_argument("run_dir", help="a directory written by `kvsim run --out`")
    p.add_argument("--out", help="output file (default RUN_DIR/report.html)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print(write_report(Path(args.run_dir), args.out))
    return 0
