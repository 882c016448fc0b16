"""`python -m simulator` is the `kvsim` command."""

from simulator.cli.main import entry

entry()
