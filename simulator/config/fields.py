"""Building blocks of the typed config: the Section base model, field types that carry their
rule, and the translation of a pydantic ValidationError into one ConfigError line.

A Section is a frozen pydantic model (`extra="forbid"`): an unknown key is refused with a
"did you mean" hint and the valid keys; a field type names its rule once, next to the field
(`PosInt` -> "must be a positive integer"), so every error reads
"<dotted path> <rule>, got <value>", e.g. "engine.block_size must be a positive integer, got 0".

Invariants: numbers keep the type they were given (an int stays an int, so outputs that print
a value do not change); a bool is never a number; a value is validated once, when its section
is built (nested sections are validated by pydantic-core, never again through __init__).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    ValidationError,
    WrapValidator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from simulator.errors import ConfigError, did_you_mean

_KVSIM = "kvsim"  # error type of every rule written here: ctx["text"] follows the dotted path
_UNION = "kvsim_union"  # a tagged union's tag is missing or unknown: msg is the tag's key
_TAGS: set[str] = set()  # loc entries pydantic adds for tagged unions ("dist=uniform")
_UNIONS: dict[str, tuple[str, tuple[str, ...]]] = {}  # tag key -> (what it names, valid names)
_MEMBERS: dict[str, dict[str, type[BaseModel]]] = {}  # tag key -> {name: model}


def fail(text: str) -> PydanticCustomError:
    """A rule broken. `text` follows the dotted path verbatim, so it starts with its separator:
    " must be ..., got 7" for a field, ": high (3) < low (9)" for a section, ".key ..." for a
    key inside it."""
    return PydanticCustomError(_KVSIM, "{text}", {"text": text})


def _rule(text: str, hint_from: Sequence[str] | None = None) -> WrapValidator:
    """The field's own checks (type, bounds) with one message: "<text>, got <value>"."""

    def wrap(value: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            return handler(value)
        except ValidationError:
            hint = did_you_mean(value, hint_from) if hint_from and isinstance(value, str) else ""
            raise fail(f" {text}{hint}, got {value!r}") from None

    return WrapValidator(wrap)


# --- field types -----------------------------------------------------------------------------
_Number = StrictInt | StrictFloat  # int stays int, float stays float; bool refused


def number(text: str, *, to_float: bool = False, finite: bool = True, **bounds: float) -> Any:
    """A number with bounds (gt/ge/lt/le) and the rule text that names them. It keeps its
    type unless `to_float` (then an int becomes a float)."""
    kind = Annotated[float, Field(strict=True)] if to_float else _Number
    checks = Field(allow_inf_nan=False, **bounds) if finite else Field(**bounds)
    return Annotated[kind, checks, _rule(text)]


def integer(text: str, **bounds: int) -> Any:
    """An int (not a bool, not 3.0) with bounds and the rule text that names them."""
    return Annotated[StrictInt, Field(**bounds), _rule(text)]


PosInt = integer("must be a positive integer", gt=0)
NonNegInt = integer("must be a non-negative integer", ge=0)
Int = integer("must be an integer")
PosNum = number("must be > 0", gt=0)
NonNegNum = number("must be >= 0", ge=0)
Fraction = number("must be in [0, 1]", ge=0, le=1)
FiniteNum = number("must be a finite number")
Bool = Annotated[StrictBool, _rule("must be true or false")]
Text = Annotated[StrictStr, Field(min_length=1), _rule("must be a non-empty string")]
Name = Annotated[StrictStr, Field(min_length=1), _rule("must be a name")]  # a registry name
PathText = Annotated[StrictStr, Field(min_length=1), _rule("must be a path string")]
Params = Annotated[dict[str, Any], _rule("must be a mapping")]  # a plug-in's own params


def one_of(*names: str, text: str | None = None) -> Any:
    """One of `names`; the message lists them and suggests the closest."""
    return Annotated[Literal[names], _rule(text or f"must be one of {', '.join(names)}", names)]


def tagged(key: str, what: str, models: dict[str, type[BaseModel]], default: str | None = None) -> Any:
    """A union of `models` told apart by `key` (a missing key means `default`): the
    `dist: lognormal` of a length distribution picks LognormalLength."""
    _UNIONS[key] = (what, tuple(sorted(models)))
    _MEMBERS[key] = dict(models)
    _TAGS.update(f"{key}={name}" for name in models)

    def tag(value: Any) -> str | None:
        if isinstance(value, BaseModel):
            return f"{key}={getattr(value, key)}"
        if isinstance(value, dict) and (key in value or default is not None):
            return f"{key}={value.get(key, default)}"
        return None

    members = tuple(Annotated[m, Tag(f"{key}={name}")] for name, m in models.items())
    union = Union[members]  # noqa: UP007 (a tuple of members)
    return Annotated[union, Discriminator(tag, custom_error_type=_UNION, custom_error_message=key)]


def union_tag(value: Any) -> str | None:
    """The tag key of the tagged union whose member `value` is (a LognormalLength: "dist"), or
    None where it is no member of one."""
    for key, members in _MEMBERS.items():
        if type(value) in members.values():
            return key
    return None


def tagged_fields(key: str, name: Any) -> frozenset[str] | None:
    """The keys the tagged union member `key: name` takes (`dist: constant`: dist, min, max,
    value), or None where `key` tags no union or `name` names no member."""
    model = _MEMBERS.get(key, {}).get(name) if isinstance(name, str) else None
    return None if model is None else frozenset(model.model_fields)


# --- sections --------------------------------------------------------------------------------
class Section(BaseModel):
    """A frozen config section. Built directly (`EngineConfig(block_size=0)`), a bad value is
    one ConfigError naming `where` + the field; nested in a parent, the parent's path leads."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    where: ClassVar[str] = ""  # the section's dotted path when built on its own

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise config_error(e, self.where) from None

    # NOTE: pydantic-core calls a model's own __init__ for nested values unless it is marked as
    # the base one; marked, nested errors stay ValidationErrors and are translated once, at the
    # top, with the whole path.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key not in cls.model_fields:
                    names = list(cls.model_fields)
                    raise fail(f": unknown key {key!r}{did_you_mean(str(key), names)}; "
                               f"valid: {', '.join(names)}")
        elif not isinstance(data, cls):
            raise fail(f": expected a mapping, got {data!r}")
        return data

    @classmethod
    def from_section(cls, spec: Any) -> Any:
        """The section from raw YAML data (None: the defaults), or one ConfigError line; an
        instance is returned as is (already validated)."""
        if isinstance(spec, cls):
            return spec
        try:
            return cls.model_validate({} if spec is None else spec)
        except ValidationError as e:
            raise config_error(e, cls.where) from None

    @classmethod
    def field_names(cls) -> list[str]:
        return list(cls.model_fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML-ready): nested sections as dicts, every field present."""
        return {k: dump(v) for k, v in self.__dict__.items()}


class Spec(Section):
    """A section read like the validated mapping it replaced: `spec["rate"]`,
    `spec.get("min", 1)`, `"sessions" in tenant`. An unset (None) field is absent."""

    def __getitem__(self, key: str) -> Any:
        value = self.__dict__.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.__dict__.get(key)
        return default if value is None else value

    def __contains__(self, key: object) -> bool:
        return self.__dict__.get(key) is not None  # type: ignore[call-overload]

    def keys(self) -> list[str]:
        return [k for k, v in self.__dict__.items() if v is not None]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, dict):
            return self.to_dict() == other
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # holds dicts: unhashable, like the dicts it replaced

    def to_dict(self) -> dict[str, Any]:
        return {k: dump(v) for k, v in self.__dict__.items() if v is not None}


