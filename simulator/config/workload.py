"""Workload section of the configuration (`workload:` in YAML): typed, validated once.

Where requests come from (a trace file or synthetic generators) and how to reshape them. The
nested parts are typed sub-models: an arrival process (told apart by `process`, default
poisson), length distributions (told apart by `dist`), sessions, system prompts, tenants. They
read like the mappings they replace (`cfg.arrival["rate"]`, `spec.get("min", 1)`) and their
to_dict() is what config.yaml shows: every default filled in, unset (None) keys absent.

Invariants: a tenant inherits the top-level arrival / lengths / sessions / system_prompts it
does not set; synthetic traffic with no bound gets 1000 requests; every rule is one ConfigError
naming the dotted field and the value.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from simulator.config.fields import (
    Bool,
    FiniteNum,
    Fraction,
    Int,
    NonNegNum,
    PathText,
    PosInt,
    PosNum,
    Section,
    Spec,
    Text,
    fail,
    integer,
    number,
    one_of,
    tagged,
)
from simulator.errors import did_you_mean

# a coefficient of variation (std / mean); past ~1e154 cv^2 overflows, and long before that a
# lognormal's or gamma's draws collapse to ~0 with rare huge ones (sigma^2 = log(1 + cv^2)):
# 100 is a bound no workload needs to pass
Cv = number("must be a coefficient of variation in (0, 100]", gt=0, le=100)


# --- arrival processes -----------------------------------------------------------------------
class PoissonArrival(Spec):
    process: Literal["poisson"] = "poisson"
    rate: PosNum  # requests (or session starts) per second


class GammaArrival(Spec):
    process: Literal["gamma"] = "gamma"
    rate: PosNum
    cv: Cv  # inter-arrival coefficient of variation (1: Poisson)


class OnOffArrival(Spec):
    process: Literal["onoff"] = "onoff"
    rate_on: PosNum
    rate_off: NonNegNum = 0.0
    on_s: PosNum
    off_s: PosNum
    periods: one_of("fixed", "exponential") = "fixed"  # type: ignore[valid-type]


class DiurnalArrival(Spec):
    process: Literal["diurnal"] = "diurnal"
    mean_rate: PosNum
    amplitude: Fraction
    period_s: PosNum = 86400.0
    phase_s: FiniteNum = 0.0


class RampArrival(Spec):
    process: Literal["ramp"] = "ramp"
    start_rate: NonNegNum
    end_rate: NonNegNum
    ramp_s: PosNum

    @model_validator(mode="after")
    def _not_both_zero(self) -> RampArrival:
        if self.start_rate == 0 and self.end_rate == 0:
            raise fail(": ramp start_rate and end_rate are both 0")
        return self


ARRIVAL_PARAMS: dict[str, type[Spec]] = {
    "poisson": PoissonArrival, "gamma": GammaArrival, "onoff": OnOffArrival,
    "diurnal": DiurnalArrival, "ramp": RampArrival}
Arrival = tagged("process", "arrival process", ARRIVAL_PARAMS, default="poisson")


# --- length distributions ----------------------------------------------------------------------
class _Length(Spec):
    """Every distribution's results are clipped to [min, max]."""

    dist: str  # each distribution narrows it to its own name
    min: NonNegNum | None = None
    max: PosNum | None = None

    @model_validator(mode="after")
    def _bounds(self) -> _Length:
        if self.max is not None and self.min is not None and self.max < self.min:
            raise fail(f": max ({self.max}) < min ({self.min})")
        return self


class ConstantLength(_Length):
    dist: Literal["constant"] = "constant"
    value: NonNegNum


class UniformLength(_Length):
    dist: Literal["uniform"] = "uniform"
    low: NonNegNum
    high: NonNegNum

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.high < self.low:
            raise fail(f": uniform high ({self.high}) < low ({self.low})")
        return self


class LognormalLength(_Length):
    dist: Literal["lognormal"] = "lognormal"
    mean: PosNum
    cv: Cv


