"""`kvsim`: the command line. COMMANDS names each command and what it does for its user; the
command lives in simulator/cli/<name>.py, whose `register(sub, help)` adds its options and whose
`main(args)` runs it. Command modules import only the standard library at module level (the
engine, pandas, matplotlib, rich only inside `main`), so `kvsim --help` and every
`kvsim COMMAND --help` answer at once. Bad input (ConfigError) or a path that cannot be read or
written (OSError) -> one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import os
import sys
import threading
import warnings

from simulator import __version__
from simulator.cli.common import Parser, to_devnull
from simulator.errors import ConfigError, did_you_mean

# NOTE: pydantic looks for its plug-ins (entry points of every installed distribution: ~50 ms
# of a run's start-up in a large environment) when the first config model is built; the
# command line uses none. Set by the user (e.g. to a plug-in list), it is left as it is.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
# NOTE: OpenBLAS (numpy's BLAS) splits a dot product of > 10,000 elements over its threads, and
# each worker then spins for ~2^28 cycles (~0.1 s) before it sleeps. A run's few such products
# (the summary's time weighting) are far apart: the spinning was ~0.7 s of CPU time in a W1
# run (14 %), on a core the iterations.parquet writer or another process could use. 2^4
# cycles: the workers sleep at once. The thread count and each product's split, hence every
# figure, are unchanged. Read when numpy is first imported (after this); a user's value is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

# command -> one line for `kvsim --help`, in the order a new user needs them
COMMANDS = {
    "run": "simulate serving a workload: latency, throughput, KV-cache use",
    "workload": "look at a trace or workload YAML: rate, lengths, sessions, a plot",
    "report": "write one self-contained HTML page of a run, to share",
    "plot": "draw the PNG plots of a run",
    "sweep": "run a grid of configs in parallel and compare them",
    "plan": "find the cheapest GPU x tensor-parallel x replicas for a rate and SLO",
    "regress": "check simulated figures against a committed baseline (CI)",
    "parity": "compare kvsim's scheduler with vLLM's own, step by step",
    "experiment": "rerun an experiment that checks a published claim",
    "calibrate": "fit a GPU's cost model to measured kernel timings",
    "profile": "measure a model's kernel timings on this machine (needs torch)",
}

DESCRIPTION = """Simulate LLM serving with vLLM's scheduling and KV-cache semantics, without a GPU:
the latency, throughput and memory a model, GPU and workload give, in seconds."""

EPILOG = """common invocations:
  kvsim run                                  the built-in example: Llama-3.1-8B on an H100
  kvsim run my.yaml --set workload.arrival.rate=20 --out runs/r20
  kvsim report runs/r20                      an HTML page of that run

`kvsim COMMAND --help` shows a command's options and examples."""


def _commands_text() -> str:
    width = max(map(len, COMMANDS)) + 2
    return "commands:\n" + "\n".join(f"  {name:<{width}}{line}" for name, line in COMMANDS.items())


def build_parser() -> argparse.ArgumentParser:
    """The whole parser, every command's options included (command modules are light)."""
    parser = Parser(prog="kvsim", usage="kvsim [-h] [--version] COMMAND ...",
                    description=f"{DESCRIPTION}\n\n{_commands_text()}", epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"kvsim {__version__}")
    parser.set_defaults(func=None)
    # NOTE: the command list is the description above; argparse's own would print a bare
    # "COMMAND" line and wrap the help of the longer command names
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=argparse.SUPPRESS, prog="kvsim")
    for name, help_line in COMMANDS.items():
        importlib.import_module(f"simulator.cli.{name}").register(sub, help_line)
    parser.commands = sub.choices
    return parser


# NOTE: a command's start-up makes long-lived objects (modules, pydantic's schemas and
# validators, dataclasses): at the default threshold (700 allocations) the cyclic collector made
# ~100 young passes and one full pass over them, ~33 ms of a `kvsim run` (gc.callbacks, W1).
# While a command runs, the young generation is collected every _GC_GEN0 allocations (a run's
# simulation raises it further, replica.run_env); the thresholds are put back when it returns.
_GC_GEN0 = 50_000


def entry() -> None:
    """The `kvsim` executable (the console script and `python -m simulator`): main(), then the
    process ends as the interpreter's exit would, less its teardown (`_end_process`)."""
    _end_process(main())


def _end_process(code: int) -> None:
    """End the process with exit status `code` after the steps of an interpreter exit that the
    outside world sees: threads that are not daemons joined, with the threading atexit calls
    before (threading._shutdown: an executor's workers), the atexit functions (a sweep's worker
    pool or Ray stopped, temporary folders removed, logging flushed), stdout and stderr
    flushed; then os._exit. Skipped: the teardown that frees every module and object one by
    one, which the end of the process does at once: from a W1 `kvsim run`'s return to the
    process's end 70-128 ms, 14-17 ms with this (5 runs each).
    mypy ends its command line the same way (mypy.util.hard_exit).
    NOTE: only where nothing runs after the command: tests call main(), which returns; under
    a profiler, a tracer (coverage, a debugger) or `python -i` the process exits as usual, so
    that what they write or do after the module has run still happens."""
    shutdown, run_exitfuncs = getattr(threading, "_shutdown", None), getattr(atexit, "_run_exitfuncs", None)
    if (shutdown is None or run_exitfuncs is None  # (another Python: its own exit)
            or sys.getprofile() is not None or sys.gettrace() is not None or sys.flags.interactive
            or "coverage" in sys.modules):
        sys.exit(code)
    shutdown()
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # (a descriptor closed when the process started: `kvsim ... >&-`)
            continue
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left (`kvsim ... | head`), or closed
            pass
        except OSError:  # output lost (a full disk): the status Python's exit gives
            code = code or 120
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    thresholds = gc.get_threshold()
    gc.set_threshold(_GC_GEN0, *thresholds[1:])
    try:
        return _main(argv)
    finally:
        gc.set_threshold(*thresholds)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        parser.error(f"unknown command {argv[0]!r}{did_you_mean(argv[0], list(COMMANDS))}; "
                     f"commands: {', '.join(COMMANDS)}")
    args, extra = parser.parse_known_args(argv)
    if extra:  # named by the command's own parser, so its --help is the one suggested
        parser.commands.get(args.command, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.func is None:
        parser.print_help()
        return 2
    # NOTE: a warning is one line, as an error is (Python prints its source file and line too)
    warnings.formatwarning = lambda message, category, *_, **__: f"kvsim: warning: {message}\n"
    try:
        return int(args.func(args) or 0)
    except ConfigError as e:
        sys.stdout.flush()
        print(f"kvsim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kvsim ... | head`: the reader left; not an error of ours
        to_devnull(sys.stdout)  # (no second error at exit)
        return 0
    except MemoryError as e:  # a setting that asks for more than the machine has (a 1e12 count)
        sys.stdout.flush()
        why = f" ({e})" if str(e) else ""
        print(f"kvsim: error: out of memory{why}; a setting asks for more than this machine "
              f"holds (a count, a size or a number of replicas): lower it", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be read or written (/proc/x, a full disk): one line
        sys.stdout.flush()
        where = f"{e.filename}: " if e.filename else ""
        print(f"kvsim: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    entry()
