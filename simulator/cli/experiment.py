"""`kvsim experiment NAME [ARGS...]` runs experiments/NAME.py (ARGS go to the experiment, e.g.
--requests 200), which writes experiments/results/NAME.md and NAME.png. `kvsim experiment
--list` lists them with their claims. docs/experiments.md describes each."""

from __future__ import annotations

import argparse

from simulator.cli.common import make_console

DESCRIPTION = """Rerun an experiment that checks a published claim (e.g. "paged attention admits
more concurrent requests than contiguous reservation"): experiments/NAME.py runs its
simulations and writes experiments/results/NAME.md and NAME.png. Arguments after NAME go to
the experiment (e.g. --requests 200). docs/experiments.md describes each."""

EPILOG = """examples:
  kvsim experiment --list
  kvsim experiment static_vs_continuous --requests 200"""


def register(sub, help: str) -> None:
    p = sub.add_parser("experiment", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("name", nargs="?", help="experiment name (experiments/NAME.py)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the experiment")
    p.add_argument("--list", action="store_true", help="list the experiments and their claims")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from simulator.analysis.experiments import get_experiment, list_experiments, run_experiment

    if args.list or not args.name:
        console = make_console()
        for name in list_experiments():
            doc = (get_experiment(name).__doc__ or "").strip().splitlines()
            console.print(f"[bold]{name}[/bold]: {doc[0] if doc else ''}", highlight=False)
        return 0
    return run_experiment(args.name, list(args.args))