class ZipfLength(_Length):
    dist: Literal["zipf"] = "zipf"
    s: PosNum
    low: PosInt = 1
    high: PosInt

    @model_validator(mode="after")
    def _ordered(self) -> ZipfLength:
        if self.high < self.low:
            raise fail(f": zipf high ({self.high}) < low ({self.low})")
        return self


class EmpiricalLength(_Length):
    dist: Literal["empirical"] = "empirical"
    file: PathText  # CSV/JSONL; relative: the YAML's folder, the CWD, the packaged workloads/
    column: Text


LENGTH_PARAMS: dict[str, type[Spec]] = {
    "constant": ConstantLength, "uniform": UniformLength, "lognormal": LognormalLength,
    "zipf": ZipfLength, "empirical": EmpiricalLength}
Length = tagged("dist", "length distribution", LENGTH_PARAMS)


# --- sessions, system prompts, tenants -------------------------------------------------------
class SessionsConfig(Spec):
    """Multi-turn sessions: turns per session, and the gap between turns' arrivals."""

    turns: Length  # type: ignore[valid-type]
    think_time_s: Length  # type: ignore[valid-type]


class SystemPromptsConfig(Spec):
    """`count` shared prefixes of `tokens` each, picked per session with Zipf(zipf_s) popularity."""

    count: PosInt
    tokens: Length  # type: ignore[valid-type]
    zipf_s: NonNegNum = 1.0


class TenantConfig(Spec):
    """One traffic class of a mixture, with its own arrival process."""

    name: Text
    arrival: Arrival | None = None  # type: ignore[valid-type]
    prompt_tokens: Length | None = None  # type: ignore[valid-type]
    output_tokens: Length | None = None  # type: ignore[valid-type]
    sessions: SessionsConfig | None = None
    system_prompts: SystemPromptsConfig | None = None
    priority: Int = 0
    tier: Text = ""  # "": no tier
    slo_ttft_s: PosNum | None = None
    slo_tpot_s: PosNum | None = None


INHERITED = ("arrival", "prompt_tokens", "output_tokens", "sessions", "system_prompts")

# Canonical trace fields a generic column mapping may name.
TRACE_FIELDS = ("timestamp", "prompt_tokens", "output_tokens", "hash_ids", "tenant", "priority",
                "session_id")
# Timestamp units: ticks per second (None: ISO 8601 datetimes).
TIMESTAMP_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9, "datetime": None}


