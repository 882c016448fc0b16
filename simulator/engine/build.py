"""Config -> engine: validate a SimConfig once (`setup`), then build each replica's scheduler
through the registries (`Backend.build`).

Every plug-in kind has one registry and one params section:

    engine.kv_allocator   ALLOCATORS        engine.kv_allocator_params   factory(KVContext, **params)
    engine.eviction_policy EVICTION_POLICIES engine.eviction_params      cls(pool, block_ids, **params)
    engine.queue_policy   QUEUE_POLICIES    engine.queue_params         cls(QueueContext, **params)
    engine.scheduler      BATCHING_MODES    -                           cls()
    cluster.router        ROUTERS           cluster.router_params       cls(RouterContext, **params)
    engine.backend        BACKENDS          -                           cls() (vllm: imported lazily)

Invariants: every name and every params section is checked in `setup`, before the workload is
generated or anything simulated (one ConfigError naming e.g. engine.eviction_params.ttl_s);
nothing here knows a plug-in by name except LEGACY_PARAMS (older engine fields that still fill
one plug-in's params) and the swap cost rule (a paged cache is copied block by block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from simulator import __version__
from simulator.config.registry import Registry
from simulator.config.schema import EngineConfig, ResolvedEngine, SimConfig, resolve_engine
from simulator.engine.cluster import ClusterSpec, resolve_cluster
from simulator.engine.costmodel import CostModel
from simulator.engine.kvcache import ALLOCATORS
from simulator.engine.kvcache.eviction import EVICTION_POLICIES
from simulator.engine.kvcache.hybrid import layout_params
from simulator.engine.kvcache.offload import build_offload, check_offload, num_cpu_blocks
from simulator.engine.protocols import Backend, KVContext, QueueContext, SchedulerInterface
from simulator.engine.routers import ROUTERS
from simulator.engine.scheduling import BATCHING_MODES, QUEUE_POLICIES, Scheduler
from simulator.engine.swap import SwapSpace
from simulator.errors import ConfigError
from simulator.hardware.gpus import GIB, GpuSpec, get_gpu
from simulator.hardware.memory import MemoryPlan, plan_memory
from simulator.hardware.models import ModelSpec, get_model
from simulator.workload.generators import RequestArrays

# Engine fields older than the plug-in params sections: (section, plug-in) -> the params they
# fill unless the section sets them (engine.eviction_ttl_s is lru_ttl's ttl_s).
LEGACY_PARAMS: dict[tuple[str, str], Callable[[EngineConfig], dict[str, Any]]] = {
    ("eviction_params", "lru_ttl"): lambda eng: {"ttl_s": eng.eviction_ttl_s},
    ("kv_allocator_params", "contiguous"): lambda eng: {"reserve": eng.contiguous_reserve},
}


@dataclass(frozen=True, slots=True)
class ValidatedParams:
    """Each plug-in's params as its own model validated them (defaults filled in)."""

    kv_allocator: dict[str, Any]
    eviction: dict[str, Any]
    queue: dict[str, Any]
    router: dict[str, Any]


@dataclass
class Setup:
    config: SimConfig
    model: ModelSpec
    gpu: GpuSpec
    engine: ResolvedEngine
    memory: MemoryPlan
    cost: CostModel
    params: ValidatedParams | None = field(default=None, repr=False)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    backend: Backend | None = field(default=None, repr=False)
    kv_allocator: str = ""  # the allocator built: engine.kv_allocator, or hybrid (see setup)
    offload_params: dict[str, Any] | None = None  # the CPU offload tier's eviction params (None: off)

    def lines(self) -> list[str]:
        e = self.engine
        formats = self.format_info()
        return [
            f"model {self.model.name} on {self.gpu.name} x tp={e.tensor_parallel_size}; "
            f"{self.kv_allocator or self.config.engine.kv_allocator} KV, {self.config.engine.scheduler} "
            f"batching, max_num_seqs {e.max_num_seqs}, max_num_batched_tokens {e.max_num_batched_tokens}, "
            f"max_model_len {e.max_model_len}",
            *([", ".join(f"{k} {v}" for k, v in formats.items())] if formats else []),
            *self.memory.lines(e.max_model_len),
            self.cost.describe(),
            *(["async scheduling: step n+1 is scheduled while step n runs (two batches in flight, "
               "vLLM 0.33's default; engine.async_scheduling false: synchronous)"]
              if e.async_scheduling else []),
            *(self.backend.lines() if self.backend is not None else []),
            *([self.offload_line()] if self.offload_params is not None else []),
        ]

    def offload_line(self) -> str:
        """vLLM logs the CPU tier's size when --kv-offloading-size is set; kvsim says it here."""
        eng, link = self.config.engine, self.gpu
        n = num_cpu_blocks(eng.kv_offloading_size, self.memory.block_bytes, self.engine.tensor_parallel_size)
        return (f"CPU offload tier: {eng.kv_offloading_size:g} GiB, {n:,} blocks "
                f"({n * self.engine.block_size:,} tokens), eviction {eng.kv_offloading_eviction_policy}, "
                f"host link {link.host_link_gbps:g} GB/s + {link.host_link_latency_us:g} us a transfer")

    def format_info(self) -> dict[str, Any]:
        """The storage and parallelism settings that differ from vLLM's defaults (kv_cache_dtype,
        quantization, expert parallelism, hybrid manager off), for the setup lines and the
        summary's config; empty for a default run, so its outputs do not change."""
        eng = self.config.engine
        info: dict[str, Any] = {}
        if eng.kv_cache_dtype != "auto":
            info["kv_cache_dtype"] = eng.kv_cache_dtype
        if eng.quantization is not None:
            info["quantization"] = eng.quantization
        if eng.enable_expert_parallel:
            info["expert_parallel_size"] = self.engine.tensor_parallel_size * self.cluster.replicas
        if eng.disable_hybrid_kv_cache_manager:
            info["disable_hybrid_kv_cache_manager"] = True
        return info

    def resolved_dict(self) -> dict[str, Any]:
        d = self.config.to_dict()
        if not d.get("cluster"):
            del d["cluster"]  # a single replica's config.yaml stays as it was before clusters
        d["resolved_engine"] = asdict(self.engine)
        d["num_gpu_blocks"] = self.memory.num_gpu_blocks
        d["kvsim_version"] = __version__
        return d


