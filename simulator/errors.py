"""One exception type for every user-facing input problem.

The CLI prints `ConfigError` messages as one line and exits 2; anything else is a bug.
"""

from __future__ import annotations

import difflib


class ConfigError(ValueError):
    """Bad user input: the message names the field, file or value and the allowed range."""


def did_you_mean(name: str, valid: list[str] | tuple[str, ...]) -> str:
    """Return ' (did you mean X?)' for the closest valid name, or ''."""
    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
