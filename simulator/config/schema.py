"""Configuration: gathered from YAML + `--set` overrides + vLLM-style flags, validated once.

`SimConfig` is a tree of frozen pydantic sections (fields.Section): engine, workload, slo,
alerts, cluster. It is built once, at load (from_dict / build_config); every rule is one
ConfigError naming the dotted field, the value and the allowed range, and unknown keys are
rejected with a "did you mean" hint. `to_dict()` holds every section in force, defaults
included: a run directory's config.yaml.
Relative paths in a YAML file resolve against the file's own folder first (paths.rebase_paths).
`None` engine defaults are resolved against the GPU like vLLM does (`resolve_engine`).
Plug-in names (kv_allocator, eviction_policy, scheduler, queue_policy, cluster.router) and
their params are checked by the engine against its registries: config is below the engine.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from simulator.config.fields import (
    Bool,
    Name,
    NonNegInt,
    Params,
    PosInt,
    Section,
    Text,
    config_error,
    dump,
    fail,
    number,
    one_of,
    tagged_fields,
    union_tag,
)
from simulator.config.paths import rebase_paths
from simulator.config.sections import AlertsConfig, ClusterConfig, SloConfig
from simulator.config.workload import WorkloadConfig
from simulator.errors import ConfigError, did_you_mean

# vLLM's --kv-cache-dtype and --quantization names that kvsim models (hardware/dtypes.py holds
# their bytes; config sits below hardware, so the names are repeated here: tests/test_config.py
# checks that both lists agree).
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
QUANTIZATIONS = ("bf16", "fp8", "w4a16", "mxfp4", "nvfp4", "none", "fp16", "bfloat16", "float16", "int4",
                 "gptq", "awq", "gptq_marlin", "awq_marlin", "gpt_oss_mxfp4", "modelopt_fp4")


class EngineConfig(Section):
    """Engine knobs, named as vLLM names them. None = vLLM's default for the GPU."""

    where: ClassVar[str] = "engine"

    block_size: PosInt = 16  # vLLM's default on CUDA
    gpu_memory_utilization: number("must be in (0, 1]", gt=0, le=1) = 0.9  # type: ignore[valid-type]  # vLLM's
    max_model_len: PosInt | None = None  # None: the model's max_position_embeddings (vLLM)
    max_num_seqs: PosInt | None = None  # None: 256, or 1024 on >= 70 GiB non-A100 GPUs (vLLM)
    max_num_batched_tokens: PosInt | None = None  # None: 2048, or 8192 on >= 70 GiB non-A100 (vLLM)
    tensor_parallel_size: PosInt = 1
    activation_reserve_gib: number("must be >= 0", ge=0) | None = None  # type: ignore[valid-type]  # None: estimated
    num_gpu_blocks_override: PosInt | None = None  # vLLM's flag: use this many KV blocks instead
    kv_allocator: Name = "paged"  # paged | contiguous (or a plug-in)
    kv_allocator_params: Params = {}  # the allocator's own params (checked by its params model)
    contiguous_reserve: one_of("max_model_len", "pow2", "oracle") = "max_model_len"  # type: ignore[valid-type]
    enable_prefix_caching: Bool = True  # vLLM v1's default (paged only)
    eviction_policy: Name = "lru"  # lru | lru_ttl | lfu (which cached blocks are reused first)
    eviction_params: Params = {}  # the policy's own params (checked by its params model)
    # lru_ttl: blocks not accessed for this long are evicted first (.inf: never)
    eviction_ttl_s: number("must be > 0 seconds", finite=False, gt=0) = 60.0  # type: ignore[valid-type]
    scheduler: Name = "continuous"  # continuous | static
    enable_chunked_prefill: Bool = True  # vLLM v1; false: prefill-first steps (vLLM v0)
    prefill_chunk_size: PosInt | None = None  # the seed's name for the token budget per step
    queue_policy: Name = "fcfs"  # fcfs | priority | tiered
    queue_params: Params = {}  # tiered: {by, tiers: [...]}
    preemption_mode: one_of("recompute", "swap", text="must be recompute or swap") = "recompute"  # type: ignore[valid-type]
    swap_space_gib: number("must be > 0", gt=0) = 4.0  # type: ignore[valid-type]  # CPU swap space per GPU, vLLM v0's
    # vLLM's --kv-offloading-size (GiB, summed over the TP ranks; None or 0: off) and
    # --kv-offloading-backend: a CPU tier of KV blocks behind the prefix cache (kvcache/offload.py)
    kv_offloading_size: number("must be a number of GiB >= 0", ge=0) | None = None  # type: ignore[valid-type]
    kv_offloading_backend: one_of("native", "lmcache") = "native"  # type: ignore[valid-type]
    # the CPU tier's eviction: lru (vLLM's LRUCachePolicy) | lru_ttl (ours); params: lru_ttl's ttl_s
    kv_offloading_eviction_policy: Name = "lru"
    kv_offloading_eviction_params: Params = {}
    # host memory of the node the replica runs on, the bound for kv_offloading_size + swap space;
    # default 2048 GiB: DGX H100 / H200 system memory, 2 TB (NVIDIA DGX H100/H200 datasheet)
    host_memory_gib: number("must be > 0", gt=0) = 2048  # type: ignore[valid-type]
    # vLLM 0.33's default: admit a waiting request only if its whole sequence fits the KV pool
    scheduler_reserve_full_isl: Bool = True
    backend: one_of("kvsim", "vllm", text="must be kvsim or vllm") = "kvsim"  # type: ignore[valid-type]  # vllm: docs/parity.md
    # vLLM's --kv-cache-dtype (auto: the model's dtype; fp8*: one byte, docs/models.md)
    kv_cache_dtype: one_of(*KV_CACHE_DTYPES) = "auto"  # type: ignore[valid-type]
    # vLLM's --quantization (None: the checkpoint's quantization_config, else 16-bit weights)
    quantization: one_of(*QUANTIZATIONS) | None = None  # type: ignore[valid-type]
    # vLLM's --enable-expert-parallel: routed experts spread whole over tp x cluster.replicas GPUs
    enable_expert_parallel: Bool = False
    # vLLM's --disable-hybrid-kv-cache-manager: sliding / chunked layers keep every token
    disable_hybrid_kv_cache_manager: Bool = False
    # event: pure-decode steps between events advance at once (docs/performance.md); step: one
    # step at a time (the reference; same outputs)
    advance: one_of("event", "step", text="must be event or step") = "event"  # type: ignore[valid-type]
    # vLLM's --async-scheduling / --no-async-scheduling: schedule step n+1 while step n runs (two
    # batches in flight). None: vLLM 0.33's default, on unless an incompatible option is set
    # (resolve_engine); true with an incompatible option is an error, as in vLLM
    async_scheduling: Bool | None = None

    @model_validator(mode="after")
    def _one_budget(self) -> EngineConfig:
        if (self.prefill_chunk_size is not None and self.max_num_batched_tokens is not None
                and self.prefill_chunk_size != self.max_num_batched_tokens):
            raise fail(f".prefill_chunk_size ({self.prefill_chunk_size}) and max_num_batched_tokens "
                       f"({self.max_num_batched_tokens}) name the same budget; set one of them")
        return self

    def to_dict(self) -> dict[str, Any]:
        """Section.to_dict, less the CPU offload tier's fields while the tier is off and they
        hold their defaults: a run without the tier writes the config.yaml it wrote before."""
        d = super().to_dict()
        if not self.kv_offloading_size:
            for name in OFFLOAD_FIELDS:
                if d[name] == EngineConfig.model_fields[name].default:
                    del d[name]
        return d