def _with_legacy(eng: EngineConfig, section: str, params: Any, name: str) -> dict[str, Any]:
    """engine.<section> of plug-in `name`, with LEGACY_PARAMS filled in where it is silent."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise ConfigError(f"engine.{section} must be a mapping, got {params!r}")
    legacy = LEGACY_PARAMS.get((section, name))
    return {**legacy(eng), **params} if legacy is not None else dict(params)


def setup(config: SimConfig) -> Setup:
    """Steps: 1. names and plug-in params (a typo is the first error shown, before any memory
    math); 2. the backend's own rules; 3. vLLM's defaults for the GPU (resolve_engine);
    4. the memory plan (num_gpu_blocks; engine.kv_cache_dtype, quantization, expert parallelism);
    5. the cost model; 6. the allocator: hybrid for a hybrid KV cache layout; 7. the CPU
    offload tier's rules (kvcache/offload.py), when engine.kv_offloading_size is set."""
    eng = config.engine
    model = get_model(config.model)
    gpu = get_gpu(config.gpu)
    BATCHING_MODES.get(eng.scheduler)
    queue = QUEUE_POLICIES.validate_params(eng.queue_policy, eng.queue_params, "engine.queue_params")
    kv_allocator = ALLOCATORS.validate_params(
        eng.kv_allocator, _with_legacy(eng, "kv_allocator_params", eng.kv_allocator_params,
                                       eng.kv_allocator), "engine.kv_allocator_params")
    eviction = EVICTION_POLICIES.validate_params(
        eng.eviction_policy, _with_legacy(eng, "eviction_params", eng.eviction_params,
                                          eng.eviction_policy), "engine.eviction_params")
    cluster = resolve_cluster(config.cluster)
    router = ROUTERS.validate_params(cluster.router, cluster.router_params, "cluster.router_params")
    params = ValidatedParams(kv_allocator, eviction, queue, router)
    backend: Backend = BACKENDS.get(eng.backend)()
    backend.check(config)
    engine = resolve_engine(eng, gpu.name, gpu.memory_gib, model.max_position_embeddings)
    # NOTE: vLLM's max_in_flight_tokens is max_concurrent_batches x max_num_batched_tokens: one
    # batch in flight when scheduling synchronously, two with async scheduling; with EP the
    # experts spread over the DP ranks too, and kvsim's DP ranks are the cluster's replicas
    in_flight = (2 if engine.async_scheduling else 1) * engine.max_num_batched_tokens
    memory = plan_memory(model, gpu, tp=engine.tensor_parallel_size, block_size=engine.block_size,
                         gpu_memory_utilization=engine.gpu_memory_utilization,
                         max_num_batched_tokens=engine.max_num_batched_tokens,
                         max_num_seqs=engine.max_num_seqs, max_model_len=engine.max_model_len,
                         activation_reserve_gib=eng.activation_reserve_gib,
                         num_gpu_blocks_override=eng.num_gpu_blocks_override,
                         kv_cache_dtype=eng.kv_cache_dtype, quantization=eng.quantization,
                         enable_expert_parallel=eng.enable_expert_parallel,
                         data_parallel_size=cluster.replicas,
                         max_in_flight_tokens=in_flight,
                         hybrid_kv_cache_manager=not eng.disable_hybrid_kv_cache_manager)
    # 6. a model with several KV cache groups, or a sliding / chunked one, takes the hybrid
    # allocator (vLLM's HybridKVCacheCoordinator) in place of the paged one, its groups from the plan
    allocator = eng.kv_allocator
    if allocator in ("paged", "hybrid") and memory.kv_layout is not None and memory.kv_layout.is_hybrid:
        allocator = "hybrid"
        user = eng.kv_allocator_params if eng.kv_allocator == "hybrid" else {}
        params = ValidatedParams(ALLOCATORS.validate_params(
            "hybrid", {**layout_params(memory.kv_layout, in_flight), **user},
            "engine.kv_allocator_params"), eviction, queue, router)
    cost = CostModel(model, gpu, engine.tensor_parallel_size, engine.max_num_batched_tokens,
                     max_num_seqs=engine.max_num_seqs, async_scheduling=engine.async_scheduling,
                     kv_cache_dtype=eng.kv_cache_dtype, quantization=eng.quantization,
                     enable_expert_parallel=eng.enable_expert_parallel,
                     data_parallel_size=cluster.replicas)
    # 7. the CPU offload tier (vLLM's --kv-offloading-size), when on
    offload = check_offload(eng, kv_allocator=allocator, block_bytes=memory.block_bytes,
                            tp=engine.tensor_parallel_size,
                            swap_gib=eng.swap_space_gib if eng.preemption_mode == "swap" else 0.0)
    return Setup(config, model, gpu, engine, memory, cost, params, cluster, backend, allocator,
                 offload)


