"""The small sections of SimConfig: `slo:` targets, `alerts:` rules and `cluster:` shape.

Each holds its defaults in force, so a run's config.yaml shows every target and rule used:
- slo: ttft_s / tpot_s targets (None: not checked), defaults 2 s / 0.1 s.
- alerts: the seed's DEFAULT_RULES overlaid with the YAML's rules by name (`enabled: false`
  disables one, a new name with a `signal` adds one); order: defaults, then added rules, each
  as written. metrics/alerts.py evaluates the enabled ones.
- cluster: replicas (>= 1), router name and router_params. The router name and its params are
  checked by the engine against its router registry (config is below the engine). mode:
  disaggregated adds a prefill and a decode pool and the KV transfer link (docs/disaggregation.md).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict, RootModel, ValidationError, model_validator

from simulator.config.fields import (
    Bool,
    Name,
    Params,
    PosInt,
    Section,
    Text,
    config_error,
    fail,
    integer,
    number,
    one_of,
)
from simulator.errors import did_you_mean

# --- SLO -------------------------------------------------------------------------------------
# Seconds as floats (the summary reports 2.0, not 2).
Seconds = number("must be a number of seconds > 0 (or null: not checked)", to_float=True, gt=0)


class SloConfig(Section):
    """A request meets the SLO when it finished, its TTFT <= ttft_s and its TPOT <= tpot_s
    (a request with one output token has no TPOT and passes that part). None: not checked."""

    where: ClassVar[str] = "slo"
    # Assumptions, not vLLM facts: 2 s TTFT is DESIGN.md's capacity question; 100 ms TPOT
    # (10 tokens/s per stream) is a common interactive floor.
    ttft_s: Seconds | None = 2.0  # type: ignore[valid-type]
    tpot_s: Seconds | None = 0.1  # type: ignore[valid-type]


SLO_KEYS = tuple(SloConfig.model_fields)


# --- alerts ----------------------------------------------------------------------------------
SIGNALS = ("kv_usage", "pending", "running", "preemption_rate")

# The seed's thresholds. The 5 s "sustained" window for the queue and the 10 s rate window are
# assumptions sized for runs of a minute or more (Prometheus rules typically use minutes).
DEFAULT_RULES: dict[str, dict[str, Any]] = {
    "kv_usage_high": {"signal": "kv_usage", "threshold": 0.85, "for_s": 0.0},
    "pending_high": {"signal": "pending", "threshold": 10, "for_s": 5.0},
    "preemption_rate_high": {"signal": "preemption_rate", "threshold": 0.05, "for_s": 0.0,
                             "window_s": 10.0},
}


class AlertRuleConfig(Section):
    """`signal > threshold` held for more than `for_s` seconds fires (metrics/alerts.py)."""

    signal: one_of(*SIGNALS)  # type: ignore[valid-type]
    threshold: number("must be a number >= 0", ge=0)  # type: ignore[valid-type]
    for_s: number("must be a number >= 0", ge=0) = 0.0  # type: ignore[valid-type]
    window_s: number("must be a number > 0", gt=0) = 10.0  # type: ignore[valid-type]  # preemption_rate
    enabled: Bool = True


RULE_KEYS = tuple(AlertRuleConfig.model_fields)


class AlertsConfig(RootModel[dict[str, AlertRuleConfig]]):
    """Every alert rule in force by name, the defaults included (disabled ones too)."""

    model_config = ConfigDict(frozen=True)
    where: ClassVar[str] = "alerts"

    @model_validator(mode="before")
    @classmethod
    def _overlay_defaults(cls, spec: Any) -> Any:
        """1. the defaults; 2. each YAML rule updates the rule of its name, or adds one that
        names its signal."""
        if isinstance(spec, AlertsConfig):
            return spec.root
        if spec is None:
            spec = {}
        if not isinstance(spec, dict):
            raise fail(f": expected a mapping of rule name -> fields, got {spec!r}")
        merged: dict[str, Any] = {k: dict(v) for k, v in DEFAULT_RULES.items()}
        for name, fields in spec.items():
            if isinstance(fields, AlertRuleConfig):
                fields = fields.to_dict()
            if fields is None:
                fields = {}
            if not isinstance(fields, dict):
                raise fail(f".{name}: expected a mapping of {', '.join(RULE_KEYS)}, got {fields!r}")
            if name not in merged and "signal" not in fields:
                raise fail(f".{name}: a new rule needs a signal (one of {', '.join(SIGNALS)}); "
                           f"built-in rules are {', '.join(DEFAULT_RULES)}"
                           f"{did_you_mean(str(name), list(DEFAULT_RULES))}")
            merged.setdefault(name, {}).update(fields)
        return merged

    @classmethod
    def from_section(cls, spec: Any) -> AlertsConfig:
        """The section from YAML data (a ConfigError line if invalid)."""
        if isinstance(spec, AlertsConfig):
            return spec
        try:
            return cls.model_validate(spec)
        except ValidationError as e:
            raise config_error(e, cls.where) from None

    def __getitem__(self, name: str) -> AlertRuleConfig:
        return self.root[name]

    def __contains__(self, name: object) -> bool:
        return name in self.root

    def __iter__(self):  # type: ignore[override]
        return iter(self.root)

    def __len__(self) -> int:
        return len(self.root)

    def items(self):
        return self.root.items()

    def to_dict(self) -> dict[str, Any]:
        return {name: rule.to_dict() for name, rule in self.root.items()}




# --- prefill/decode disaggregation (cluster.mode: disaggregated; docs/disaggregation.md) ---------
# One-way bandwidth (GB/s, as every *_gbps in kvsim) and per-transfer latency of the KV link
# between a prefill and a decode replica, by kind:
# - nvlink: H100/H200 NVLink4 is 900 GB/s bidirectional (../shared/REFERENCE.md GPU table,
#   vendor datasheets), 450 GB/s one way; latency 2 us is an assumption (order of an NVLink
#   peer copy's setup).
# - infiniband: one NDR 400 Gb/s NIC (NVIDIA ConnectX-7, the NIC of DGX H100: one per GPU) =
#   50 GB/s line rate; latency 5 us is an assumption (an RDMA read's round trip, a few us).
# - ethernet: 100 GbE = 12.5 GB/s line rate; latency 50 us is an assumption (TCP stack).
LINK_DEFAULTS: dict[str, tuple[float, float]] = {  # kind -> (bandwidth_gbps, latency_us)
    "nvlink": (450.0, 2.0),
    "infiniband": (50.0, 5.0),
    "ethernet": (12.5, 50.0),
}


class PoolConfig(Section):
    """One stage's replicas (cluster.prefill / cluster.decode): how many, on which GPU (None:
    the top-level gpu), at which tensor parallelism (None: engine.tensor_parallel_size), and the
    router that picks one of them per request."""

    replicas: integer("must be an integer >= 1", ge=1) = 1  # type: ignore[valid-type]
    gpu: Text | None = None
    tensor_parallel_size: PosInt | None = None
    router: Name = "round_robin"
    router_params: Params = {}


class TransferLinkConfig(Section):
    """The KV link of each replica (cluster.transfer): one-way `bandwidth_gbps` (GB/s) and a
    per-transfer `latency_us`; unset, the `kind`'s default (LINK_DEFAULTS, with sources)."""

    kind: one_of(*LINK_DEFAULTS) = "infiniband"  # type: ignore[valid-type]
    bandwidth_gbps: number("must be a number of GB/s > 0", gt=0) | None = None  # type: ignore[valid-type]
    latency_us: number("must be a number of microseconds >= 0", ge=0) | None = None  # type: ignore[valid-type]

    def link(self) -> tuple[float, float]:
        """(bandwidth_gbps, latency_us) in force: the set ones, else the kind's defaults. NOTE:
        left None in the config (not filled in), so `--set cluster.transfer.kind=...` alone
        still changes both; the summary's `disaggregation.transfer` shows the figures used."""
        bandwidth, latency = LINK_DEFAULTS[self.kind]
        return (bandwidth if self.bandwidth_gbps is None else float(self.bandwidth_gbps),
                latency if self.latency_us is None else float(self.latency_us))


