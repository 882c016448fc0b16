"""`python -m simulator` is the `kvsim` command."""

import sys

from simulator.cli.main import main

sys.exit(main())
