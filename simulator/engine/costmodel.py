"""Cost model: seconds for one engine iteration, a pure function of the batch composition.

A batch is summarised by four numbers (`StepShape`), enough for every term below:
- num_tokens   T = sum of tokens scheduled this step (prefill chunks + decodes)
- num_sampled  S = requests that sample a token this step (decodes + last prefill chunks)
- attn_pairs   P = sum over requests of n*c + n*(n+1)/2 (query-key pairs under the causal
                   mask, for n new tokens after c cached/computed ones; a decode has n=1)
- kv_tokens    K = sum over requests of c + n (KV entries attention reads)

Per layer, per tensor-parallel shard. The operator names are those of the measured kernel data
(Vidur profiling layout, ../shared/data/kernels), so calibration compares like with like:
1. GEMMs attn_pre_proj (QKV), attn_post_proj (O), mlp_up_proj (gate+up), mlp_down_proj, each a
   *soft roofline* over T rows of a K x N weight:
       m = (K*N + T*(K+N)) * dtype_bytes / (bandwidth * gemm_bandwidth_eff)   weights + activations
       c = 2*T*K*N / (peak_flops * gemm_compute_eff)                          tensor-core FLOPs
       t = gemm_overhead_s + (m**p + c**p) ** (1/p),   p = gemm_overlap_exp >= 1
   p -> inf is the plain roofline max(m, c); p = 1 is no overlap of memory and compute. The
   achieved efficiency therefore saturates in T: flat (bandwidth-bound) while T is far below the
   ridge point, approaching gemm_compute_eff far above it. MoE: the same GEMMs over the experts
   the T tokens are expected to touch.
2. Element-wise ops (input_layernorm, post_attention_layernorm, attn_rope, mlp_act, add; emb once
   per step): memory-bound, t = <kind>_overhead_s + T * bytes_per_token / (bandwidth * <kind>_bandwidth_eff),
   bytes per token counted per op in `ShardDims.elementwise_elems` (reads + writes).
3. Attention: the kernel data has no attention timings, so it is modelled from first principles:
       prefill  causal FLOPs  4 * P * heads_per_shard * head_dim  at attn_compute_eff
       decode   KV read       K * 2 * kv_heads_per_shard * head_dim * dtype_bytes (+ q in/out)
                              at attn_bandwidth_eff
       t = max(prefill, decode) + attn_overhead_s   (one varlen kernel per layer, as in vLLM v1)
   Assumptions (used unless `kvsim profile` measured attention on the GPU): attn_bandwidth_eff
   is the fitted GEMM weight-streaming efficiency (a decode reads the KV cache the way a skinny
   GEMM reads its weights), and attn_compute_eff = ATTN_TO_GEMM_COMPUTE * gemm_compute_eff:
   FlashAttention-2 reports 50-73 % of A100 peak in the forward pass (Dao 2023, abstract),
   mid-point ~0.62, against ~0.74 fitted here for A100 GEMMs -> ratio ~0.85.
4. Tensor parallelism: two ring all-reduces of T*hidden activations per layer (after the O and
   down projections) plus one after the vocab-parallel embedding, each
       latency + 2 (tp-1)/tp * bytes / (link_bandwidth * allreduce_bus_eff),
   link = the GPU link (NVLink...) or, without one, the host link (PCIe). Zero at tp = 1.
Per step: the embedding (element-wise over T), the LM head GEMM over S rows, and
iteration_overhead_s (scheduler, sampler, input preparation: not in the kernel data; assumed).

Invariants: step_time is 0 for T = 0 and non-decreasing in each StepShape field; per-shard
compute (linear ops and attention) is non-increasing in tp; the per-token tables are built once
per (model, GPU, tp), so step_time is scalar Python arithmetic on the simulator's hot path.

Parameters come from the GPU profile's `calibration` section (`kvsim calibrate`, see
docs/costmodel.md): `status: measured` (fitted on kernels measured on this GPU) or
`status: extrapolated` (efficiencies transferred from the nearest measured GPU through the
datasheet peak FLOPs, memory and link bandwidth). Without a section the `CostParams` defaults
apply: assumptions, flagged as uncalibrated in run output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from simulator.errors import ConfigError, did_you_mean
from simulator.hardware.gpus import GpuSpec
from simulator.hardware.memory import kv_heads_per_gpu
from simulator.hardware.models import ModelSpec

# Measured per-layer operators, in the order of the kernel data (the layer-time sum runs over these).
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
             "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
STEP_OPS = ("emb",)  # once per step, not per layer
# element-wise op -> parameter prefix (both norms share one kernel kind)
ELEMENTWISE_KIND = {"input_layernorm": "norm", "post_attention_layernorm": "norm",
                    "attn_rope": "rope", "mlp_act": "act", "add": "add", "emb": "emb"}
ELEMENTWISE_KINDS = ("norm", "rope", "act", "add", "emb")

# See the module docstring, item 3: FlashAttention-2 forward 50-73 % of A100 peak (mid ~0.62)
# over ~0.74 fitted A100 GEMM compute efficiency.
ATTN_TO_GEMM_COMPUTE = 0.85


class StepShape(NamedTuple):
    num_tokens: int
    num_sampled: int
    attn_pairs: float
    kv_tokens: int


@dataclass(frozen=True, slots=True)
class CostParams:
    """Per-GPU cost-model parameters. Efficiencies are fractions of the datasheet peak FLOP/s,
    memory bandwidth or link bandwidth; overheads are seconds per kernel (or per step).

    The defaults are assumptions for GPUs without a calibration section (reference points: one
    H200 here ran an 8192^3 bf16 GEMM at 790/989 = 0.80 of peak and a device copy at 4.3/4.8 =
    0.90 of HBM bandwidth, ../shared/REFERENCE.md); `kvsim calibrate` replaces them.
    """

    gemm_bandwidth_eff: float = 0.80
    gemm_compute_eff: float = 0.70
    gemm_overlap_exp: float = 1.5  # soft-roofline exponent p; a middle value until fitted
    gemm_overhead_s: float = 4e-6  # kernel launch/tail, assumption
    norm_bandwidth_eff: float = 0.5
    norm_overhead_s: float = 5e-6
    rope_bandwidth_eff: float = 0.5
    rope_overhead_s: float = 4e-6
    act_bandwidth_eff: float = 0.6
    act_overhead_s: float = 4e-6
    add_bandwidth_eff: float = 0.8
    add_overhead_s: float = 2e-6
    emb_bandwidth_eff: float = 0.3
    emb_overhead_s: float = 3e-6
    attn_compute_eff: float = 0.5  # FlashAttention prefill runs below GEMM efficiency
    attn_bandwidth_eff: float = 0.8
    attn_overhead_s: float = 10e-6  # one attention kernel per layer, assumption
    allreduce_latency_s: float = 20e-6  # per all-reduce, assumption
    allreduce_bus_eff: float = 0.5  # NCCL bus bandwidth / datasheet link bandwidth, assumption
    iteration_overhead_s: float = 2e-3  # scheduler + sampler + input prep per step, assumption

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
                raise ConfigError(f"cost parameter {f.name} must be a finite number, got {v!r}")
            if f.name.endswith("_eff") and not 0.0 < v <= 2.0:
                # > 1 is possible for small working sets served from L2; > 2 is a units error
                raise ConfigError(f"cost parameter {f.name} must be in (0, 2], got {v!r}")
            if f.name.endswith("_s") and v < 0:
                raise ConfigError(f"cost parameter {f.name} must be >= 0 seconds, got {v!r}")
        if self.gemm_overlap_exp < 1.0:
            raise ConfigError(f"cost parameter gemm_overlap_exp must be >= 1, got {self.gemm_overlap_exp!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str) -> CostParams:
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                raise ConfigError(f"{source}: unknown calibration param {key!r}"
                                  f"{did_you_mean(key, known)}; valid: {', '.join(known)}")
        try:
            return cls(**{k: float(v) for k, v in values.items()})
        except (TypeError, ValueError) as e:
            if isinstance(e, ConfigError):
                raise ConfigError(f"{source}: {e}") from None
            raise ConfigError(f"{source}: calibration params must be numbers ({e})") from None

    @classmethod
    def from_gpu(cls, gpu: GpuSpec) -> CostParams:
        cal: dict[str, Any] = gpu.calibration.get("params", {}) if gpu.calibration else {}
        return cls.from_dict(cal or {}, f"GPU profile {gpu.source_file or gpu.name}")

    def as_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in fields(self)}


# --- operator times, vectorised (shared by the simulator tables and the calibration fit) -----

@dataclass(frozen=True)
class ShardDims:
    """Per-shard layer dimensions. Fields may be numpy arrays (one value per measured row)."""

    hidden: Any
    q: Any  # query width per shard = heads/tp * head_dim
    kv: Any  # key (= value) width per shard; KV heads replicated when tp > kv_heads
    ffn: Any  # intermediate size per shard
    gated: Any  # 1.0 for gate+up (SwiGLU), 0.0 for a 2-matrix MLP
    dtype_bytes: float = 2.0

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> ShardDims:
        return cls(hidden=float(model.hidden_size), q=model.q_size / tp,
                   kv=float(kv_heads_per_gpu(model, tp) * model.head_dim),
                   ffn=model.intermediate_size / tp, gated=1.0 if model.gated_mlp else 0.0,
                   dtype_bytes=float(model.dtype_bytes))

    def gemm_shapes(self) -> dict[str, tuple[Any, Any]]:
        """GEMM op -> (K, N) of its weight, per shard."""
        up = (1.0 + self.gated) * self.ffn
        return {"attn_pre_proj": (self.hidden, self.q + 2 * self.kv),
                "attn_post_proj": (self.q, self.hidden),
                "mlp_up_proj": (self.hidden, up),
                "mlp_down_proj": (self.ffn, self.hidden)}

    def elementwise_elems(self) -> dict[str, Any]:
        """Element-wise op -> elements read + written per token."""
        d = self
        return {"input_layernorm": 2 * d.hidden,  # read x, write normed x
            "post_attention_layernorm": 2 * d.hidden,
            "attn_rope": 2 * (d.q + d.kv),  # rotate q and k in place: read + write
            "mlp_act": (2.0 + d.gated) * d.ffn,  # gated: read gate and up, write out
            "add": 3 * d.hidden,  # residual add: two reads, one write
            "emb": 2 * d.hidden}  # gather one row per token, write it


def gemm_time(t: Any, k: Any, n: Any, dtype_bytes: float, peak_flops: float, bandwidth: float,
              p: CostParams) -> np.ndarray:
    """Soft-roofline seconds for T x K @ K x N (zero when T = 0). See module docstring, item 1."""
    t = np.asarray(t, dtype=np.float64)
    mem = (k * n + t * (k + n)) * dtype_bytes / (bandwidth * p.gemm_bandwidth_eff)
    comp = 2.0 * t * k * n / (peak_flops * p.gemm_compute_eff)
    e = p.gemm_overlap_exp
    # (m^e + c^e)^(1/e) computed as m * (1 + (c/m)^e)^(1/e) to stay in range for any e
    body = mem * (1.0 + (comp / mem) ** e) ** (1.0 / e)
    return np.where(t > 0, p.gemm_overhead_s + body, 0.0)


def elementwise_time(t: Any, elems_per_token: Any, dtype_bytes: float, bandwidth: float,
                     eff: float, overhead_s: float) -> np.ndarray:
    t = np.asarray(t, dtype=np.float64)
    return np.where(t > 0, overhead_s + t * elems_per_token * dtype_bytes / (bandwidth * eff), 0.0)


def op_times(dims: ShardDims, t: Any, peak_flops: float, bandwidth: float,
             p: CostParams) -> dict[str, np.ndarray]:
    """Seconds of every measured operator (LAYER_OPS + emb) at T tokens, per shard."""
    out: dict[str, np.ndarray] = {}
    d = dims.dtype_bytes
    for op, (k, n) in dims.gemm_shapes().items():
        out[op] = gemm_time(t, k, n, d, peak_flops, bandwidth, p)
    for op, elems in dims.elementwise_elems().items():
        kind = ELEMENTWISE_KIND[op]
        out[op] = elementwise_time(t, elems, d, bandwidth, getattr(p, f"{kind}_bandwidth_eff"),
                                   getattr(p, f"{kind}_overhead_s"))
    return out


def allreduce_time(nbytes: Any, workers: Any, link_bandwidth: float, p: CostParams) -> np.ndarray:
    """Ring all-reduce seconds: latency + 2 (n-1)/n * bytes / bus bandwidth; 0 for n <= 1."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    workers = np.asarray(workers, dtype=np.float64)
    ring = 2.0 * (workers - 1.0) / np.maximum(workers, 1.0)
    t = p.allreduce_latency_s + ring * nbytes / (link_bandwidth * p.allreduce_bus_eff)
    return np.where(workers > 1, t, 0.0)