def kv_context(s: Setup, workload: RequestArrays) -> KVContext:
    eng, memory = s.config.engine, s.memory
    return KVContext(
        num_gpu_blocks=memory.num_gpu_blocks, block_size=s.engine.block_size,
        kv_budget_slots=(memory.max_tokens if eng.num_gpu_blocks_override
                         else memory.kv_budget_bytes // memory.kv_bytes_per_token),
        max_model_len=s.engine.max_model_len, enable_prefix_caching=eng.enable_prefix_caching,
        eviction_policy=eng.eviction_policy, eviction_params=s.params.eviction,
        prefix_chunk_tokens=workload.prefix_block_tokens)


class KvsimBackend:
    """kvsim's own scheduler over a registry-built KV manager, queue policy and batching mode."""

    def check(self, config: SimConfig) -> None:
        pass  # kvsim models every setting

    def build(self, s: Setup, workload: RequestArrays, *, vectorized: bool = True
              ) -> SchedulerInterface:
        """1. the KV manager (ALLOCATORS, from the KV context); 2. the swap space, when
        preempting by swap; 3. the queue policy; 4. the batching mode; 5. the scheduler."""
        eng, e = s.config.engine, s.engine
        name = s.kv_allocator or eng.kv_allocator
        kv = ALLOCATORS.build(name, s.params.kv_allocator,
                              "engine.kv_allocator_params", kv_context(s, workload))
        swap = None
        if eng.preemption_mode == "swap":
            # vLLM v0 copies a paged cache block by block; a contiguous one moves one region
            swap = SwapSpace(int(eng.swap_space_gib * GIB), kv.block_size,
                             s.memory.kv_bytes_per_token, s.gpu.host_link_gbps,
                             s.gpu.host_link_latency_us * 1e-6,
                             per_block_transfers=name in ("paged", "hybrid"),
                             tensors=2 * s.model.num_layers)
        queue = QUEUE_POLICIES.build(eng.queue_policy, s.params.queue, "engine.queue_params",
                                     QueueContext(e.max_num_seqs, kv.total_slots, workload.tier))
        offload = None
        if s.offload_params is not None:
            offload = build_offload(kv, eng.kv_offloading_size, s.memory.block_bytes,
                                    e.tensor_parallel_size, eng.kv_offloading_eviction_policy,
                                    s.offload_params, s.gpu.host_link_gbps,
                                    s.gpu.host_link_latency_us * 1e-6)
        return Scheduler(kv, queue, BATCHING_MODES.get(eng.scheduler)(),
                         max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                         chunked_prefill=eng.enable_chunked_prefill, swap=swap,
                         reserve_full_isl=eng.scheduler_reserve_full_isl, vectorized=vectorized,
                         window_tokens=s.cost.window_tokens, offload=offload,
                         async_scheduling=e.async_scheduling)

    def lines(self) -> list[str]:
        return []

    def info(self) -> dict[str, str]:
        return {}  # kvsim's summaries name no backend


BACKENDS: Registry = Registry("backend")
BACKENDS.register("kvsim")(KvsimBackend)
# a higher layer (simulator.backends), imported only when a config names it
BACKENDS.register_lazy("vllm", "simulator.backends.vllm:VllmBackend")
