"""`kvsim` command line. Each subcommand lives in its own module exposing `register(sub)`;
add a new one to SUBCOMMANDS. ConfigError -> one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import importlib
import sys

from simulator import __version__
from simulator.errors import ConfigError

SUBCOMMANDS = ["simulator.cli.run", "simulator.cli.workload", "simulator.cli.plot",
               "simulator.cli.report", "simulator.cli.calibrate", "simulator.cli.profile",
               "simulator.cli.parity", "simulator.cli.sweep", "simulator.cli.plan",
               "simulator.cli.regress", "simulator.cli.experiment"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvsim", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"kvsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        print(f"kvsim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
