"""`kvsim experiment NAME [ARGS...]` runs experiments/NAME.py (ARGS go to the experiment, e.g.
--requests 200), which writes experiments/results/NAME.md and NAME.png. `kvsim experiment
--list` lists them with their claims. docs/experiments.md describes each."""

from __future__ import annotations

import argparse

from rich.console import Console

from simulator.analysis.experiments import get_experiment, list_experiments, run_experiment


def register(sub) -> None:
    p = sub.add_parser("experiment", help="run an experiment that checks a published claim",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="experiment name (experiments/NAME.py)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the experiment")
    p.add_argument("--list", action="store_true", help="list the experiments")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.list or not args.name:
        console = Console()
        for name in list_experiments():
            doc = (get_experiment(name).__doc__ or "").strip().splitlines()
            console.print(f"[bold]{name}[/bold]: {doc[0] if doc else ''}", highlight=False)
        return 0
    return run_experiment(args.name, list(args.args))
