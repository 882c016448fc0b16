"""Registry: maps the name used in YAML / CLI to the class or function that implements it.

A plug-in is one module that registers itself with one line:

    @EVICTION_POLICIES.register("my_policy", params=MyParams)   # params: a pydantic model
    class MyPolicy: ...

`build(name, params, where)` validates `params` against the plug-in's own params model (one
ConfigError naming `where.key`, the value and the rule) and calls the plug-in with them.
An unknown name is a ConfigError that lists the valid names, with a "did you mean" hint.

A user's package adds plug-ins without touching kvsim through the `kvsim.plugins`
entry-point group: each entry point names a module, imported (so it registers itself) the
first time any registry is asked for a name it does not hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from simulator.errors import ConfigError, did_you_mean

T = TypeVar("T")

ENTRY_POINT_GROUP = "kvsim.plugins"
_plugins_loaded = False


def load_plugins() -> None:
    """Import every module named in the `kvsim.plugins` entry-point group, once per process."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            ep.load()
        except Exception as e:  # a broken plug-in is the user's input problem, said in one line
            raise ConfigError(f"plug-in {ep.name!r} ({ep.value}) from entry-point group "
                              f"{ENTRY_POINT_GROUP} failed to load: {type(e).__name__}: {e}") from None


def params_error(where: str, err: Any, model: type | None = None, owner: str = "") -> ConfigError:
    """One line from a pydantic ValidationError: the first failing field, its value and rule
    (fields.config_error; `model` lets an unknown key list the valid ones, `owner` names the
    plug-in). A ConfigError raised by the model's own validator is passed on as it is."""
    from simulator.config.fields import config_error

    first = err.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return cause
    e = config_error(err, where, model)
    if owner and first.get("type") == "extra_forbidden":
        key = first["loc"][-1] if first.get("loc") else "?"
        e = ConfigError(str(e).replace(f"unknown key {key!r}", f"unknown key {key!r} for {owner}", 1))
    return e


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._params: dict[str, Any] = {}
        self._lazy: dict[str, str] = {}  # name -> "module:attr", imported on first use

    def register(self, name: str, *, params: type | None = None) -> Callable[[T], T]:
        """Decorator; `params` is the plug-in's pydantic params model (None: takes none)."""

        def deco(obj: T) -> T:
            if name in self._entries or name in self._lazy:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            if params is not None:
                self._params[name] = params
            return obj

        return deco

    def register_lazy(self, name: str, target: str) -> None:
        """Register `name` as 'module:attr', imported when first used (keeps a higher layer's
        implementation out of this layer's imports, e.g. the vLLM backend)."""
        if name in self._entries or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._lazy[name] = target

    def _resolve(self, name: str) -> bool:
        if name in self._entries:
            return True
        if name in self._lazy:
            import importlib

            module, _, attr = self._lazy.pop(name).partition(":")
            obj = getattr(importlib.import_module(module), attr)
            if name not in self._entries:  # the module may have registered itself on import
                self._entries[name] = obj
            return True
        load_plugins()
        return name in self._entries or name in self._lazy and self._resolve(name)

    def get(self, name: str) -> T:
        if not (isinstance(name, str) and self._resolve(name)):
            valid = self.names()
            raise ConfigError(
                f"unknown {self.kind} {name!r}{did_you_mean(str(name), valid)}; "
                f"valid: {', '.join(valid)}")
        return self._entries[name]

    def params_model(self, name: str) -> type | None:
        self.get(name)
        return self._params.get(name)

    def validate_params(self, name: str, params: dict[str, Any] | None, where: str) -> dict[str, Any]:
        """`params` checked against `name`'s params model; the validated values as a dict.
        A plug-in without a params model takes no parameters."""
        params = dict(params or {})
        model = self.params_model(name)
        if model is None:
            if params:
                key = sorted(params)[0]
                raise ConfigError(f"{where}.{key}: unknown key ({self.kind} {name!r} takes no "
                                  f"parameters)")
            return {}
        from pydantic import ValidationError

        try:
            return model.model_validate(params).model_dump()
        except ValidationError as e:
            raise params_error(where, e, model, f"{self.kind} {name!r}") from None

    def build(self, name: str, params: dict[str, Any] | None = None, where: str = "",
              *args: Any, **context: Any) -> Any:
        """Instantiate (or call) plug-in `name` with validated `params` plus `context`."""
        obj = self.get(name)
        values = self.validate_params(name, params, where or f"{self.kind}_params")
        return obj(*args, **context, **values)  # type: ignore[operator]

    def names(self) -> list[str]:
        load_plugins()
        return sorted([*self._entries, *self._lazy])

    def items(self) -> Iterable[tuple[str, T]]:
        for name in self.names():
            yield name, self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._resolve(name)
