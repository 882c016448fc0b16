"""`kvsim report RUN_DIR [--out FILE]`: one self-contained HTML page (config, summary,
alerts, plots embedded) for a capacity review; see simulator/report/html.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.cli.common import check_out_file

DESCRIPTION = """Write one self-contained HTML page of a run directory (its config, summary,
alerts and plots, embedded), to attach to a capacity review or share."""


def register(sub, help: str) -> None:
    p = sub.add_parser("report", help=help, description=DESCRIPTION)
    p.add_argument("run_dir", help="a directory written by `kvsim run --out`")
    p.add_argument("--out", metavar="FILE", help="output file (default RUN_DIR/report.html)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from simulator.report.html import write_report

    check_out_file(args.out, "--out")
    print(write_report(Path(args.run_dir), args.out))
    return 0
