"""Build a simulation from a SimConfig, run it, write its outputs.

Outputs in the run directory:
- summary.json     the run summary (metrics.py documents every field), sorted keys
- requests.parquet one row per request (finished and rejected)
- iterations.parquet one row per engine step
- config.yaml      the resolved configuration (every default filled in)
- timeseries.parquet, openmetrics.txt, alerts.json   monitoring (metrics.write_monitoring)
Same config + seed => byte-identical files: no wall clock and no global RNG reach them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy
import yaml

from simulator import __version__
from simulator.config.schema import ResolvedEngine, SimConfig, resolve_engine
from simulator.engine.costmodel import CostModel
from simulator.engine.kvcache import build_allocator
from simulator.engine.replica import Replica, feed_arrivals
from simulator.engine.scheduling import BATCHING_MODES, QUEUE_POLICIES, Scheduler
from simulator.engine.swap import SwapSpace
from simulator.errors import ConfigError
from simulator.hardware.gpus import GIB, GpuSpec, get_gpu
from simulator.hardware.memory import MemoryPlan, plan_memory
from simulator.hardware.models import ModelSpec, get_model
from simulator.metrics.summary import MetricsRecorder, clean_floats, summarize, write_monitoring
from simulator.workload.generators import RequestArrays
from simulator.workload.load import generate


@dataclass
class Setup:
    config: SimConfig
    model: ModelSpec
    gpu: GpuSpec
    engine: ResolvedEngine
    memory: MemoryPlan
    cost: CostModel

    def lines(self) -> list[str]:
        e = self.engine
        return [
            f"model {self.model.name} on {self.gpu.name} x tp={e.tensor_parallel_size}; "
            f"{self.config.engine.kv_allocator} KV, {self.config.engine.scheduler} batching, "
            f"max_num_seqs {e.max_num_seqs}, max_num_batched_tokens {e.max_num_batched_tokens}, "
            f"max_model_len {e.max_model_len}",
            *self.memory.lines(e.max_model_len),
            self.cost.describe(),
            *self._backend_lines(),
        ]

    def _backend_lines(self) -> list[str]:
        if self.config.engine.backend != "vllm":
            return []
        from simulator.backends.vllm import backend_info
        info = backend_info()
        return [f"backend: vLLM's own v1 Scheduler, vLLM {info['vllm_version']} (parity verified "
                f"against {info['vllm_verified_version']}), sync"]

    def resolved_dict(self) -> dict[str, Any]:
        d = self.config.to_dict()
        if not d.get("cluster"):
            del d["cluster"]  # a single replica's config.yaml stays as it was before clusters
        d["resolved_engine"] = asdict(self.engine)
        d["num_gpu_blocks"] = self.memory.num_gpu_blocks
        d["kvsim_version"] = __version__
        return d


def setup(config: SimConfig) -> Setup:
    # Names are validated before any memory math so that a typo is the first error shown.
    model = get_model(config.model)
    gpu = get_gpu(config.gpu)
    BATCHING_MODES.get(config.engine.scheduler)
    QUEUE_POLICIES.get(config.engine.queue_policy)(**config.engine.queue_params)  # validates
    from simulator.engine.kvcache import ALLOCATORS
    from simulator.engine.kvcache.eviction import EVICTION_POLICIES
    ALLOCATORS.get(config.engine.kv_allocator)
    EVICTION_POLICIES.get(config.engine.eviction_policy)
    engine = resolve_engine(config.engine, gpu.name, gpu.memory_gib, model.max_position_embeddings)
    memory = plan_memory(model, gpu, tp=engine.tensor_parallel_size, block_size=engine.block_size,
                         gpu_memory_utilization=engine.gpu_memory_utilization,
                         max_num_batched_tokens=engine.max_num_batched_tokens,
                         max_num_seqs=engine.max_num_seqs, max_model_len=engine.max_model_len,
                         activation_reserve_gib=config.engine.activation_reserve_gib,
                         num_gpu_blocks_override=config.engine.num_gpu_blocks_override)
    cost = CostModel(model, gpu, engine.tensor_parallel_size, engine.max_num_batched_tokens)
    return Setup(config, model, gpu, engine, memory, cost)


@dataclass
class Result:
    setup: Setup
    summary: dict[str, Any]
    requests: pd.DataFrame
    iterations: pd.DataFrame
    wall_s: float = field(default=0.0)  # informational only, never written to outputs
    scheduler: Scheduler | None = field(default=None, repr=False)  # final state, for inspection

    def write(self, out_dir: str | Path, *, interval_s: float = 1.0) -> Path:
        """The run directory; `interval_s` is the sampling interval of the time series."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(
            json.dumps(clean_floats(self.summary), indent=2, sort_keys=True) + "\n")
        (out / "config.yaml").write_text(yaml.safe_dump(self.setup.resolved_dict(), sort_keys=True))
        self.requests.to_parquet(out / "requests.parquet", index=False)
        self.iterations.to_parquet(out / "iterations.parquet", index=False)
        write_monitoring(out, self.requests, self.iterations, alerts=self.setup.config.alerts,
                         interval_s=interval_s, labels={"model_name": self.setup.model.name})
        return out