def dump(value: Any) -> Any:
    """Plain YAML data from a validated value."""
    if isinstance(value, BaseModel):
        return value.to_dict() if isinstance(value, Section) else value.model_dump()
    if isinstance(value, dict):
        return {k: dump(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    return value


# --- one line per ValidationError --------------------------------------------------------------
_GENERIC = {  # pydantic's own error types (plug-in params models) -> the rule, in kvsim's words
    "int_type": "must be an integer", "int_parsing": "must be an integer",
    "int_from_float": "must be an integer", "float_type": "must be a number",
    "float_parsing": "must be a number", "finite_number": "must be a finite number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false",
    "string_type": "must be a string", "list_type": "must be a list",
    "dict_type": "must be a mapping", "string_too_short": "must be a non-empty string",
}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<",
           "less_than_equal": "<="}


def _path(where: str, loc: Sequence[Any]) -> list[str]:
    """Dotted-path segments of a loc: tagged-union tags dropped, list indices as [i]."""
    segments = [where] if where else []
    for p in loc:
        if isinstance(p, int) and segments:
            segments[-1] += f"[{p}]"
        elif p not in _TAGS:
            segments.append(str(p))
    return segments


def _valid_keys(model: type[BaseModel] | None, loc: Sequence[Any]) -> list[str] | None:
    """The field names of the model at `loc` (None where the walk leaves plain models)."""
    for p in loc:
        if model is None or p not in model.model_fields:
            return None
        ann = model.model_fields[p].annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return list(model.model_fields) if model is not None else None


def config_error(err: ValidationError, where: str = "",
                 model: type[BaseModel] | None = None) -> ConfigError:
    """One line for the first error: the dotted path (`where` + the loc), the rule, the value.
    `model` (a plain pydantic model, e.g. a plug-in's params) lets an unknown key list the
    valid ones."""
    e = err.errors(include_url=False)[0]
    loc, kind, value = e.get("loc", ()), e.get("type"), e.get("input")
    segments = _path(where, loc)
    path = ".".join(segments) or "config"
    parent = ".".join(segments[:-1]) or "config"
    if kind == _KVSIM:
        return ConfigError(f"{path}{e['ctx']['text']}")
    if kind == _UNION:
        key = e["msg"]
        what, names = _UNIONS[key]
        if isinstance(value, dict) and key in value:
            tag = value[key]
            return ConfigError(f"{path}.{key}: unknown {what} {tag!r}{did_you_mean(str(tag), names)}; "
                               f"valid: {', '.join(names)}")
        return ConfigError(f"{path}: expected a mapping with {key!r} ({', '.join(names)}), got {value!r}")
    if kind == "missing":
        return ConfigError(f"{parent}: missing {segments[-1].rsplit('.', 1)[-1]!r}")
    if kind == "extra_forbidden":
        key = loc[-1] if loc else "?"
        valid = _valid_keys(model, loc[:-1])
        more = f"{did_you_mean(str(key), valid)}; valid: {', '.join(valid)}" if valid else ""
        return ConfigError(f"{parent}: unknown key {key!r}{more}")
    if kind == "literal_error":
        names = re.findall(r"'([^']*)'", str(e.get("ctx", {}).get("expected", "")))
        hint = did_you_mean(value, names) if isinstance(value, str) else ""
        return ConfigError(f"{path} must be one of {', '.join(names)}{hint}, got {value!r}")
    if kind in _BOUNDS:
        bound = next(iter(e.get("ctx", {}).values()), "?")
        bound = f"{bound:g}" if isinstance(bound, (int, float)) else bound
        return ConfigError(f"{path} must be {_BOUNDS[kind]} {bound}, got {value!r}")
    if kind in _GENERIC:
        return ConfigError(f"{path} {_GENERIC[kind]}, got {value!r}")
    if kind in ("model_type", "model_attributes_type"):
        return ConfigError(f"{path}: expected a mapping, got {value!r}")
    if kind == "value_error":
        return ConfigError(f"{path}: {e.get('ctx', {}).get('error', e['msg'])}")
    msg = str(e.get("msg", "invalid"))
    return ConfigError(f"{path}: {msg[:1].lower()}{msg[1:]}, got {value!r}")
