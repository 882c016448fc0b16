"""`kvsim regress [--suite DIR] [--baseline FILE] [--update] [--junit FILE] [--set KEY=VALUE]`

Runs every scenario of the suite (default: regress/), compares each chosen metric with the
baseline (default: SUITE/baseline.json) under its tolerance and direction, prints the diff
table and exits 1 when a metric regressed or has no baseline value (0 otherwise, 2 on bad
input). --update rewrites the baseline from this run (review the diff before committing).
--set applies an override to every simulation of the suite, e.g. to see what a change would do.
docs/regress.md describes the files and how to wire this into CI."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.cli.common import check_out_file, make_console
from simulator.errors import ConfigError

if TYPE_CHECKING:
    from simulator.analysis.regress import Outcome

STYLE = {"ok": "green", "improved": "cyan", "regressed": "bold red", "new": "yellow"}

DESCRIPTION = """Check simulated figures against a committed baseline, as a CI step: runs every
scenario of the suite (default: regress/), compares each chosen metric with the baseline
(default: SUITE/baseline.json) under its tolerance and direction, and prints the diff
table. Exit status 1 when a metric regressed or has no baseline value, 0 otherwise, 2 on
bad input. --update rewrites the baseline from this run (review the diff before committing);
--set applies an override to every simulation of the suite, to see what a change would do.
docs/regress.md describes the files and how to wire this into CI."""

EPILOG = """examples:
  kvsim regress --quiet
  kvsim regress --set engine.block_size=32            what would this change do?
  kvsim regress --update                              accept the new figures"""


def register(sub, help: str) -> None:
    p = sub.add_parser("regress", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--suite", default="regress", help="folder of scenario YAMLs, or one file "
                   "(default: regress)")
    p.add_argument("--baseline", default=None, metavar="FILE",
                   help="baseline JSON (default: SUITE/baseline.json)")
    p.add_argument("--update", action="store_true", help="rewrite the baseline from this run")
    p.add_argument("--junit", default=None, metavar="FILE", help="write JUnit XML for CI")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every simulation of the suite")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run only this scenario (repeatable)")
    p.add_argument("--quiet", action="store_true", help="print the failures and the total only")
    p.set_defaults(func=main)


def default_baseline(suite: str | Path) -> Path:
    suite = Path(suite)
    return (suite if suite.is_dir() else suite.parent) / "baseline.json"


def main(args: argparse.Namespace) -> int:
    from simulator.analysis.regress import load_baseline, load_suite, run_suite, write_baseline, write_junit

    check_out_file(args.junit, "--junit")
    scenarios = load_suite(args.suite)
    if args.only:
        names = {s.name for s in scenarios}
        for n in args.only:
            if n not in names:
                raise ConfigError(f"--only {n}: no such scenario; valid: {', '.join(sorted(names))}")
        scenarios = [s for s in scenarios if s.name in args.only]
    baseline_path = Path(args.baseline) if args.baseline else default_baseline(args.suite)
    if args.update:
        check_out_file(baseline_path, "--baseline")
    baseline = None
    if not args.update or baseline_path.is_file():
        baseline = load_baseline(baseline_path) if not args.update else _try_load(baseline_path)
    console = make_console()  # CI logs are not terminals: wide, so the metric names stay whole
    err = make_console(stderr=True)

    def progress(s, wall):
        if not args.quiet:
            err.print(f"[dim]ran {s.name} ({wall:.1f} s)[/dim]")

    outcome = run_suite(scenarios, baseline, args.overrides, progress)
    if not (args.update and args.quiet):  # an update is deliberate: its table is noise when quiet
        print_table(console, outcome, quiet=args.quiet)
    if args.junit:
        write_junit(outcome, args.junit)
        console.print(f"wrote {args.junit}")
    if args.update:
        values = dict(baseline or {}) if args.only else {}
        values.update(outcome.values)
        write_baseline(baseline_path, values)
        console.print(f"updated {baseline_path} ({sum(len(v) for v in outcome.values.values())} "
                      f"metrics from {len(outcome.values)} scenarios)")
        return 0
    n_bad = len(outcome.failed)
    summary = (f"{len(outcome.checks)} metrics in {len(outcome.values)} scenarios, "
               f"{outcome.wall_s:.1f} s: "
               + ", ".join(f"{sum(c.status == k for c in outcome.checks)} {k}" for k in STYLE))
    if n_bad:
        console.print(f"[bold red]REGRESSION[/bold red] {summary}")
        for c in outcome.failed:
            console.print(f"  {c.message()}", highlight=False)
        return 1
    console.print(f"[green]pass[/green] {summary}")
    return 0


def _try_load(path: Path):
    """--update over a baseline of another schema rewrites it rather than failing."""
    from simulator.analysis.regress import load_baseline

    try:
        return load_baseline(path)
    except ConfigError:
        return None


def print_table(console, outcome: Outcome, quiet: bool = False) -> None:
    from rich.table import Table

    from simulator.analysis.regress import allowed_text, change_text, fmt

    if quiet and not outcome.failed:
        return
    table = Table(title="kvsim regress", show_lines=False)
    for col, just in (("scenario", "left"), ("metric", "left"), ("baseline", "right"),
                      ("current", "right"), ("change", "right"), ("allowed", "left"),
                      ("status", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for c in outcome.checks:
        if quiet and not c.failed:
            continue
        tol = c.metric.tolerance(c.baseline) if c.baseline is not None else 0.0
        style = STYLE[c.status]
        table.add_row(c.scenario, c.metric.path, fmt(c.baseline) if c.status != "new" else "-",
                      fmt(c.value),
                      change_text(c.value, c.baseline),
                      f"{c.metric.better}: {allowed_text(c.metric, tol)}" if c.baseline is not None
                      else "-", f"[{style}]{c.status}[/{style}]")
    if outcome.stale:
        console.print(f"[dim]baseline scenarios not in the suite (dropped by --update): "
                      f"{', '.join(outcome.stale)}[/dim]")
    console.print(table)