# --- cluster ---------------------------------------------------------------------------------
PD_KEYS = ("mode", "prefill", "decode", "transfer")  # the disaggregated-mode fields


class ClusterConfig(Section):
    """`replicas` copies of the engine behind one router (engine/cluster.py), or, with
    mode: disaggregated, a prefill pool and a decode pool joined by KV transfer links
    (engine/disagg.py; `replicas` and `router` are then the pools')."""

    where: ClassVar[str] = "cluster"
    replicas: integer("must be an integer >= 1", ge=1) = 1  # type: ignore[valid-type]
    router: Name = "round_robin"
    router_params: Params = {}
    mode: one_of("colocated", "disaggregated") = "colocated"  # type: ignore[valid-type]
    prefill: PoolConfig = PoolConfig()
    decode: PoolConfig = PoolConfig()
    transfer: TransferLinkConfig = TransferLinkConfig()

    @model_validator(mode="after")
    def _one_shape(self) -> ClusterConfig:
        if self.mode == "disaggregated" and self.replicas != 1:
            raise fail(f".replicas ({self.replicas}) is the colocated fleet's size; with mode "
                       f"disaggregated set cluster.prefill.replicas and cluster.decode.replicas")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Colocated: the fields it had before disaggregation (config.yaml stays as it was)."""
        d = super().to_dict()
        if self.mode == "colocated":
            for key in PD_KEYS:
                del d[key]
        return d
