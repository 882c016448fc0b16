"""Workload section of the configuration (`workload:` in YAML), validated once.

Kept apart from config.py so that workload features grow here without touching engine config.
Nested mappings (arrival process, length distributions, sessions, system prompts, tenants,
trace column mapping, filter) are checked here against small schemas: every rule is one
ConfigError naming the field and the value, unknown keys get a "did you mean" hint, and the
defaults are filled in so that the resolved config.yaml shows every value a run used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import ConfigError, did_you_mean


def positive_int(section: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{section}.{name} must be a positive integer, got {value!r}")


# --- schemas ---------------------------------------------------------------------------------
# A parameter is (check, default); default REQUIRED means the key must be given.
# Checks: pos (> 0), nonneg (>= 0), frac (0 <= x <= 1), num (finite), posint, nonnegint, int,
# str, or a tuple of allowed strings.
REQUIRED = object()

ARRIVAL_PARAMS: dict[str, dict[str, tuple[Any, Any]]] = {
    "poisson": {"rate": ("pos", REQUIRED)},
    "gamma": {"rate": ("pos", REQUIRED), "cv": ("pos", REQUIRED)},
    "onoff": {"rate_on": ("pos", REQUIRED), "rate_off": ("nonneg", 0.0), "on_s": ("pos", REQUIRED),
              "off_s": ("pos", REQUIRED), "periods": (("fixed", "exponential"), "fixed")},
    "diurnal": {"mean_rate": ("pos", REQUIRED), "amplitude": ("frac", REQUIRED),
                "period_s": ("pos", 86400.0), "phase_s": ("num", 0.0)},
    "ramp": {"start_rate": ("nonneg", REQUIRED), "end_rate": ("nonneg", REQUIRED),
             "ramp_s": ("pos", REQUIRED)},
}

LENGTH_PARAMS: dict[str, dict[str, tuple[Any, Any]]] = {
    "constant": {"value": ("nonneg", REQUIRED)},
    "uniform": {"low": ("nonneg", REQUIRED), "high": ("nonneg", REQUIRED)},
    "lognormal": {"mean": ("pos", REQUIRED), "cv": ("pos", REQUIRED)},
    "zipf": {"s": ("pos", REQUIRED), "low": ("posint", 1), "high": ("posint", REQUIRED)},
    "empirical": {"file": ("str", REQUIRED), "column": ("str", REQUIRED)},
}
# Keys every length distribution accepts: results are clipped to [min, max].
LENGTH_COMMON = {"min": ("nonneg", None), "max": ("pos", None)}

SESSION_PARAMS = {"turns": ("dist", REQUIRED), "think_time_s": ("dist", REQUIRED)}
SYSTEM_PROMPT_PARAMS = {"count": ("posint", REQUIRED), "tokens": ("dist", REQUIRED),
                        "zipf_s": ("nonneg", 1.0)}
TENANT_PARAMS = {
    "name": ("str", REQUIRED), "arrival": ("arrival", None), "prompt_tokens": ("dist", None),
    "output_tokens": ("dist", None), "sessions": ("sessions", None),
    "system_prompts": ("system_prompts", None), "priority": ("int", 0), "tier": ("str", ""),
    "slo_ttft_s": ("pos", None), "slo_tpot_s": ("pos", None),
}
# Canonical trace fields a generic column mapping may name.
TRACE_FIELDS = ("timestamp", "prompt_tokens", "output_tokens", "hash_ids", "tenant", "priority",
                "session_id")
# Timestamp units: ticks per second (None: ISO 8601 datetimes).
TIMESTAMP_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9, "datetime": None}


def _check_value(where: str, value: Any, check: Any) -> Any:
    if isinstance(check, tuple):
        if value not in check:
            raise ConfigError(f"{where} must be one of {', '.join(check)}, got {value!r}")
        return value
    if check == "str":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where} must be a non-empty string, got {value!r}")
        return value
    if check in ("posint", "nonnegint", "int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        if (check == "posint" and value <= 0) or (check == "nonnegint" and value < 0):
            raise ConfigError(f"{where} must be {'> 0' if check == 'posint' else '>= 0'}, got {value!r}")
        return value
    if check == "dist":
        return check_length_spec(where, value)
    if check == "arrival":
        return check_arrival_spec(where, value)
    if check == "sessions":
        return _check_mapping(where, value, SESSION_PARAMS)
    if check == "system_prompts":
        return _check_mapping(where, value, SYSTEM_PROMPT_PARAMS)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    if check == "pos" and value <= 0:
        raise ConfigError(f"{where} must be > 0, got {value!r}")
    if check == "nonneg" and value < 0:
        raise ConfigError(f"{where} must be >= 0, got {value!r}")
    if check == "frac" and not 0 <= value <= 1:
        raise ConfigError(f"{where} must be in [0, 1], got {value!r}")
    return value


def _check_mapping(where: str, spec: Any, params: dict[str, tuple[Any, Any]],
                   skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Validate `spec` against `params`; return a copy with defaults filled in."""
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping, got {spec!r}")
    out: dict[str, Any] = {k: spec[k] for k in skip if k in spec}
    for key in spec:
        if key not in params and key not in skip:
            names = sorted(params)
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, names)}; "
                              f"valid: {', '.join(names)}")
    for key, (check, default) in params.items():
        if key in spec and spec[key] is not None:
            out[key] = _check_value(f"{where}.{key}", spec[key], check)
        elif default is REQUIRED:
            raise ConfigError(f"{where}: missing {key!r}")
        elif default is not None:
            out[key] = default
    return out


