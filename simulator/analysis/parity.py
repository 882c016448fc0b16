"""Step-by-step parity between kvsim's scheduler and vLLM's own (`engine.backend: vllm`).

`run_pair(config)` runs one config on both backends with a StepTrace each and compares the
traces step by step (steptrace.first_divergence); the end-to-end metrics of both runs come
with it. `CASES` are the parity matrix's named workloads: fcfs / priority, prefix caching
off / on (shared system prompts and multi-turn sessions), on KV pools small enough to force
preemption, each in vLLM 0.33's default async scheduling (vLLM's AsyncScheduler, two batches
in flight; the plain name) and synchronous (`-sync`, vLLM's Scheduler). Every case uses the
same engine shape so that each seed runs in seconds.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

from simulator.config.schema import SimConfig, apply_overrides, from_dict
from simulator.engine.steptrace import StepTrace, first_divergence
from simulator.errors import ConfigError

_ENGINE = {"max_model_len": 2048, "max_num_seqs": 64, "max_num_batched_tokens": 512,
           "num_gpu_blocks_override": 320}  # 319 usable blocks of 16: preemption under load
_LENGTHS = {"prompt_tokens": {"dist": "lognormal", "mean": 300, "cv": 1.0, "max": 1500},
            "output_tokens": {"dist": "lognormal", "mean": 60, "cv": 1.0, "max": 400}}
_SHARED = {"system_prompts": {"count": 4, "zipf_s": 1.0,
                              "tokens": {"dist": "lognormal", "mean": 400, "cv": 0.3, "max": 800}},
           "sessions": {"turns": {"dist": "uniform", "low": 1, "high": 4},
                        "think_time_s": {"dist": "constant", "value": 1.0}}}
_TENANTS = [{"name": "interactive", "priority": 0, "tier": "interactive",
             "arrival": {"process": "poisson", "rate": 12.0}},
            {"name": "batch", "priority": 1, "tier": "batch",
             "arrival": {"process": "poisson", "rate": 12.0}}]


def _case(policy: str, caching: bool, async_scheduling: bool = True) -> dict[str, Any]:
    workload: dict[str, Any] = {"arrival": {"process": "poisson", "rate": 24.0}, **_LENGTHS}
    if caching:
        workload.update(copy.deepcopy(_SHARED))
        workload["prefix_block_tokens"] = 16  # shared system prompts share whole 16-token blocks
    if policy == "priority":
        workload["tenants"] = copy.deepcopy(_TENANTS)
        if caching:  # a tenant that names no sharing of its own gets no prefix ids
            for tenant in workload["tenants"]:
                tenant.update(copy.deepcopy(_SHARED))
    return {"engine": {**_ENGINE, "queue_policy": policy, "enable_prefix_caching": caching,
                       "async_scheduling": async_scheduling},
            "workload": workload}


CASES: dict[str, dict[str, Any]] = {
    f"{policy}-{'cache' if caching else 'nocache'}{'' if mode else '-sync'}": _case(policy, caching, mode)
    for mode in (True, False) for policy in ("fcfs", "priority") for caching in (False, True)}


def case_config(case: str, seed: int, num_requests: int = 500,
                overrides: list[str] | None = None) -> SimConfig:
    if case not in CASES:
        raise ConfigError(f"parity case {case!r} unknown; cases: {', '.join(CASES)}")
    data = copy.deepcopy(CASES[case])
    data["seed"] = seed
    data["workload"]["num_requests"] = num_requests
    apply_overrides(data, overrides)
    return from_dict(data)


@dataclass
class PairResult:
    config: SimConfig
    traces: dict[str, list[dict]]
    summaries: dict[str, dict]
    wall_s: dict[str, float]
    divergence: tuple[int, str] | None = None
    results: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def describe_divergence(self) -> str:
        if self.divergence is None:
            return "identical"
        step, key = self.divergence
        a, b = self.traces["kvsim"], self.traces["vllm"]
        ra = a[step] if step < len(a) else None
        rb = b[step] if step < len(b) else None
        return (f"first divergence at step {step} ({key}):\n  kvsim: {ra}\n  vllm:  {rb}")


def _with_backend(config: SimConfig, backend: str) -> SimConfig:
    data = config.to_dict()
    data["engine"]["backend"] = backend
    if not data.get("cluster"):
        data.pop("cluster", None)
    return from_dict(data)


def run_pair(config: SimConfig, *, vectorized: bool = True) -> PairResult:
    """Run `config` on kvsim's scheduler and on vLLM's; compare traces step by step."""
    from simulator.engine.run import run
    traces, summaries, walls, results = {}, {}, {}, {}
    for backend in ("vllm", "kvsim"):  # vllm first: a missing install fails before any work
        trace = StepTrace()
        t0 = time.perf_counter()
        res = run(_with_backend(config, backend), trace=trace, vectorized=vectorized)
        walls[backend] = time.perf_counter() - t0
        traces[backend] = trace.rows
        summaries[backend] = res.summary
        results[backend] = res
    return PairResult(config, traces, summaries, walls,
                      first_divergence(traces["kvsim"], traces["vllm"]), results)