# engine fields of the CPU offload tier (EngineConfig.to_dict leaves them out while it is off)
OFFLOAD_FIELDS = ("kv_offloading_size", "kv_offloading_backend", "kv_offloading_eviction_policy",
                  "kv_offloading_eviction_params", "host_memory_gib")


class SimConfig(Section):
    """One simulation: model, GPU, seed and the sections. Sections left out (or null) are
    their defaults."""

    model: Text = "meta-llama/Llama-3.1-8B"  # a catalogue name or a path to a config.json
    gpu: Text = "h100-sxm"  # a catalogue name or a path to a profile YAML
    seed: NonNegInt = 0
    engine: EngineConfig = EngineConfig()
    workload: WorkloadConfig = WorkloadConfig()
    alerts: AlertsConfig = AlertsConfig.from_section(None)  # the default rules; YAML overlays them
    slo: SloConfig = SloConfig()  # ttft_s / tpot_s targets
    cluster: ClusterConfig = ClusterConfig()  # one replica

    @model_validator(mode="before")
    @classmethod
    def _null_sections(cls, data: Any) -> Any:
        if isinstance(data, dict) and any(data.get(k, 0) is None for k in _ALL_SECTIONS):
            data = {k: v for k, v in data.items() if not (k in _ALL_SECTIONS and v is None)}
        return data

    def replace(self, **changes: Any) -> SimConfig:
        """A copy with top-level fields changed, validated (dataclasses.replace, for a model)."""
        try:
            return SimConfig.model_validate({**self.__dict__, **changes})
        except ValidationError as e:
            raise config_error(e) from None


