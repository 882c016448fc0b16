"""Configuration: gathered from YAML + `--set` overrides + vLLM-style flags, validated once.

`SimConfig` is a tree of frozen dataclasses. Every rule raises one ConfigError naming the
field, the value and the allowed range; unknown keys are rejected with a "did you mean" hint.
`None` engine defaults are resolved against the GPU like vLLM does (`resolve_engine`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from simulator.config.workload import WorkloadConfig
from simulator.config.workload import positive_int as _positive_int
from simulator.errors import ConfigError, did_you_mean


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine knobs, named as vLLM names them. None = vLLM's default for the GPU."""

    block_size: int = 16  # vLLM's default on CUDA
    gpu_memory_utilization: float = 0.9  # vLLM's default
    max_model_len: int | None = None  # None: the model's max_position_embeddings (vLLM)
    max_num_seqs: int | None = None  # None: 256, or 1024 on >= 70 GiB non-A100 GPUs (vLLM)
    max_num_batched_tokens: int | None = None  # None: 2048, or 8192 on >= 70 GiB non-A100 (vLLM)
    tensor_parallel_size: int = 1
    activation_reserve_gib: float | None = None  # None: estimated (memory.py)
    num_gpu_blocks_override: int | None = None  # vLLM's flag: use this many KV blocks instead
    kv_allocator: str = "paged"  # paged | contiguous
    contiguous_reserve: str = "max_model_len"  # max_model_len | pow2 | oracle (contiguous only)
    enable_prefix_caching: bool = True  # vLLM v1's default (paged only)
    eviction_policy: str = "lru"  # lru | lru_ttl | lfu (which cached blocks are reused first)
    eviction_ttl_s: float = 60.0  # lru_ttl: blocks not accessed for this long are evicted first
    eviction_params: dict = field(default_factory=dict)  # the eviction policy's own params
    kv_allocator_params: dict = field(default_factory=dict)  # the allocator's own params
    scheduler: str = "continuous"  # continuous | static
    enable_chunked_prefill: bool = True  # vLLM v1; false: prefill-first steps (vLLM v0)
    prefill_chunk_size: int | None = None  # the seed's name for the token budget per step
    queue_policy: str = "fcfs"  # fcfs | priority | tiered
    queue_params: dict = field(default_factory=dict)  # tiered: {by, tiers: [...]}
    preemption_mode: str = "recompute"  # recompute (vLLM v1) | swap (vLLM v0)
    swap_space_gib: float = 4.0  # CPU swap space per GPU, vLLM v0's default
    # vLLM 0.33's default: admit a waiting request only if its whole sequence fits the KV pool
    scheduler_reserve_full_isl: bool = True
    backend: str = "kvsim"  # kvsim | vllm (vLLM's own v1 scheduler, docs/parity.md)

    def __post_init__(self) -> None:
        s = "engine"
        _positive_int(s, "block_size", self.block_size)
        if not (isinstance(self.gpu_memory_utilization, (int, float))
                and 0 < self.gpu_memory_utilization <= 1):
            raise ConfigError(f"{s}.gpu_memory_utilization must be in (0, 1], "
                              f"got {self.gpu_memory_utilization!r}")
        for name in ("max_model_len", "max_num_seqs", "max_num_batched_tokens",
                     "num_gpu_blocks_override"):
            _positive_int(s, name, getattr(self, name), allow_none=True)
        _positive_int(s, "tensor_parallel_size", self.tensor_parallel_size)
        if self.activation_reserve_gib is not None and not self.activation_reserve_gib >= 0:
            raise ConfigError(f"{s}.activation_reserve_gib must be >= 0, "
                              f"got {self.activation_reserve_gib!r}")
        if not isinstance(self.enable_prefix_caching, bool):
            raise ConfigError(f"{s}.enable_prefix_caching must be true or false, "
                              f"got {self.enable_prefix_caching!r}")
        if isinstance(self.eviction_ttl_s, bool) or not (
                isinstance(self.eviction_ttl_s, (int, float)) and self.eviction_ttl_s > 0):
            raise ConfigError(f"{s}.eviction_ttl_s must be > 0 seconds, got {self.eviction_ttl_s!r}")
        if self.backend not in ("kvsim", "vllm"):
            hint = did_you_mean(str(self.backend), ["kvsim", "vllm"])
            raise ConfigError(f"{s}.backend must be kvsim or vllm{hint}, got {self.backend!r}")
        for flag in ("enable_chunked_prefill", "scheduler_reserve_full_isl"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"{s}.{flag} must be true or false, got {getattr(self, flag)!r}")
        _positive_int(s, "prefill_chunk_size", self.prefill_chunk_size, allow_none=True)
        if (self.prefill_chunk_size is not None and self.max_num_batched_tokens is not None
                and self.prefill_chunk_size != self.max_num_batched_tokens):
            raise ConfigError(f"{s}.prefill_chunk_size ({self.prefill_chunk_size}) and "
                              f"max_num_batched_tokens ({self.max_num_batched_tokens}) name the same "
                              f"budget; set one of them")
        if self.preemption_mode not in ("recompute", "swap"):
            raise ConfigError(f"{s}.preemption_mode must be recompute or swap, "
                              f"got {self.preemption_mode!r}")
        if isinstance(self.swap_space_gib, bool) or not (
                isinstance(self.swap_space_gib, (int, float)) and self.swap_space_gib > 0):
            raise ConfigError(f"{s}.swap_space_gib must be > 0, got {self.swap_space_gib!r}")
        if not isinstance(self.queue_params, dict):
            raise ConfigError(f"{s}.queue_params must be a mapping, got {self.queue_params!r}")
        if self.contiguous_reserve not in ("max_model_len", "pow2", "oracle"):
            raise ConfigError(f"{s}.contiguous_reserve must be one of max_model_len, pow2, oracle, "
                              f"got {self.contiguous_reserve!r}")


