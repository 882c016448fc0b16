"""What every command shares: the console (wide when piped), output-path checks made before any
work, paths shown as the user knows them, and the rejections table.

NOTE: this module and every command module import only the standard library at module level,
so that building the whole parser (`kvsim --help`, `kvsim run --help`) stays under ~50 ms;
rich, numpy, pandas and the engine are imported inside the functions that use them
(tests/test_cli_imports.py holds the list of what must not be imported).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError

PIPE_WIDTH = 200  # columns of a console that is not a terminal (logs, pipes, CI)


def add_worker_args(p: argparse.ArgumentParser) -> None:
    """--workers / --backend / --address: how sweep and plan run their simulations."""
    p.add_argument("--workers", type=int, default=1, metavar="K", help="parallel workers (default 1)")
    p.add_argument("--backend", default="local", choices=["local", "ray"],
                   help="local (process pool, default) or ray")
    p.add_argument("--address", default=None,
                   help="Ray cluster address (host:port); default: a local Ray instance")


def make_console(stderr: bool = False):
    """A rich Console. On a terminal it follows the terminal's width; piped or logged it is
    PIPE_WIDTH wide and never wraps a plain line (rich's own default there is 80 columns).
    A reader that leaves (`kvsim run | head`) is `quiet_on_broken_pipe`: the command goes on."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            quiet_on_broken_pipe(self)

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return PipeConsole(stderr=stderr)
    return PipeConsole(stderr=stderr, width=PIPE_WIDTH, soft_wrap=True)


def quiet_on_broken_pipe(console) -> None:
    """The reader of `console`'s stream left (`kvsim run | head -3`): the console prints
    nothing more, its stream's descriptor goes to /dev/null (what Python still holds for it is
    written there) and the command goes on to its end, its files written and its exit status
    its own. rich's own Console exits with status 1 here, before the command's work is done."""
    console.quiet = True
    to_devnull(console.file)


def to_devnull(stream) -> None:
    """`stream`'s file descriptor now writes to /dev/null (its reader left: what is still
    written or flushed to it raises no second error); nothing for a stream without one."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # (not a file with a descriptor)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def say(text: str, **kwargs: Any) -> None:
    """Print one plain line to stdout and flush it, so a pipe shows it at once."""
    print(text, **kwargs)
    sys.stdout.flush()


class HelpFormatter(argparse.HelpFormatter):
    """Descriptions and epilogs: a paragraph of prose is wrapped to the terminal; a block whose
    lines are indented (examples, the command table) is kept as written. Never wraps at a hyphen
    (--num-requests, priority-cache and llama-3.1-8b stay whole)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in text.strip("\n").split("\n\n"):
            lines = block.splitlines()
            if any(line.startswith(" ") for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(textwrap.fill(" ".join(line.strip() for line in lines), width,
                                            initial_indent=indent, subsequent_indent=indent,
                                            break_on_hyphens=False))
        return "\n\n".join(blocks)


class Parser(argparse.ArgumentParser):
    """argparse with HelpFormatter, and a usage error in one line (argparse prints the whole
    usage block first). Every command's parser is one (subparsers take the parent's class)."""

    commands: dict[str, argparse.ArgumentParser]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.commands = {}

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


# -- output paths, checked before any work -----------------------------------------------------------

def _writable(folder: Path) -> bool:
    return os.access(folder, os.W_OK | os.X_OK)


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_creatable(path: Path, flag: str) -> None:
    """`path` does not exist: its nearest existing ancestor must be a writable folder."""
    anc = _nearest_existing(path)
    if not anc.is_dir():
        raise ConfigError(f"{flag} {path}: cannot be created, {anc} is a file, not a folder")
    if not _writable(anc):
        raise ConfigError(f"{flag} {path}: cannot be created, folder {anc} is not writable")


def check_out_dir(path: str | Path | None, flag: str = "--out") -> None:
    """Refuse, with one line, an output folder that is an existing file or cannot be written."""
    if path is None:
        return
    if not str(path).strip():  # (Path("") is the current folder: the outputs would land there)
        raise ConfigError(f"{flag}: empty; give a folder for the outputs")
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            raise ConfigError(f"{flag} {p}: is an existing file; give a folder for the outputs")
        if not _writable(p):
            raise ConfigError(f"{flag} {p}: folder is not writable")
        return
    _check_creatable(p, flag)


def check_out_file(path: str | Path | None, flag: str = "--out") -> None:
    """Refuse, with one line, an output file that is an existing folder or cannot be written."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag} {p}: is a folder; give a file name")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise ConfigError(f"{flag} {p}: file is not writable")
        return
    _check_creatable(p, flag)


def check_in_file(path: str | Path, what: str) -> Path:
    """An input file that must exist (one line otherwise)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} {p}: not found")
    if p.is_dir():
        raise ConfigError(f"{what} {p}: is a folder, expected a file")
    return p


def check_in_dir(path: str | Path, what: str) -> Path:
    """An input folder that must exist (one line otherwise)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{what} {p}: not found")
    if not p.is_dir():
        raise ConfigError(f"{what} {p}: not a folder")
    return p


# -- paths as the user knows them ---------------------------------------------------------------------

def display_path(path: str | Path) -> str:
    """A packaged file as `workloads/sample.yaml` (not its site-packages path), a file under the
    current folder relative to it, anything else as it is."""
    from simulator.config.paths import data_dir

    p = Path(path)
    try:
        absolute = p.resolve()
    except OSError:
        return str(path)
    for name in ("workloads", "gpu_profiles"):
        try:
            return f"{name}/{absolute.relative_to(data_dir(name).resolve()).as_posix()}"
        except ValueError:
            pass
    if p.is_absolute():
        try:
            return absolute.relative_to(Path.cwd().resolve()).as_posix()
        except ValueError:
            pass
    return str(path)


# -- rejections ---------------------------------------------------------------------------------------

_NUMBER = re.compile(r"\d+")


def group_reasons(by_reason: dict[str, int]) -> list[tuple[str, int]]:
    """summary `rejected_by_reason` ({"prompt+output 5020 > max_model_len 4096": 3, ...}) grouped by
    the kind of reason, numbers out: each group's numbers shown as the one value they all share or
    as their range. [("prompt+output 4,110..9,830 > max_model_len 4,096", 37), ...], most first."""
    groups: dict[str, tuple[int, list[list[int]]]] = {}
    for reason, count in by_reason.items():
        kind = _NUMBER.sub("#", reason)
        total, numbers = groups.get(kind, (0, []))
        numbers.append([int(n) for n in _NUMBER.findall(reason)])
        groups[kind] = (total + int(count), numbers)
    rows = []
    for kind, (count, numbers) in groups.items():
        columns = list(zip(*numbers))
        parts = kind.split("#")
        text = parts[0]
        for values, part in zip(columns, parts[1:]):
            lo, hi = min(values), max(values)
            text += f"{lo:,}" if lo == hi else f"{lo:,}..{hi:,}"
            text += part
        rows.append((text, count))
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def rejections_table(by_reason: dict[str, int]):
    """A rich Table: reason (numbers as their range), count."""
    from rich.table import Table

    table = Table(title="rejected requests", title_justify="left")
    table.add_column("reason")
    table.add_column("count", justify="right")
    for text, count in group_reasons(by_reason):
        table.add_row(text, f"{count:,}")
    return table