class WorkloadConfig(Section):
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

    where: ClassVar[str] = "workload"

    num_requests: PosInt | None = None  # None: 1000 for synthetic traffic, the whole trace for traces
    duration_s: PosNum | None = None
    arrival: Arrival = PoissonArrival(rate=20.0)  # type: ignore[valid-type]
    # ShareGPT means (OPT tokenizer) from PagedAttention, ../shared/REFERENCE.md; the CV of 1.0
    # is an assumption (heavy-tailed lengths), clipped to [1, 2048].
    prompt_tokens: Length = LognormalLength(mean=161.31, cv=1.0, min=1, max=2048)  # type: ignore[valid-type]
    output_tokens: Length = LognormalLength(mean=337.99, cv=1.0, min=1, max=2048)  # type: ignore[valid-type]
    lengths_file: PathText | None = None  # CSV sampled row-wise (keeps the prompt/output joint law)
    prompt_column: Text = "num_prefill_tokens"
    output_column: Text = "num_decode_tokens"
    sessions: SessionsConfig | None = None  # multi-turn: {turns: dist, think_time_s: dist}
    system_prompts: SystemPromptsConfig | None = None  # shared prefixes: {count, tokens, zipf_s}
    tenants: list[TenantConfig] | None = None  # mixture; each tenant has its own arrival
    # Content-chunk size of generated prefix ids; 512 matches Mooncake's hash_ids blocks.
    prefix_block_tokens: PosInt = 512
    # --- trace replay ---
    trace: PathText | None = None  # relative: the YAML's folder, the CWD, the packaged workloads/
    format: Text = "auto"  # auto | azure | burstgpt | mooncake | vidur | lengths | generic (or a plug-in)
    columns: dict[str, Any] | None = None  # generic format: canonical field -> file column
    timestamp_unit: one_of(*TIMESTAMP_UNITS) | None = None  # type: ignore[valid-type]  # None: the format's own
    keep_failed: Bool = False  # rows with 0 output tokens: dropped (counted) or kept as 1 token
    on_unsorted: one_of("sort", "error") = "sort"  # type: ignore[valid-type]  # sort (stable, with a warning) | error
    filter: dict[str, Any] | None = None  # trace column -> value or list of values to keep
    # --- transforms ---
    window_start_s: NonNegNum = 0.0
    speedup: PosNum | None = None  # replay k x faster (inter-arrivals / k; burst shape kept)
    target_rate: PosNum | None = None  # rescale time so the mean rate is this many req/s
    sample_n: PosInt | None = None  # keep N requests drawn at random (time order kept)
    # clip prompt+output to this many tokens (counted)
    max_model_len: integer("must be >= 2 (1 prompt + 1 output token)", ge=2) | None = None  # type: ignore[valid-type]

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, tenants: list[TenantConfig] | None) -> list[TenantConfig] | None:
        if tenants is not None:
            if not tenants:
                raise fail(" must be a non-empty list, got []")
            names = [t.name for t in tenants]
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                raise fail(f": duplicate tenant name(s) {dup}")
        return tenants

    @field_validator("columns")
    @classmethod
    def _columns(cls, columns: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if columns is None:
            return None
        _trace_only(info)
        for key, value in columns.items():
            if key not in TRACE_FIELDS:
                raise fail(f": unknown field {key!r}{did_you_mean(key, TRACE_FIELDS)}; "
                           f"valid: {', '.join(TRACE_FIELDS)}")
            if not isinstance(value, str) or not value:
                raise fail(f".{key} must be a column name, got {value!r}")
        for key in ("prompt_tokens", "output_tokens"):
            if key not in columns:
                raise fail(f": missing {key!r} (the file column holding it)")
        return columns

    @field_validator("filter")
    @classmethod
    def _filter(cls, filter_: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if filter_ is None:
            return None
        if not filter_:
            raise fail(f" must be a mapping column -> value(s), got {filter_!r}")
        _trace_only(info)
        for key, value in filter_.items():
            values = value if isinstance(value, list) else [value]
            if not values or not all(isinstance(v, (str, int, float)) for v in values):
                raise fail(f".{key} must be a value or a list of values, got {value!r}")
        return filter_

    @model_validator(mode="after")
    def _resolve(self) -> WorkloadConfig:
        """1. speedup and target_rate exclude each other, and a trace the settings of generated
        traffic; 2. synthetic traffic without a bound gets 1000 requests; 3. tenants inherit the
        top-level synthetic settings they lack."""
        if self.speedup is not None and self.target_rate is not None:
            raise fail(f": set speedup ({self.speedup}) or target_rate ({self.target_rate}), not both")
        if self.trace is not None:  # (a trace replays its own requests: these would do nothing)
            for key in ("lengths_file", "sessions", "tenants", "system_prompts"):
                if getattr(self, key) is not None:
                    raise fail(f".{key} shapes generated traffic, not a trace (workload.trace is "
                               f"set); remove one of them")
        # NOTE: a frozen model sets its derived values once, here, through object.__setattr__.
        if self.trace is None and self.num_requests is None and self.duration_s is None:
            object.__setattr__(self, "num_requests", 1000)
        if self.tenants is not None:
            object.__setattr__(self, "tenants", [t.model_copy(update={
                key: getattr(self, key) for key in INHERITED
                if getattr(t, key) is None and getattr(self, key) is not None}) for t in self.tenants])
        return self


def _trace_only(info: ValidationInfo) -> None:
    if info.data.get("trace") is None:
        raise fail(" applies to traces only; set workload.trace")
