"""Cost model: seconds for one engine iteration, a pure function of the batch composition.

A batch is summarised by four numbers (`StepShape`), enough for every term below:
- num_tokens   T = sum of tokens scheduled this step (prefill chunks + decodes)
- num_sampled  S = requests that sample a token this step (decodes + last prefill chunks)
- attn_pairs   P = sum over requests of n*c + n*(n+1)/2 (query-key pairs under the causal
                   mask, for n new tokens after c cached/computed ones; a decode has n=1)
- kv_tokens    K = sum over requests of c + n (KV entries attention reads)

Per layer, per tensor-parallel shard:
1. Linear layers (QKV, O, gate/up, down; MoE: the experts the T tokens touch): each GEMM is a
   roofline, max(FLOPs / (peak * compute_eff), bytes / (bw * bandwidth_eff)), bytes = weights
   + activations in and out. Depends on T only, so it is tabulated once for T = 0..max_tokens.
2. Element-wise ops (norms, rope, activation, residual adds): memory-bound, ~elementwise_passes
   reads+writes of T * hidden.
3. Attention: max(4 * P * heads * head_dim / (peak * attn_compute_eff),
                  (K * kv_bytes_per_token_per_layer + 2 * T * q_bytes) / (bw * bandwidth_eff)).
   Prefill is compute-bound on P (causal FLOPs); decode is memory-bound on reading K entries.
4. Tensor parallelism: two all-reduces of T * hidden activations per layer (ring:
   2 (tp-1)/tp * bytes / link_bw + latency), zero at tp = 1.
Plus the LM head over S rows and a fixed per-iteration overhead (scheduler, sampler, launch).

Parameters come from the GPU profile's `calibration` section when present, else from the
documented defaults in `CostParams` (assumptions, flagged as uncalibrated in run output).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from simulator.errors import ConfigError
from simulator.gpus import GpuSpec
from simulator.memory import kv_heads_per_gpu
from simulator.models import ModelSpec


class StepShape(NamedTuple):
    num_tokens: int
    num_sampled: int
    attn_pairs: float
    kv_tokens: int


@dataclass(frozen=True, slots=True)
class CostParams:
    # Defaults are assumptions until `kvsim calibrate` fits them (issue 3). Reference points:
    # one H200 here ran an 8192^3 bf16 GEMM at 790/989 = 0.80 of peak and a device copy at
    # 4.3/4.8 = 0.90 of HBM bandwidth (../shared/REFERENCE.md); small GEMMs reach less.
    compute_eff: float = 0.70
    attn_compute_eff: float = 0.50  # FlashAttention prefill runs below GEMM efficiency
    bandwidth_eff: float = 0.80
    elementwise_passes: float = 12.0  # ~6 element-wise kernels, each a read and a write
    per_op_overhead_s: float = 4e-6  # per GEMM kernel launch/tail, assumption
    iteration_overhead_s: float = 2e-3  # scheduler + sampler + launch per step, assumption
    allreduce_latency_s: float = 10e-6  # per all-reduce, assumption

    @classmethod
    def from_gpu(cls, gpu: GpuSpec) -> CostParams:
        known = {f.name for f in fields(cls)}
        cal: dict[str, Any] = gpu.calibration.get("params", {}) if gpu.calibration else {}
        unknown = set(cal) - known
        if unknown:
            raise ConfigError(f"GPU profile {gpu.source_file}: unknown calibration params "
                              f"{sorted(unknown)}; valid: {sorted(known)}")
        return cls(**cal)


class CostModel:
    """step_time(shape) -> seconds, for one (model, GPU, tensor-parallel size)."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1, max_tokens: int = 8192,
                 params: CostParams | None = None) -> None:
        self.model, self.gpu, self.tp = model, gpu, tp
        self.params = params or CostParams.from_gpu(gpu)
        self.calibrated = bool(gpu.calibration)
        self._peak = gpu.peak_flops(model.dtype_bytes)
        self._bw = gpu.hbm_bandwidth_gbps * 1e9
        p = self.params
        d = model.dtype_bytes
        # attention constants per layer per shard
        heads = max(1, model.num_heads // tp)
        self._attn_flops_per_pair = 4.0 * heads * model.head_dim
        self._kv_bytes_per_entry = 2 * kv_heads_per_gpu(model, tp) * model.head_dim * d
        self._q_bytes_per_token = 2 * heads * model.head_dim * d  # q in + out
        self._attn_c = 1.0 / (self._peak * p.attn_compute_eff)
        self._mem_c = 1.0 / (self._bw * p.bandwidth_eff)
        # all-reduce per layer (two per layer)
        if tp > 1:
            link = (gpu.gpu_link_gbps or gpu.host_link_gbps) * 1e9
            self._ar_per_token = 2 * 2 * (tp - 1) / tp * model.hidden_size * d / link
            self._ar_fixed = 2 * p.allreduce_latency_s
        else:
            self._ar_per_token = self._ar_fixed = 0.0
        # LM head: one GEMM over sampled rows
        self._lm_w = model.hidden_size * model.vocab_size / tp
        self._linear = self._tabulate_linear(max_tokens)
        self._layers = model.num_layers

    # --- linear part, tabulated over T -------------------------------------------------
    def _gemm(self, t: np.ndarray, k_in: float, n_out: float, weight_elems: float) -> np.ndarray:
        d = self.model.dtype_bytes
        p = self.params
        flops = 2.0 * t * k_in * n_out
        nbytes = (weight_elems + t * (k_in + n_out)) * d
        return np.maximum(flops / (self._peak * p.compute_eff), nbytes * self._mem_c) + \
            np.where(t > 0, p.per_op_overhead_s, 0.0)

    def linear_time_per_layer(self, t: np.ndarray) -> np.ndarray:
        """Seconds for one layer's GEMMs + element-wise ops at T tokens (per shard)."""
        m, tp = self.model, self.tp
        t = np.asarray(t, dtype=np.float64)
        h = m.hidden_size
        qkv = (m.q_size + 2 * m.kv_size) / tp
        o_in = m.q_size / tp
        up = (2 if m.gated_mlp else 1) * m.intermediate_size / tp
        down_in = m.intermediate_size / tp
        time = self._gemm(t, h, qkv, h * qkv) + self._gemm(t, o_in, h, o_in * h)
        if m.is_moe:
            # tokens pick top-k of E experts; expected distinct experts touched by T tokens
            e, k = m.num_experts, m.experts_per_token
            touched = e * (1.0 - (1.0 - k / e) ** t)
            rows = t * k  # token-expert pairs
            per_expert_rows = np.where(touched > 0, rows / np.maximum(touched, 1e-9), 0.0)
            time = time + touched * (self._gemm(per_expert_rows, h, up, h * up)
                                     + self._gemm(per_expert_rows, down_in, h, down_in * h))
        else:
            time = time + self._gemm(t, h, up, h * up) + self._gemm(t, down_in, h, down_in * h)
        elementwise = self.params.elementwise_passes * t * h * m.dtype_bytes * self._mem_c
        return time + elementwise

    def _tabulate_linear(self, max_tokens: int) -> np.ndarray:
        return self.linear_time_per_layer(np.arange(max_tokens + 1))

    def _linear_at(self, t: int) -> float:
        if t >= len(self._linear):  # grow the table (rare: a caller exceeding max_tokens)
            self._linear = self._tabulate_linear(max(t, 2 * len(self._linear)))
        return float(self._linear[t])

    # --- one step ------------------------------------------------------------------------
    def step_time(self, shape: StepShape) -> float:
        """Seconds for one iteration. Scalar Python arithmetic: this is on the hot path."""
        t, s, pairs, kv = shape
        if t <= 0:
            return 0.0
        attn = max(pairs * self._attn_flops_per_pair * self._attn_c,
                   (kv * self._kv_bytes_per_entry + t * self._q_bytes_per_token) * self._mem_c)
        per_layer = self._linear_at(t) + attn + self._ar_fixed + t * self._ar_per_token
        d = self.model.dtype_bytes
        lm_head = max(2.0 * s * self._lm_w / (self._peak * self.params.compute_eff),
                      (self._lm_w + s * (self.model.hidden_size + self.model.vocab_size)) * d
                      * self._mem_c)
        return self._layers * per_layer + lm_head + self.params.iteration_overhead_s

    def describe(self) -> str:
        src = "calibrated" if self.calibrated else "UNCALIBRATED defaults (assumed efficiencies)"
        return (f"cost model: {self.model.name} on {self.gpu.name} x tp={self.tp}, {src}; "
                f"decode step at batch 1 / ctx 1024: "
                f"{self.step_time(StepShape(1, 1, 1024, 1024)) * 1e3:.2f} ms")


def prefill_pairs(num_new: int, num_computed: int) -> float:
    """Causal query-key pairs for num_new tokens after num_computed earlier ones."""
    return num_new * num_computed + num_new * (num_new + 1) / 2


__all__ = ["CostModel", "CostParams", "StepShape", "prefill_pairs", "math"]