def check_arrival_spec(where: str, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ConfigError(f"{where}: expected a mapping with 'process', got {spec!r}")
    process = spec.get("process", "poisson")
    if process not in ARRIVAL_PARAMS:
        names = sorted(ARRIVAL_PARAMS)
        raise ConfigError(f"{where}.process: unknown arrival process {process!r}"
                          f"{did_you_mean(process, names)}; valid: {', '.join(names)}")
    out = {"process": process, **_check_mapping(where, spec, ARRIVAL_PARAMS[process], ("process",))}
    if process == "ramp" and out["start_rate"] == 0 and out["end_rate"] == 0:
        raise ConfigError(f"{where}: ramp start_rate and end_rate are both 0")
    return out


def check_length_spec(where: str, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict) or "dist" not in spec:
        raise ConfigError(f"{where}: expected a mapping with 'dist' "
                          f"({', '.join(sorted(LENGTH_PARAMS))}), got {spec!r}")
    dist = spec["dist"]
    if dist not in LENGTH_PARAMS:
        names = sorted(LENGTH_PARAMS)
        raise ConfigError(f"{where}.dist: unknown length distribution {dist!r}"
                          f"{did_you_mean(dist, names)}; valid: {', '.join(names)}")
    out = {"dist": dist, **_check_mapping(where, spec, {**LENGTH_PARAMS[dist], **LENGTH_COMMON},
                                          ("dist",))}
    if dist == "uniform" and out["high"] < out["low"]:
        raise ConfigError(f"{where}: uniform high ({out['high']}) < low ({out['low']})")
    if dist == "zipf" and out["high"] < out["low"]:
        raise ConfigError(f"{where}: zipf high ({out['high']}) < low ({out['low']})")
    if out.get("max") is not None and out.get("min") is not None and out["max"] < out["min"]:
        raise ConfigError(f"{where}: max ({out['max']}) < min ({out['min']})")
    return out


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Where requests come from (a trace file or synthetic generators) and how to reshape them.

    Source: `trace` set -> replay the file (format named or auto-detected); otherwise synthetic
    traffic from `arrival` + `prompt_tokens`/`output_tokens` (or `lengths_file`), optionally
    with `sessions`, `system_prompts`, or several `tenants` (each inherits the top-level
    arrival/lengths/sessions/system_prompts it does not set).

    Bounds: `num_requests` (first N) and `duration_s` (first D seconds); num_requests wins if
    both are set. Synthetic traffic with neither set gets 1000 requests; a trace is replayed
    whole. Transforms, applied in this order after loading/generation: window_start_s (+
    duration_s), num_requests, sample_n, speedup | target_rate, max_model_len clipping.
    Times are in seconds; arrivals start at 0 for the first request.
    """

    num_requests: int | None = None  # None: 1000 for synthetic traffic, the whole trace for traces
    duration_s: float | None = None
    arrival: dict[str, Any] = field(default_factory=lambda: {"process": "poisson", "rate": 20.0})
    # ShareGPT means (OPT tokenizer) from PagedAttention, ../shared/REFERENCE.md; the CV of 1.0
    # is an assumption (heavy-tailed lengths), clipped to [1, 2048].
    prompt_tokens: dict[str, Any] = field(default_factory=lambda: {
        "dist": "lognormal", "mean": 161.31, "cv": 1.0, "min": 1, "max": 2048})
    output_tokens: dict[str, Any] = field(default_factory=lambda: {
        "dist": "lognormal", "mean": 337.99, "cv": 1.0, "min": 1, "max": 2048})
    lengths_file: str | None = None  # CSV sampled row-wise (keeps the prompt/output joint law)
    prompt_column: str = "num_prefill_tokens"
    output_column: str = "num_decode_tokens"
    sessions: dict[str, Any] | None = None  # multi-turn: {turns: dist, think_time_s: dist}
    system_prompts: dict[str, Any] | None = None  # shared prefixes: {count, tokens, zipf_s}
    tenants: list[dict[str, Any]] | None = None  # mixture; each tenant has its own arrival
    # Content-chunk size of generated prefix ids; 512 matches Mooncake's hash_ids blocks.
    prefix_block_tokens: int = 512
    # --- trace replay ---
    trace: str | None = None  # path; relative paths try the CWD, then the packaged workloads/
    format: str = "auto"  # auto | azure | burstgpt | mooncake | vidur | lengths | generic
    columns: dict[str, str] | None = None  # generic format: canonical field -> file column
    timestamp_unit: str | None = None  # s | ms | us | ns | datetime; None: the format's own
    keep_failed: bool = False  # rows with 0 output tokens: dropped (counted) or kept as 1 token
    on_unsorted: str = "sort"  # sort (stable, with a warning) | error
    filter: dict[str, Any] | None = None  # trace column -> value or list of values to keep
    # --- transforms ---
    window_start_s: float = 0.0
    speedup: float | None = None  # replay k x faster (inter-arrivals / k; burst shape kept)
    target_rate: float | None = None  # rescale time so the mean rate is this many req/s
    sample_n: int | None = None  # keep N requests drawn at random (time order kept)
    max_model_len: int | None = None  # clip prompt+output to this many tokens (counted)

    def __post_init__(self) -> None:
        s = "workload"
        positive_int(s, "num_requests", self.num_requests, allow_none=True)
        if self.duration_s is not None and not (isinstance(self.duration_s, (int, float))
                                                and not isinstance(self.duration_s, bool)
                                                and self.duration_s > 0):
            raise ConfigError(f"{s}.duration_s must be > 0, got {self.duration_s!r}")
        if self.trace is None and self.num_requests is None and self.duration_s is None:
            object.__setattr__(self, "num_requests", 1000)
        set_ = lambda name, value: object.__setattr__(self, name, value)
        set_("arrival", check_arrival_spec(f"{s}.arrival", self.arrival))
        set_("prompt_tokens", check_length_spec(f"{s}.prompt_tokens", self.prompt_tokens))
        set_("output_tokens", check_length_spec(f"{s}.output_tokens", self.output_tokens))
        if self.sessions is not None:
            set_("sessions", _check_mapping(f"{s}.sessions", self.sessions, SESSION_PARAMS))
        if self.system_prompts is not None:
            set_("system_prompts", _check_mapping(f"{s}.system_prompts", self.system_prompts,
                                                  SYSTEM_PROMPT_PARAMS))
        if self.tenants is not None:
            set_("tenants", self._check_tenants())
        positive_int(s, "prefix_block_tokens", self.prefix_block_tokens)
        for name in ("lengths_file", "trace"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{s}.{name} must be a path string, got {value!r}")
        if not isinstance(self.format, str) or not self.format:
            raise ConfigError(f"{s}.format must be a format name, got {self.format!r}")
        if self.columns is not None:
            self._check_columns()
        if self.timestamp_unit is not None and self.timestamp_unit not in TIMESTAMP_UNITS:
            raise ConfigError(f"{s}.timestamp_unit must be one of {', '.join(TIMESTAMP_UNITS)}, "
                              f"got {self.timestamp_unit!r}")
        if not isinstance(self.keep_failed, bool):
            raise ConfigError(f"{s}.keep_failed must be true or false, got {self.keep_failed!r}")
        _check_value(f"{s}.on_unsorted", self.on_unsorted, ("sort", "error"))
        if self.filter is not None:
            self._check_filter()
        _check_value(f"{s}.window_start_s", self.window_start_s, "nonneg")
        for name in ("speedup", "target_rate"):
            if getattr(self, name) is not None:
                _check_value(f"{s}.{name}", getattr(self, name), "pos")
        if self.speedup is not None and self.target_rate is not None:
            raise ConfigError(f"{s}: set speedup ({self.speedup}) or target_rate "
                              f"({self.target_rate}), not both")
        positive_int(s, "sample_n", self.sample_n, allow_none=True)
        positive_int(s, "max_model_len", self.max_model_len, allow_none=True)
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ConfigError(f"{s}.max_model_len must be >= 2 (1 prompt + 1 output token), "
                              f"got {self.max_model_len}")
        if self.trace is None:
            for name in ("columns", "filter"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{s}.{name} applies to traces only; set workload.trace")

    def _check_tenants(self) -> list[dict[str, Any]]:
        if not isinstance(self.tenants, list) or not self.tenants:
            raise ConfigError(f"workload.tenants must be a non-empty list, got {self.tenants!r}")
        out = []
        for i, spec in enumerate(self.tenants):
            where = f"workload.tenants[{i}]"
            t = _check_mapping(where, spec, TENANT_PARAMS)
            # Inherit the top-level synthetic settings the tenant does not set.
            for key in ("arrival", "prompt_tokens", "output_tokens", "sessions", "system_prompts"):
                if key not in t and getattr(self, key) is not None:
                    t[key] = getattr(self, key)
            out.append(t)
        names = [t["name"] for t in out]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"workload.tenants: duplicate tenant name(s) {dup}")
        return out

    def _check_columns(self) -> None:
        if not isinstance(self.columns, dict):
            raise ConfigError(f"workload.columns must be a mapping, got {self.columns!r}")
        for key, value in self.columns.items():
            if key not in TRACE_FIELDS:
                raise ConfigError(f"workload.columns: unknown field {key!r}"
                                  f"{did_you_mean(key, TRACE_FIELDS)}; valid: {', '.join(TRACE_FIELDS)}")
            if not isinstance(value, str) or not value:
                raise ConfigError(f"workload.columns.{key} must be a column name, got {value!r}")
        for key in ("prompt_tokens", "output_tokens"):
            if key not in self.columns:
                raise ConfigError(f"workload.columns: missing {key!r} (the file column holding it)")

    def _check_filter(self) -> None:
        if not isinstance(self.filter, dict) or not self.filter:
            raise ConfigError(f"workload.filter must be a mapping column -> value(s), got {self.filter!r}")
        for key, value in self.filter.items():
            values = value if isinstance(value, list) else [value]
            if not values or not all(isinstance(v, (str, int, float)) for v in values):
                raise ConfigError(f"workload.filter.{key} must be a value or a list of values, "
                                  f"got {value!r}")