def link_bandwidth(gpu: GpuSpec) -> float:
    """Bytes/s of the link tensor-parallel all-reduces use: GPU link, else the host link."""
    return (gpu.gpu_link_gbps or gpu.host_link_gbps) * 1e9


class CostModel:
    """step_time(shape) -> seconds, for one (model, GPU, tensor-parallel size)."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1, max_tokens: int = 8192,
                 params: CostParams | None = None) -> None:
        if not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
        self.model, self.gpu, self.tp = model, gpu, tp
        self.params = params or CostParams.from_gpu(gpu)
        status = (gpu.calibration or {}).get("status", "measured" if gpu.calibration else None)
        self.status: str | None = None if params is not None else status
        self.calibrated = self.status == "measured"
        self.extrapolated = self.status == "extrapolated"
        self._peak = gpu.peak_flops(model.dtype_bytes)
        self._bw = gpu.hbm_bandwidth_gbps * 1e9
        self._link = link_bandwidth(gpu)
        self._dims = ShardDims.of(model, tp)
        p = self.params
        d = model.dtype_bytes
        # attention constants per layer per shard
        heads = model.num_heads / tp
        self._attn_flops_c = 4.0 * heads * model.head_dim / (self._peak * p.attn_compute_eff)
        mem_c = 1.0 / (self._bw * p.attn_bandwidth_eff)
        self._kv_c = 2 * kv_heads_per_gpu(model, tp) * model.head_dim * d * mem_c
        self._q_c = 2 * heads * model.head_dim * d * mem_c  # q in + out
        self._attn_o = p.attn_overhead_s
        self._layers = model.num_layers
        self._by_tokens: list[float] = []
        self._by_sampled: list[float] = []
        self._tabulate(max_tokens)

    # --- tables over T (linear ops, all-reduces, embedding) and S (LM head) ---------------
    def linear_time_per_layer(self, t: Any) -> np.ndarray:
        """Seconds for one layer's GEMMs + element-wise ops at T tokens, per shard (no all-reduce)."""
        m = self.model
        t = np.asarray(t, dtype=np.float64)
        times = op_times(self._dims, t, self._peak, self._bw, self.params)
        if m.is_moe:
            times.update(self._moe_mlp(t))
        return sum((times[op] for op in LAYER_OPS), np.zeros_like(t))

    def _moe_mlp(self, t: np.ndarray) -> dict[str, np.ndarray]:
        """MLP ops of an MoE layer: tokens pick top-k of E experts; GEMMs over the experts touched."""
        m, p, dims = self.model, self.params, self._dims
        e, k = m.num_experts, m.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** t)  # expected distinct experts hit by T tokens
        rows = t * k  # token-expert pairs
        per_expert = np.where(touched > 0, rows / np.maximum(touched, 1e-9), 0.0)
        shapes = dims.gemm_shapes()
        d = dims.dtype_bytes
        up = touched * gemm_time(per_expert, *shapes["mlp_up_proj"], d, self._peak, self._bw, p)
        down = touched * gemm_time(per_expert, *shapes["mlp_down_proj"], d, self._peak, self._bw, p)
        act = elementwise_time(rows, dims.elementwise_elems()["mlp_act"], d, self._bw,
                               p.act_bandwidth_eff, p.act_overhead_s)
        return {"mlp_up_proj": up, "mlp_down_proj": down, "mlp_act": act}

    def allreduce_time_per_layer(self, t: Any) -> np.ndarray:
        """Seconds of the two per-layer all-reduces of T * hidden activations (0 at tp = 1)."""
        nbytes = np.asarray(t, dtype=np.float64) * self.model.hidden_size * self.model.dtype_bytes
        return 2.0 * np.where(nbytes > 0, allreduce_time(nbytes, self.tp, self._link, self.params), 0.0)

    def per_step_time(self, t: Any) -> np.ndarray:
        """Seconds at T tokens that attention does not depend on: layers x (linear + all-reduce)
        + embedding (+ its all-reduce)."""
        t = np.asarray(t, dtype=np.float64)
        emb = op_times(self._dims, t, self._peak, self._bw, self.params)["emb"]
        emb_ar = 0.5 * self.allreduce_time_per_layer(t)
        layer = self.linear_time_per_layer(t) + self.allreduce_time_per_layer(t)
        return self._layers * layer + emb + emb_ar

    def lm_head_time(self, s: Any) -> np.ndarray:
        m = self.model
        return gemm_time(s, m.hidden_size, m.vocab_size / self.tp, m.dtype_bytes, self._peak, self._bw,
                         self.params)

    def _tabulate(self, max_tokens: int) -> None:
        n = np.arange(max(int(max_tokens), 1) + 1)
        # The forms are non-decreasing in T; the running max only removes float round-off.
        self._by_tokens = np.maximum.accumulate(self.per_step_time(n)).tolist()
        self._by_sampled = np.maximum.accumulate(self.lm_head_time(n)).tolist()

    # --- one step ------------------------------------------------------------------------
    def step_time(self, shape: StepShape) -> float:
        """Seconds for one iteration. Scalar Python arithmetic: this is on the hot path."""
        t, s, pairs, kv = shape
        if t <= 0:
            return 0.0
        if t >= len(self._by_tokens):  # grow the tables (rare: a caller exceeding max_tokens)
            self._tabulate(max(t, 2 * (len(self._by_tokens) - 1)))
        attn = pairs * self._attn_flops_c
        mem = kv * self._kv_c + t * self._q_c
        if mem > attn:
            attn = mem
        return (self._by_tokens[t] + self._layers * (attn + self._attn_o) + self._by_sampled[s]
                + self.params.iteration_overhead_s)

    def attention_time_per_layer(self, pairs: float, kv_tokens: float, t: float) -> float:
        """Attention seconds for one layer (the term step_time uses), for checks and docs."""
        if t <= 0:
            return 0.0
        return max(pairs * self._attn_flops_c, kv_tokens * self._kv_c + t * self._q_c) + self._attn_o

    def describe(self) -> str:
        """One line for run output: model, GPU, where the parameters come from (the data set they
        were fitted on, as the profile's provenance names it) and a decode step's time."""
        cal = self.gpu.calibration or {}
        prov = cal.get("provenance") or {}
        dataset = prov.get("dataset") or "measured kernel timings"  # profiles from before `dataset`
        date = f", fit {prov['fit_date']}" if prov.get("fit_date") else ""
        if self.status is None:
            src = ("UNCALIBRATED defaults (assumed efficiencies)" if self.params == CostParams()
                   else "explicit parameters (not from a GPU profile)")
        elif self.extrapolated:
            src = (f"EXTRAPOLATED from {cal.get('donor', '?')} via datasheet specs "
                   f"(no kernel measurements for {self.gpu.name}; donor calibrated on {dataset}{date})")
        else:
            num_models = len(prov.get("models") or [])
            models = f", {num_models} model{'s' if num_models != 1 else ''}" if num_models else ""
            worst = (cal.get("error") or {}).get("leave_one_model_out_mape_pct") or {}
            tail = f" (leave-one-model-out MAPE <= {max(worst.values()):.1f}%)" if worst else ""
            src = f"calibrated on {dataset}{models}{date}{tail}"
        return (f"cost model: {self.model.name} on {self.gpu.name} x tp={self.tp}, {src}; "
                f"decode step at batch 1 / ctx 1024: "
                f"{self.step_time(StepShape(1, 1, 1024, 1024)) * 1e3:.2f} ms")


def prefill_pairs(num_new: int, num_computed: int) -> float:
    """Causal query-key pairs for num_new tokens after num_computed earlier ones."""
    return num_new * num_computed + num_new * (num_new + 1) / 2


__all__ = ["CostModel", "CostParams", "ShardDims", "StepShape", "allreduce_time", "elementwise_time",
           "gemm_time", "link_bandwidth", "op_times", "prefill_pairs"]