@dataclass(frozen=True, slots=True)
class SimConfig:
    model: str = "meta-llama/Llama-3.1-8B"
    gpu: str = "h100-sxm"
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    alerts: dict = field(default_factory=dict)  # rule overrides (alerts.py); {} = seed defaults
    slo: dict = field(default_factory=dict)  # ttft_s / tpot_s targets (metrics.py); {} = defaults
    cluster: dict = field(default_factory=dict)  # replicas / router (cluster.py); {} = one replica

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")
        from simulator.metrics.alerts import resolve_rules  # each section is validated by its owner
        from simulator.metrics.summary import resolve_slo
        resolve_rules(self.alerts)
        resolve_slo(self.slo)
        from simulator.engine.cluster import resolve_cluster
        resolve_cluster(self.cluster)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {"engine": EngineConfig, "workload": WorkloadConfig}


def _field_names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _build(cls, data: dict[str, Any], where: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    names = _field_names(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, names)}; "
                              f"valid: {', '.join(names)}")
        if key in _SECTIONS and cls is SimConfig:
            value = _build(_SECTIONS[key], value or {}, key)
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


def from_dict(data: dict[str, Any]) -> SimConfig:
    return _build(SimConfig, data, "config")


def load_config(path: str | Path | None) -> dict[str, Any]:
    """Raw dict from a YAML file (validated later, after overrides)."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path}: not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: invalid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    return data


def parse_value(text: str) -> Any:
    """A `--set` value as YAML reads it (numbers, booleans, lists), else the text itself."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_override(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` (dotted, or a bare field name of exactly one section) in the raw dict."""
    parts = key.split(".")
    top = _field_names(SimConfig)
    if len(parts) == 1 and parts[0] not in top:
        owners = [s for s, cls in _SECTIONS.items() if parts[0] in _field_names(cls)]
        if len(owners) == 1:
            parts = [owners[0], parts[0]]
        else:
            every = top + [f"{s}.{n}" for s, c in _SECTIONS.items() for n in _field_names(c)]
            raise ConfigError(f"--set: unknown key {key!r}{did_you_mean(key, every)}")
    node = data
    for depth, p in enumerate(parts[:-1]):
        if p not in node:
            # `--set workload.prompt_tokens.mean=600` tweaks the default mapping, not a blank one
            node[p] = _default_mapping(parts[0], p) if depth == 1 else {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {p} is not a section")
    node[parts[-1]] = value


def apply_overrides(data: dict[str, Any], items: list[str] | None, where: str = "") -> None:
    """Apply `--set key=value` items in order to a raw config dict (`where` prefixes errors)."""
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"{where}--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        apply_override(data, k.strip(), parse_value(v))


def _default_mapping(section: str, name: str) -> dict[str, Any]:
    cls = _SECTIONS.get(section)
    for f in dataclasses.fields(cls) if cls else ():
        if f.name == name and f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
            return dict(default) if isinstance(default, dict) else {}
    return {}


def build_config(path: str | Path | None = None, overrides: list[str] | None = None,
                 extra: dict[str, Any] | None = None) -> SimConfig:
    data = load_config(path)
    apply_overrides(data, overrides)
    for k, v in (extra or {}).items():
        apply_override(data, k, v)
    return from_dict(data)


@dataclass(frozen=True, slots=True)
class ResolvedEngine:
    """Engine knobs with every None replaced by the value vLLM would pick."""

    block_size: int
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    tensor_parallel_size: int


def resolve_engine(engine: EngineConfig, gpu_name: str, gpu_memory_gib: float,
                   model_max_len: int) -> ResolvedEngine:
    # vLLM (EngineArgs._set_default_args, OpenAI server entry point): GPUs with >= 70 GiB that
    # are not A100 get max_num_seqs 1024 / max_num_batched_tokens 8192, others 256 / 2048.
    big = gpu_memory_gib >= 70 and not gpu_name.startswith("a100")
    max_model_len = engine.max_model_len or model_max_len
    if max_model_len > model_max_len:
        raise ConfigError(f"engine.max_model_len ({max_model_len}) exceeds the model's "
                          f"max_position_embeddings ({model_max_len})")
    budget = engine.max_num_batched_tokens or engine.prefill_chunk_size or (8192 if big else 2048)
    if not engine.enable_chunked_prefill and budget < max_model_len:
        # vLLM refuses this too: without chunking a prompt of max_model_len must fit one step
        raise ConfigError(f"engine.max_num_batched_tokens ({budget}) must be >= max_model_len "
                          f"({max_model_len}) when enable_chunked_prefill is false")
    return ResolvedEngine(
        block_size=engine.block_size,
        gpu_memory_utilization=engine.gpu_memory_utilization,
        max_model_len=max_model_len,
        max_num_seqs=engine.max_num_seqs or (1024 if big else 256),
        max_num_batched_tokens=budget,
        tensor_parallel_size=engine.tensor_parallel_size,
    )
