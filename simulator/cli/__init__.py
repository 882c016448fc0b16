"""The `kvsim` command line: main.py parses, and each command lives in its own module, imported
only when that command runs."""