_ALL_SECTIONS = ("engine", "workload", "alerts", "slo", "cluster")
# Sections with fixed field names (a bare `--set name=value` names one of their fields).
SECTIONS: dict[str, type[Section]] = {"engine": EngineConfig, "workload": WorkloadConfig,
                                      "slo": SloConfig, "cluster": ClusterConfig}
_SECTIONS = SECTIONS  # the name analysis/sweep.py imports


def _field_names(cls: type[BaseModel]) -> list[str]:
    return list(cls.model_fields)


def from_dict(data: dict[str, Any]) -> SimConfig:
    """The validated config from raw data (YAML + overrides), or one ConfigError line."""
    if not isinstance(data, dict):
        raise ConfigError(f"config: expected a mapping, got {type(data).__name__}")
    try:
        return SimConfig.model_validate(data)
    except ValidationError as e:
        raise config_error(e) from None


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML parse error on one line: where (1-based line and column) and what."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"line {mark.line + 1}, column {mark.column + 1}: {e.problem or e.context}"
    return str(e).splitlines()[0]


def read_yaml(path: Path, what: str) -> Any:
    """A YAML file's data; ConfigError `what: invalid YAML (line, column: problem)` or `what:
    not UTF-8 text (...)` on one line (`what` names the file as the caller's errors do)."""
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{what}: invalid YAML ({yaml_problem(e)})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what}: not UTF-8 text ({e})") from None


