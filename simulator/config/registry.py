"""Registry: maps the name used in YAML / CLI to the class or function that implements it.

An unknown name is a ConfigError that lists the valid names, with a "did you mean" hint.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from simulator.errors import ConfigError, did_you_mean

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            valid = sorted(self._entries)
            raise ConfigError(
                f"unknown {self.kind} {name!r}{did_you_mean(name, valid)}; valid: {', '.join(valid)}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