def build_engine(s: Setup, workload: RequestArrays, make_recorder: Callable[[int], MetricsRecorder]
                 = MetricsRecorder) -> tuple[Scheduler, MetricsRecorder]:
    """One replica's engine from a Setup: KV allocator, optional swap space, queue policy,
    batching mode, and the scheduler over them with its metrics recorder (the cluster builds
    one per replica)."""
    config, e = s.config, s.engine
    eng = config.engine
    if eng.backend == "vllm":  # vLLM's own scheduler and block pool (vllm_backend.py)
        from simulator.backends.vllm import build_vllm_engine
        return build_vllm_engine(s, workload, make_recorder)
    if eng.kv_allocator == "paged":
        kv = build_allocator("paged", num_blocks=s.memory.num_gpu_blocks,
                             block_size=e.block_size, enable_prefix_caching=eng.enable_prefix_caching,
                             eviction=eng.eviction_policy,
                             eviction_params={"ttl_s": eng.eviction_ttl_s}
                             if eng.eviction_policy == "lru_ttl" else {},
                             prefix_chunk_tokens=getattr(workload, "prefix_block_tokens", 512))
    else:
        kv = build_allocator(config.engine.kv_allocator,
                             total_slots=s.memory.max_tokens if eng.num_gpu_blocks_override
                             else s.memory.kv_budget_bytes // s.memory.kv_bytes_per_token,
                             reserve=config.engine.contiguous_reserve, max_model_len=e.max_model_len)
    recorder = make_recorder(kv.total_slots)
    swap = None
    if eng.preemption_mode == "swap":
        swap = SwapSpace(int(eng.swap_space_gib * GIB), kv.block_size,
                         s.memory.kv_bytes_per_token, s.gpu.host_link_gbps,
                         s.gpu.host_link_latency_us * 1e-6,
                         per_block_transfers=eng.kv_allocator == "paged",
                         tensors=2 * s.model.num_layers)
    scheduler = Scheduler(kv, QUEUE_POLICIES.get(eng.queue_policy)(**eng.queue_params),
                          BATCHING_MODES.get(eng.scheduler)(),
                          max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                          recorder=recorder, chunked_prefill=eng.enable_chunked_prefill, swap=swap,
                          reserve_full_isl=eng.scheduler_reserve_full_isl)
    if eng.queue_policy == "tiered" and eng.queue_params.get("by") == "tier":
        tiers = getattr(workload, "tier", None)
        if tiers is None:
            raise ConfigError("engine.queue_params.by is 'tier' but the workload has no tier column")
        scheduler.queue.check_names(np.unique(tiers.astype(str)).tolist())
    return scheduler, recorder


def run_config_summary(s: Setup) -> dict[str, Any]:
    """The `config` section of a summary: what identifies the run."""
    config, e = s.config, s.engine
    return {"model": s.model.name, "gpu": s.gpu.name,
            "tensor_parallel_size": e.tensor_parallel_size,
            "kv_allocator": config.engine.kv_allocator,
            "scheduler": config.engine.scheduler, "seed": config.seed,
            "num_gpu_blocks": s.memory.num_gpu_blocks, "block_size": e.block_size,
            "cost_model_calibrated": s.cost.calibrated}


def run(config: SimConfig, workload: RequestArrays | None = None, *, progress=None,
        vectorized: bool = True, trace=None, on_setup: Callable[[Setup], None] | None = None) -> Result:
    """Steps: 1. setup (names, memory, cost); 2. workload from the seed; 3. SimPy run until
    every arrival has finished or been rejected; 4. summary. `trace`: a StepTrace to fill;
    `on_setup(setup)` is called once setup is done, before any simulation work."""
    if config.cluster:
        from simulator.engine.cluster import resolve_cluster, run_cluster
        if resolve_cluster(config.cluster).replicas > 1:
            return run_cluster(config, workload, progress=progress, vectorized=vectorized)
    s = setup(config)
    if on_setup is not None:
        on_setup(s)
    e = s.engine
    seeds = np.random.SeedSequence(config.seed).spawn(2)
    if workload is None:
        workload = generate(config.workload, seeds[0])
    scheduler, recorder = build_engine(s, workload)
    scheduler.vectorized = vectorized
    env = simpy.Environment()
    tick = None
    if progress is not None:
        total = len(workload)

        def tick() -> None:
            progress(len(recorder.requests), total)
    replica = Replica(env, scheduler, s.cost, recorder, e.max_model_len, on_iteration=tick)
    replica.trace = trace  # a steptrace.StepTrace, or None
    env.process(feed_arrivals(env, workload, replica))
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    summary = summarize(recorder, replica.num_arrived, slo=config.slo, alerts=config.alerts,
                        kv_allocator=config.engine.kv_allocator)
    summary["config"] = run_config_summary(s)
    if config.engine.backend == "vllm":  # only then, so kvsim's summaries stay as they were
        from simulator.backends.vllm import backend_info
        summary["config"].update(backend_info())
    add_engine_sections(summary, scheduler)
    return Result(s, summary, recorder.requests_frame(), recorder.iterations_frame(), wall, scheduler)


def add_engine_sections(summary: dict[str, Any], scheduler) -> None:
    """What only the engine's final state knows: prefix-cache evictions and the idle age of the
    evicted blocks, and swap traffic (summary `swap` section, present when swapping is on)."""
    kv = scheduler.kv
    pool = getattr(kv, "pool", None)
    if getattr(kv, "enable_prefix_caching", False) and pool is not None:
        idle = np.asarray(pool.evicted_idle_s)
        summary["prefix_cache"]["evictions"] = int(pool.num_evictions)
        summary["prefix_cache"]["evicted_idle_s"] = {
            name: (float(f(idle)) if len(idle) else None)
            for name, f in (("mean", np.mean), ("p50", np.median),
                            ("p99", lambda x: np.percentile(x, 99)))}
    swap = getattr(scheduler, "swap", None)
    if swap is not None:
        busy = summary["busy_s"]
        summary["swap"] = {"swap_outs": swap.num_swap_outs, "swap_ins": swap.num_swap_ins,
                           "bytes": int(swap.bytes_moved), "seconds": swap.seconds,
                           "time_share": swap.seconds / busy if busy > 0 else 0.0,
                           "fallbacks_to_recompute": scheduler.num_preemptions - swap.num_swap_outs}