def load_config(path: str | Path | None) -> dict[str, Any]:
    """Raw dict from a YAML file (validated later, after overrides). Relative paths in it that
    exist beside the file are rewritten to reach them (paths.rebase_paths); an empty file is
    refused (it would silently run the defaults)."""
    if path is None:
        return {}
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"config file {path}: is a folder; give the YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {path}: not found" if not path.exists() else
                          f"config file {path}: not a regular file")
    data = read_yaml(path, f"config file {path}")
    if data is None:
        raise ConfigError(f"config file {path}: no settings (the file is empty or holds only "
                          f"comments); write {{}} to run the defaults")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: top level must be a mapping")
    return rebase_paths(data, path.parent)


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def parse_value(text: str) -> Any:
    """A `--set` value as YAML reads it (numbers, booleans, lists), else the text itself.
    NOTE: `1e3` is a number, as it is in JSON, Python and YAML 1.2 (PyYAML's YAML 1.1 reads a
    float only with a dot, `1.0e3`, and gave the string '1e3')."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        return float(value)
    return value


@dataclass(slots=True)
class _Defaulted:
    """A tagged mapping `--set` copied from its field's default (the default lognormal of
    workload.output_tokens): its tag key, the default as data, and the keys still as copied
    (not given by the user since)."""

    tag: str
    default: dict[str, Any]
    keys: set[str]


Origins = dict[int, tuple[dict[str, Any], _Defaulted]]  # id(mapping) -> (it, what it holds from its default)


def apply_override(data: dict[str, Any], key: str, value: Any, origins: Origins | None = None) -> None:
    """Set `key` (dotted, or a bare field name of exactly one section) in the raw dict.
    `origins` (one per sequence of overrides, `apply_overrides`): what the sequence copied from
    fields' defaults, so that switching a copied tagged mapping to another member
    (`workload.output_tokens.dist=constant`) keeps only the default's keys the new member takes
    (`_switch_member`); without it a switch keeps every key."""
    parts = key.split(".")
    top = _field_names(SimConfig)
    if len(parts) == 1 and parts[0] not in top:
        owners = [s for s, cls in SECTIONS.items() if parts[0] in _field_names(cls)]
        if len(owners) == 1:
            parts = [owners[0], parts[0]]
        else:
            every = top + [f"{s}.{n}" for s, c in SECTIONS.items() for n in _field_names(c)]
            raise ConfigError(f"--set: unknown key {key!r}{did_you_mean(key, every)}")
    node = data
    for depth, p in enumerate(parts[:-1]):
        if p not in node:
            # `--set workload.prompt_tokens.mean=600` tweaks the default mapping, not a blank one
            node[p] = _default_mapping(parts[0], p, origins) if depth == 1 else {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: {p} is not a section")
    leaf = parts[-1]
    copied = origins.get(id(node)) if origins and len(parts) == 3 else None
    node[leaf] = value
    if copied is not None and copied[0] is node:
        d = copied[1]
        if leaf == d.tag:
            _switch_member(node, d)
        else:
            d.keys.discard(leaf)


def _switch_member(node: dict[str, Any], d: _Defaulted) -> None:
    """A mapping copied from its default now names another member by its tag: each key still as
    copied stays (at the default's value) where the member takes it and goes where it does not,
    so `dist=constant` drops the default lognormal's mean and cv, keeps its min and max, and
    `dist=lognormal` after it brings them back; a key the user gave stays (and is refused by
    name if the member does not take it). An unknown member: nothing moves (refused later)."""
    fields = tagged_fields(d.tag, node[d.tag])
    if fields is None:
        return
    for k in d.keys:
        if k in fields:
            node[k] = d.default[k]
        else:
            node.pop(k, None)


def split_override(item: str, flag: str = "--set") -> tuple[str, Any]:
    """`key=value` -> (key, YAML-typed value): the one parser of `--set`-style pairs."""
    if "=" not in item:
        raise ConfigError(f"{flag} expects key=value, got {item!r}")
    k, v = item.split("=", 1)
    return k.strip(), parse_value(v)


def apply_overrides(data: dict[str, Any], items: list[str] | None, where: str = "",
                    origins: Origins | None = None) -> None:
    """Apply `--set key=value` items in order to a raw config dict (`where` prefixes errors);
    `origins`: as apply_override's, shared with overrides applied after these (one is made for
    the items when none is given)."""
    origins = {} if origins is None else origins
    for item in items or []:
        apply_override(data, *split_override(item, f"{where}--set"), origins)


def _default_mapping(section: str, name: str, origins: Origins | None = None) -> dict[str, Any]:
    """The default of a mapping-valued field as plain data ({} if it has none); a tagged one is
    noted in `origins` (apply_override)."""
    cls = SECTIONS.get(section)
    info = cls.model_fields.get(name) if cls else None
    default = info.get_default(call_default_factory=True) if info else None
    if not isinstance(default, (dict, BaseModel)):
        return {}
    data = dump(default)
    tag = union_tag(default)
    if origins is not None and tag is not None and tag in data:
        origins[id(data)] = (data, _Defaulted(tag, dict(data), set(data) - {tag}))
    return data


def build_config(path: str | Path | None = None, overrides: list[str] | None = None,
                 extra: dict[str, Any] | None = None) -> SimConfig:
    data = load_config(path)
    origins: Origins = {}
    apply_overrides(data, overrides, origins=origins)
    for k, v in (extra or {}).items():
        apply_override(data, k, v, origins)
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
    async_scheduling: bool = False


def async_incompatible(engine: EngineConfig) -> str:
    """The first kvsim option whose engine schedules synchronously, as 'engine.X value (why)',
    or ''. vLLM 0.33 turns async scheduling off for options its AsyncScheduler cannot serve
    (pooling models, pipeline parallelism, some speculative decoding; none of them modelled
    here); kvsim's modes below are not vLLM v1's engine, whose AsyncScheduler is the only one
    that schedules ahead."""
    if not engine.enable_chunked_prefill:
        return "engine.enable_chunked_prefill false (prefill-first steps are vLLM v0's, synchronous)"
    if engine.scheduler == "static":
        return "engine.scheduler 'static' (static batching forms a batch only when none runs)"
    if engine.preemption_mode == "swap":
        return "engine.preemption_mode 'swap' (swap preemption is vLLM v0's, synchronous)"
    if engine.kv_offloading_size:
        # NOTE: vLLM runs its OffloadingConnector under async scheduling too; kvsim's CPU tier
        # (kvcache/offload.py) is modelled on the synchronous loop only so far
        return "engine.kv_offloading_size (kvsim models the CPU offload tier on the synchronous loop only)"
    return ""


def resolve_async_scheduling(engine: EngineConfig) -> bool:
    """vLLM 0.33's rule (vllm/config/vllm.py, VllmConfig.__post_init__): None -> True unless an
    incompatible option is set (then False); True with one -> ConfigError; False -> False."""
    bad = async_incompatible(engine)
    if engine.async_scheduling is None:
        return not bad
    if engine.async_scheduling and bad:
        raise ConfigError(f"engine.async_scheduling true is not supported with {bad}; set "
                          f"engine.async_scheduling false or leave it unset")
    return bool(engine.async_scheduling)


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
        async_scheduling=resolve_async_scheduling(engine),
    )
