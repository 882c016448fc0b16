"""Cost model: seconds for one engine iteration, a pure function of the batch composition.

A batch is summarised by `StepShape`. The first four numbers drive the GPU time:
- num_tokens   T = sum of tokens scheduled this step (prefill chunks + decodes)
- num_sampled  S = requests that sample a token this step (decodes + last prefill chunks)
- attn_pairs   P = sum over requests of n*c + n*(n+1)/2 (query-key pairs under the causal
                   mask, for n new tokens after c cached/computed ones; a decode has n=1)
- kv_tokens    K = sum over requests of c + n (KV entries attention reads)
and two more the per-step overhead uses (defaults = "not given", see item 6):
- num_seqs            requests scheduled this step (0: not given -> max(S, 1))
- num_prefill_tokens  tokens of requests that are not a one-token decode (-1: not given ->
                      the step counts as decode-only when T == S)

Per layer, per tensor-parallel shard. The operator names are those of the measured kernel data
(Vidur profiling layout, ../shared/data/kernels), so calibration compares like with like:
1. GEMMs attn_pre_proj (QKV), attn_post_proj (O), mlp_up_proj (gate+up), mlp_down_proj: a
   *tile model* of how a GEMM library runs T x K @ K x N on a GPU with `num_sms` SMs. For each
   candidate CTA tile (bm rows of T, bn columns of N, split-K s) in GEMM_TILES:
       tiles = ceil(T/bm) * ceil(N/bn) * s,   waves = ceil(tiles / num_sms)
       tile  = (K/s + k0) * (2*bm*bn / gemm_compute_eff + (bm+bn)*dtype_bytes * r) / (peak / num_sms)
       c     = waves * tile                                  wave-quantised compute
       m     = ((K*N + T*(K+N)) * dtype_bytes [+ 2*s*T*N*4, split-K's fp32 partial sums])
               / (bw * gemm_bandwidth_eff)
       t_i   = (m**p + c**p) ** (1/p),   p = gemm_overlap_exp >= 1
       w_i   = (min_j t_j / t_i) ** q,   q = gemm_select_exp
       t     = gemm_overhead_s + sum_i w_i t_i / sum_i w_i
   the expected time of the library's choice: its heuristic runs a fast tile, not always the
   fastest (the kernel data's times step up and down between neighbouring T at fixed K, N), so
   the candidates are weighted by how close they come to the fastest (>= the fastest, between
   candidates near a crossover); q is shared by every GPU (q >= 1000, the default, is the plain
   min). A wave is padded to whole tiles and a
   partial last wave takes a full tile time, so the time steps where T crosses a multiple
   of bm and where the tile count crosses a multiple of num_sms, as the kernel data does. The
   tile term has two costs per k-step: tensor-core work at gemm_compute_eff of the SM's share
   of peak, and feeding the tile's (bm+bn) operand elements through shared memory, r =
   gemm_feed_flop_per_byte flop-equivalents per byte (small tiles re-read operands more per
   flop, so they run below peak); k0 = gemm_tile_setup_k is each tile's prologue and epilogue
   (pipeline fill, output store) in K-elements. r and k0 are the chip's (its SM tensor rate over
   its shared-memory rate; its peak over bandwidth), fitted per GPU like the soft-roofline p (1:
   memory and compute do not overlap, large: max(m, c)) and the efficiencies. MoE: the same
   GEMMs over the experts the T tokens are expected to touch.
2. Element-wise ops (input_layernorm, post_attention_layernorm, attn_rope, mlp_act, add; emb once
   per step): memory-bound, one CTA per token row,
       stream = T * bytes_per_token / (bandwidth * <kind>_bandwidth_eff)   all rows at the achieved rate
       row    = bytes_per_token / <kind>_row_gbps                          one row alone, one CTA
       t      = <kind>_overhead_s + sqrt(stream^2 + row^2)
   bytes per token counted per op in `ShardDims.elementwise_elems` (reads + writes). At small T
   the kernel is latency-bound: a single CTA streams its row at a few GB/s whatever the GPU's
   bandwidth, so the time is flat in T and grows with the row width (the data: a 70B model's
   SiLU-and-mul row of 3 x 28672 elements takes ~22 us at T = 1-64 on A100, a 7B model's
   3 x 11008 ~7 us); the row rates describe the kernels and are shared by every measured GPU.
3. Attention: the kernel data has no attention timings, so it is modelled from first principles:
       prefill  causal FLOPs  4 * P * heads_per_shard * head_dim  at attn_compute_eff
       decode   KV read       K * 2 * kv_heads_per_shard * head_dim * dtype_bytes (+ q in/out)
                              at attn_bandwidth_eff
       t = max(prefill, decode) + attn_overhead_s   (one varlen kernel per layer, as in vLLM v1)
   Assumptions (used unless `kvsim profile` measured attention on the GPU): attn_bandwidth_eff
   is the fitted GEMM weight-streaming efficiency (a decode reads the KV cache the way a skinny
   GEMM reads its weights), and attn_compute_eff = ATTN_TO_GEMM_COMPUTE * the main-loop
   efficiency of the largest GEMM tile (`main_loop_eff`: tensor work and feed):
   FlashAttention-2 reports 50-73 % of A100 peak in the forward pass (Dao 2023, abstract),
   mid-point ~0.62, against ~0.74 fitted for A100 GEMMs by the soft roofline -> ratio ~0.85.
4. Tensor parallelism: two ring all-reduces of T*hidden activations per layer (after the O and
   down projections) plus one after the vocab-parallel embedding, each
       latency + 2 (tp-1)/tp * bytes / (link_bandwidth * allreduce_bus_eff),
   link = the GPU link (NVLink...) or, without one, the host link (PCIe). Zero at tp = 1.
5. Per step on the GPU: the embedding (element-wise over T), the LM head GEMM over S rows and
   the sampler over S rows of fp32 logits (`StepOverhead`).
6. Per step off the GPU (`StepOverhead`, constants and sources in its docstring): host time
   cpu = cpu_step_s + cpu_per_seq_s * num_seqs + cpu_per_token_s * T (scheduler, input
   preparation, output processing), and kernel launches. vLLM runs a step of T <= the largest
   CUDA-graph capture size as a graph, padded to the next capture size (`cudagraph_sizes`): a
   decode-only step as one full graph (one launch), a mixed step as piecewise graphs with
   attention launched eagerly between them (num_layers + 1 graph launches + num_layers
   attention launches); a larger step runs eagerly (every kernel launched from Python: the
   GPU cannot run ahead of the launches). Then
       device = max(gpu time at the padded T, launch time)
       step   = cpu + device                               synchronous scheduling
       step   = max(cpu, device) + async_exposed_s         async scheduling (vLLM 0.33's default):
                the host prepares step n+1 while the GPU runs step n.

7. Models of 2025-26 (issue 15; docs/models.md "Cost terms"). No kernel of these was measured
   here: describe() flags each term a model uses as extrapolated; a dense bf16 full-attention
   model takes none of them (its tables and step are the forms above, bit for bit).
   - MoE layers: T tokens pick top-k of E routed experts, E * (1 - (1 - k/E)^T) distinct experts
     expected (k at T = 1), T*k/that rows each, run as one grouped GEMM (vLLM's fused_moe is one
     kernel) at moe_intermediate_size; shared experts dense over T; the router GEMM T x hidden @
     hidden x E (16-bit, replicated); dense layers (first_k_dense_replace) at intermediate_size.
   - Expert parallelism (--enable-expert-parallel, ep = tp x dp ranks): each rank holds E/ep
     whole experts. At dp = 1 the TP all-reduce combines them (no extra traffic: FusedMoE uses
     all-to-all kernels only when dp > 1); at dp > 1 every MoE layer all-gathers the dp ranks'
     T x hidden activations and reduce-scatters the outputs (vLLM 0.33's default all2all_backend
     allgather_reducescatter), each latency + (dp-1) * T * hidden * bytes / (link * bus_eff),
     and the experts run on all dp x T tokens.
   - MLA (DeepSeek-V3, Kimi-K2; vllm/model_executor/layers/attention/mla_attention.py): GEMMs
     fused_qkv_a (replicated) + q_b + W_UK, and W_UV + o_proj; attention reads one latent of
     kv_lora_rank + qk_rope_head_dim per token, replicated on every TP rank; decode-only steps
     compute as forward_mqa (per head and pair 2 (Lkv + R) + 2 Lkv FLOPs), steps with a
     prefill as forward_mha (2 (P + R) + 2 V).
   - Sliding-window / chunked local layers read StepShape.window_kv_tokens entries (the
     scheduler's sum of min(c + n, window)) and compute at most T * window pairs; the full
     layers keep kv_tokens and attn_pairs. Chunked attention is costed as a window of the chunk
     size (an upper bound: it reads only the current chunk).
   - KV cache reads at the KV dtype's bytes (fp8: 1). GEMMs of quantized weights: at the GPU's
     fp8 / fp4 peak (peak_tflops.fp8 / fp4, GpuSpec.compute_dtype) with operands of the format's
     bytes per weight where the GPU has that peak, else 16-bit tiles streaming the packed
     weights (w4a16, mxfp4 / nvfp4 on Hopper, fp8 on Ampere). mxfp4 quantizes only the experts.

Invariants: step_time is 0 for T = 0 and non-decreasing in each of T, S, P, K, num_seqs (the
tables over T and S take a running max: item 1's tile-choice average can dip by < 0.1 %);
per-shard compute (linear ops and attention) is non-increasing in tp; the per-token tables are
built once per (model, GPU, tp), so step_time is scalar Python arithmetic on the simulator's
hot path; step_times(arrays) equals step_time element-wise.

Parameters come from the GPU profile's `calibration` section (`kvsim calibrate`, see
docs/costmodel.md): `status: measured` (fitted on kernels measured on this GPU) or
`status: extrapolated` (efficiencies transferred from the nearest measured GPU through the
datasheet peak FLOPs, memory and link bandwidth and SM count). Without a section the
`CostParams` defaults apply: assumptions, flagged as uncalibrated in run output.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from simulator.errors import ConfigError, did_you_mean
from simulator.hardware.dtypes import kv_cache_dtype_bytes
from simulator.hardware.gpus import GpuSpec
from simulator.hardware.memory import kv_heads_per_gpu
from simulator.hardware.models import CHUNKED, FULL, SLIDING, ModelSpec

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
# over ~0.74 fitted A100 GEMM compute efficiency (soft roofline).
ATTN_TO_GEMM_COMPUTE = 0.85

# Candidate CTA tiles (bm rows of T, bn columns of N, split-K factor) the GEMM library picks
# among (module docstring, item 1). The tensor-core GEMM kernels of cuBLAS / CUTLASS use tiles of
# 64-256 rows and columns (CUTLASS's default sm80/sm90 configurations: 128x256, 256x128,
# 128x128, 128x64, 64x128, 64x64); skinny 16- and 32-row tiles (the mma.sync m16n8k16 shape)
# and split-K serve decode-sized T, where one row of tiles would leave most SMs idle.
GEMM_TILES = ((16, 64, 1), (16, 64, 4), (32, 128, 1),
              (64, 64, 1), (64, 64, 2), (64, 64, 4), (64, 128, 1), (64, 128, 2), (64, 128, 4),
              (128, 64, 1), (128, 128, 1), (128, 128, 2), (128, 256, 1), (256, 128, 1))
SPLIT_K_PARTIAL_BYTES = 4  # split-K partial sums are fp32, written by the GEMM, read by the reduction
# decode_run_times' tables (one per batch size): built on a size's 64th ask, <= 16 MB each, 64 MB in all
_TABLE_AFTER = 64
_TABLE_ENTRIES = 1 << 21
_TABLE_BUDGET = 1 << 23


class StepShape(NamedTuple):
    """One step's batch, as the scheduler sums it (module docstring). Built positionally in
    engine/scheduling/scheduler.py; the last three fields are optional (defaults: not given)."""

    num_tokens: int
    num_sampled: int
    attn_pairs: float
    kv_tokens: int
    num_seqs: int = 0  # requests scheduled this step; 0 = not given
    num_prefill_tokens: int = -1  # tokens of requests that are not a one-token decode; -1 = not given
    # sum over scheduled requests of min(c + n, window): the KV entries a sliding-window (or
    # chunked local) layer reads; -1 = not given -> kv_tokens. The scheduler fills it only for
    # models with such layers (CostModel.window_tokens > 0).
    window_kv_tokens: int = -1


class Chip(NamedTuple):
    """The datasheet figures the forms use, for one weight dtype."""

    peak_flops: float  # dense tensor FLOP/s
    bandwidth: float  # memory bytes/s
    num_sms: int

    @classmethod
    def of(cls, gpu: GpuSpec, dtype_bytes: int = 2) -> Chip:
        if gpu.num_sms <= 0:
            raise ConfigError(f"GPU profile {gpu.source_file or gpu.name}: num_sms missing (the SM "
                              f"count from the datasheet; the GEMM tile model counts waves of SMs)")
        return cls(gpu.peak_flops(dtype_bytes), gpu.hbm_bandwidth_gbps * 1e9, gpu.num_sms)


@dataclass(frozen=True, slots=True)
class CostParams:
    """GPU cost-model parameters. Efficiencies are fractions of the datasheet peak FLOP/s,
    memory bandwidth or link bandwidth; overheads are seconds per kernel. gemm_select_exp
    describes the GEMM library's tile choice and is shared by every measured GPU (module
    docstring, item 1). The per-step host overhead is not here: see `StepOverhead`.

    The defaults are assumptions for GPUs without a calibration section (reference points: one
    H200 here ran an 8192^3 bf16 GEMM at 790/989 = 0.80 of peak and a device copy at 4.3/4.8 =
    0.90 of HBM bandwidth, ../shared/REFERENCE.md); `kvsim calibrate` replaces them.
    """

    gemm_bandwidth_eff: float = 0.80
    gemm_compute_eff: float = 0.70
    gemm_overlap_exp: float = 1.5  # soft-roofline exponent p; a middle value until fitted
    gemm_overhead_s: float = 4e-6  # kernel launch/tail, assumption
    gemm_feed_flop_per_byte: float = 8.0  # operand-feed cost r per byte a tile loads (per GPU)
    gemm_tile_setup_k: float = 50.0  # per-tile prologue + epilogue in K-elements (per GPU)
    gemm_select_exp: float = 1000.0  # tile-choice weight exponent q (item 1; >= 1000: the min), shared
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
    # GB/s at which one CTA streams one token row (item 2), shared by every measured GPU
    norm_row_gbps: float = 5.0
    rope_row_gbps: float = 8.0
    act_row_gbps: float = 10.0
    add_row_gbps: float = 30.0
    emb_row_gbps: float = 8.0
    attn_compute_eff: float = 0.5  # FlashAttention prefill runs below GEMM efficiency
    attn_bandwidth_eff: float = 0.8
    attn_overhead_s: float = 10e-6  # one attention kernel per layer, assumption
    allreduce_latency_s: float = 20e-6  # per all-reduce, assumption
    allreduce_bus_eff: float = 0.5  # NCCL bus bandwidth / datasheet link bandwidth, assumption

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
        for name in ("gemm_feed_flop_per_byte", "gemm_tile_setup_k", "gemm_select_exp",
                     *(f"{kind}_row_gbps" for kind in ELEMENTWISE_KINDS)):
            if not getattr(self, name) > 0:
                raise ConfigError(f"cost parameter {name} must be > 0, got {getattr(self, name)!r}")
        if self.gemm_overlap_exp < 1.0:
            raise ConfigError(f"cost parameter gemm_overlap_exp must be >= 1, got {self.gemm_overlap_exp!r}")
        if self.gemm_select_exp < 1.0:
            raise ConfigError(f"cost parameter gemm_select_exp must be >= 1, got {self.gemm_select_exp!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str) -> CostParams:
        known = [f.name for f in fields(cls)]
        for key in values:
            if key == "iteration_overhead_s":
                raise ConfigError(f"{source}: calibration param 'iteration_overhead_s' is gone: the "
                                  f"per-step overhead is a model now (costmodel.StepOverhead); delete "
                                  f"the line or re-run kvsim calibrate")
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


class GemmGeometry:
    """The parameter-free part of the tile model for T x K @ K x N on a chip (module docstring,
    item 1): per candidate tile, the padded tensor work, the operand bytes fed and the memory
    traffic, each per unit of the parameter that scales it. `time(p)` then costs a few array
    operations per tile, which is what makes fitting thousands of rows cheap."""

    def __init__(self, t: Any, k: Any, n: Any, dtype_bytes: float, chip: Chip) -> None:
        t = np.asarray(t, dtype=np.float64)
        k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
        self.t = t
        sm_rate = chip.peak_flops / chip.num_sms
        base_bytes = (k * n + t * (k + n)) * dtype_bytes
        # per tile: (tensor flops per K-element, operand bytes per K-element, K-elements, waves)
        self.tiles: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for bm, bn, split in GEMM_TILES:
            tiles = np.ceil(t / bm) * np.ceil(n / bn) * split
            waves = np.ceil(tiles / chip.num_sms)
            per_k = waves / sm_rate
            mem = base_bytes + (2.0 * split * t * n * SPLIT_K_PARTIAL_BYTES if split > 1 else 0.0)
            self.tiles.append((per_k * (2.0 * bm * bn), per_k * ((bm + bn) * dtype_bytes),
                               k / split, mem / chip.bandwidth))

    def time(self, p: CostParams) -> np.ndarray:
        """Seconds of the fastest candidate tile (zero where T = 0)."""
        e, k0, r = p.gemm_overlap_exp, p.gemm_tile_setup_k, p.gemm_feed_flop_per_byte
        inv_c, inv_b = 1.0 / p.gemm_compute_eff, 1.0 / p.gemm_bandwidth_eff
        bodies = []
        for flops_k, bytes_k, k_tile, mem_s in self.tiles:
            comp = (k_tile + k0) * (flops_k * inv_c + bytes_k * r)
            mem = mem_s * inv_b
            # (m^e + c^e)^(1/e) computed as m * (1 + (c/m)^e)^(1/e) to stay in range for any e
            bodies.append(mem * (1.0 + (comp / mem) ** e) ** (1.0 / e))
        best = bodies[0]
        for b in bodies[1:]:
            best = np.minimum(best, b)
        q = p.gemm_select_exp
        if q < 1000.0:
            # the candidates' mean weighted by (t_best / t_i)^q: >= the fastest, between candidates
            weights = [(best / b) ** q for b in bodies]
            best = sum((w * b for w, b in zip(weights, bodies)), np.zeros_like(best)) / sum(weights)
        return np.where(self.t > 0, p.gemm_overhead_s + best, 0.0)

    def best_tile(self, p: CostParams) -> np.ndarray:
        """Index into GEMM_TILES of the candidate the library is modelled to run (docs, tests)."""
        e, k0, r = p.gemm_overlap_exp, p.gemm_tile_setup_k, p.gemm_feed_flop_per_byte
        bodies = []
        for flops_k, bytes_k, k_tile, mem_s in self.tiles:
            comp = (k_tile + k0) * (flops_k / p.gemm_compute_eff + bytes_k * r)
            mem = mem_s / p.gemm_bandwidth_eff
            bodies.append(mem * (1.0 + (comp / mem) ** e) ** (1.0 / e))
        return np.argmin(np.array(bodies), axis=0)


def gemm_time(t: Any, k: Any, n: Any, dtype_bytes: float, chip: Chip, p: CostParams) -> np.ndarray:
    """Tile-model seconds for T x K @ K x N (zero when T = 0). See module docstring, item 1."""
    return GemmGeometry(t, k, n, dtype_bytes, chip).time(p)


def main_loop_eff(p: CostParams, bm: int = 128, bn: int = 256, dtype_bytes: float = 2.0) -> float:
    """Fraction of peak at which a bm x bn tile's main loop runs, tensor work and operand feed
    (module docstring, item 1): 1 / (1 / gemm_compute_eff + r * (bm + bn) * dtype_bytes / (2 * bm * bn));
    the default is the largest candidate tile, what a large GEMM runs at before memory and setup
    (item 3: attention's compute efficiency is derived from it)."""
    feed = p.gemm_feed_flop_per_byte * (bm + bn) * dtype_bytes / (2.0 * bm * bn)
    return 1.0 / (1.0 / p.gemm_compute_eff + feed)


def elementwise_time(t: Any, elems_per_token: Any, dtype_bytes: float, bandwidth: float,
                     eff: float, overhead_s: float, row_s: Any = 0.0) -> np.ndarray:
    """Seconds of a memory-bound element-wise kernel over T token rows (module docstring, item
    2): overhead + sqrt(stream^2 + row^2), stream = all rows' bytes at bandwidth * eff, row_s =
    one row alone (`row_time`; 0: the plain o + stream form)."""
    t = np.asarray(t, dtype=np.float64)
    stream = t * elems_per_token * dtype_bytes / (bandwidth * eff)
    return np.where(t > 0, overhead_s + np.sqrt(stream * stream + np.square(row_s)), 0.0)


def row_time(elems_per_token: Any, dtype_bytes: float, row_gbps: float) -> Any:
    """Seconds for one CTA to stream one token row alone (module docstring, item 2)."""
    return elems_per_token * dtype_bytes / (row_gbps * 1e9)


def _layer_sum(times: dict[str, np.ndarray], t: np.ndarray) -> np.ndarray:
    """One layer's LAYER_OPS seconds summed, in LAYER_OPS order (op_times' or _layer_ops')."""
    return sum((times[op] for op in LAYER_OPS), np.zeros_like(t))


def op_times(dims: ShardDims, t: Any, chip: Chip, p: CostParams) -> dict[str, np.ndarray]:
    """Seconds of every measured operator (LAYER_OPS + emb) at T tokens, per shard."""
    out: dict[str, np.ndarray] = {}
    d = dims.dtype_bytes
    for op, (k, n) in dims.gemm_shapes().items():
        out[op] = gemm_time(t, k, n, d, chip, p)
    for op, elems in dims.elementwise_elems().items():
        kind = ELEMENTWISE_KIND[op]
        out[op] = elementwise_time(t, elems, d, chip.bandwidth, getattr(p, f"{kind}_bandwidth_eff"),
                                   getattr(p, f"{kind}_overhead_s"),
                                   row_time(elems, d, getattr(p, f"{kind}_row_gbps")))
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


@dataclass(frozen=True, slots=True)
class StepOverhead:
    """The per-step time outside the measured kernels (module docstring, item 6): host work,
    kernel launches and the sampler. What each constant is and where it comes from:

    - cpu_step_s = 1.0 ms: host time per step that does not grow with the batch (engine-core
      loop, scheduler call, the model runner's input preparation, the sampler's host side,
      output serialisation to the API server). No public figure for vLLM V1's total exists; an
      assumption. Only the scheduler's share was measured: 57 us for one decode request
      (vLLM 0.33's v1 Scheduler.schedule + update_from_output, `python -m
      simulator.calibration.host_probe`). Public bounds on its size: vLLM's v0.6.0 blog
      (blog.vllm.ai/2024/09/05/perf-update.html) profiled V0 serving Llama 3 8B on one H100 at
      62 % of the time off the GPU (API server 33 %, scheduling and input preparation 29 %);
      vLLM PR #23569 ("Fully overlap model execution") expects 5-10 % from hiding input
      preparation and sampling behind the forward pass under async scheduling. The published
      end-to-end rows (docs/costmodel.md) agree with ~1 ms within their spread.
    - cpu_per_seq_s = 16.7 us: measured the same way, schedule + update_from_output per running
      decode request (12.2 + 4.5 us, slope over 1-256 requests) on this project's build machine
      (a shared 2-core VM: a dedicated serving host is likely faster); input preparation per
      request (block-table rows) is not in it.
    - cpu_per_token_s = 0.1 us: measured the same way, per prompt token of a new request
      (block hashing and allocation), slope over 512-8192-token prompts.
    - launch_per_kernel_s = 6 us: one eager PyTorch op's dispatch and launch from Python; no
      source exists for vLLM's eager path, an assumption.
    - kernels_per_layer = 9: vLLM 0.33's LlamaDecoderLayer.forward
      (vllm/model_executor/models/llama.py): fused add+RMSNorm, QKV, rotary, attention, O,
      fused add+RMSNorm, gate_up, SiluAndMul, down.
    - graph_launch_s = 20 us: one CUDA-graph replay (cudaGraphLaunch); no source exists, an
      assumption.
    - sampler_overhead_s = 50 us and sampler_bytes_per_logit = 12: the sampler's GPU time,
      its kernels' fixed cost plus passes over num_sampled x vocab logits (the LM head's 2-byte
      logits read and written as fp32, read again by softmax / argmax: 2 + 4 + 4 + 2 bytes,
      counted from vLLM's v1 Sampler); no measurement exists here, an assumption.
    - async_exposed_s = 20 us: the part of a step async scheduling cannot hide (handing the
      sampled token ids back to the host); no source exists, an assumption.
    - CUDA-graph capture sizes, padding and modes are vLLM 0.33's defaults, not constants:
      `cudagraph_sizes` (vllm/config/vllm.py, _set_cudagraph_sizes) and cudagraph_mode
      FULL_AND_PIECEWISE (vllm/config/compilation.py: full graphs for decode-only batches,
      piecewise graphs with eager attention for mixed ones).
    """

    cpu_step_s: float = 1.0e-3
    cpu_per_seq_s: float = 16.7e-6
    cpu_per_token_s: float = 0.1e-6
    launch_per_kernel_s: float = 6e-6
    kernels_per_layer: int = 9
    graph_launch_s: float = 20e-6
    sampler_overhead_s: float = 50e-6
    sampler_bytes_per_logit: float = 12.0
    async_exposed_s: float = 20e-6


def cudagraph_sizes(max_num_seqs: int, max_num_batched_tokens: int,
                    compute_capability: str = "") -> list[int]:
    """vLLM 0.33's default CUDA-graph capture sizes, in tokens (vllm/config/vllm.py,
    VllmConfig._set_cudagraph_sizes, one token per decode). Steps:
    1. ceiling = min(2 * max_num_seqs, 512; 1024 on data-center Blackwell, compute capability
       10.x), then at most max_num_batched_tokens;
    2. sizes 1, 2, 4, multiples of 8 below 256, multiples of 16 from 256 up to the ceiling;
    3. add max_num_batched_tokens and max_num_seqs when they fit under the ceiling."""
    default = 1024 if compute_capability.split(".")[0] == "10" else 512
    largest = min(2 * max_num_seqs, default, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
    sizes += [s for s in (max_num_batched_tokens, max_num_seqs) if s <= largest]
    return sorted(set(sizes))


class CostModel:
    """step_time(shape) -> seconds, for one (model, GPU, tensor-parallel size).

    Engine settings the per-step overhead needs (keyword arguments, vLLM's defaults):
    max_num_seqs (CUDA-graph capture sizes), enforce_eager (no graphs), async_scheduling
    (host work overlaps the GPU; off: the engine schedules synchronously), overhead (constants).
    Storage and parallelism settings of the model terms (module docstring, item 7):
    kv_cache_dtype (vLLM's --kv-cache-dtype), quantization (--quantization; None: the
    checkpoint's format), enable_expert_parallel and data_parallel_size (the EP group is
    tp x dp ranks, vLLM's rule).
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, tp: int = 1, max_tokens: int = 8192,
                 params: CostParams | None = None, *, max_num_seqs: int = 256,
                 enforce_eager: bool = False, async_scheduling: bool = False,
                 overhead: StepOverhead | None = None, kv_cache_dtype: str = "auto",
                 quantization: str | None = None, enable_expert_parallel: bool = False,
                 data_parallel_size: int = 1) -> None:
        if not isinstance(tp, int) or tp < 1:
            raise ConfigError(f"tensor_parallel_size must be a positive integer, got {tp!r}")
        if not isinstance(data_parallel_size, int) or data_parallel_size < 1:
            raise ConfigError(f"data_parallel_size must be a positive integer, got {data_parallel_size!r}")
        self.model, self.gpu, self.tp = model, gpu, tp
        self.params = params or CostParams.from_gpu(gpu)
        status = (gpu.calibration or {}).get("status", "measured" if gpu.calibration else None)
        self.status: str | None = None if params is not None else status
        self.calibrated = self.status == "measured"
        self.extrapolated = self.status == "extrapolated"
        self.chip = Chip.of(gpu, model.dtype_bytes)
        self._peak, self._bw = self.chip.peak_flops, self.chip.bandwidth
        self._link = link_bandwidth(gpu)
        self._dims = ShardDims.of(model, tp)
        p = self.params
        d = model.dtype_bytes
        self._formats(kv_cache_dtype, quantization, enable_expert_parallel, data_parallel_size)
        # attention constants per layer per shard
        heads = model.num_heads / tp
        mem_c = 1.0 / (self._bw * p.attn_bandwidth_eff)
        kvb = self.kv_dtype_bytes
        if model.is_mla:  # item 7: prefill as forward_mha, decode as forward_mqa over the latent
            lat, rope = model.kv_lora_rank, model.qk_rope_head_dim
            flops_c = 1.0 / (self._peak * p.attn_compute_eff)
            self._attn_flops_c = heads * (2.0 * model.head_dim + 2.0 * model.v_head_dim) * flops_c
            self._attn_flops_decode_c = heads * (2.0 * (lat + rope) + 2.0 * lat) * flops_c
            self._kv_c = (lat + rope) * kvb * mem_c  # one latent per token, read whole on every rank
            self._q_c = heads * (2 * lat + rope) * d * mem_c  # absorbed q in, latent-wide out
        else:
            self._attn_flops_c = 4.0 * heads * model.head_dim / (self._peak * p.attn_compute_eff)
            self._attn_flops_decode_c = self._attn_flops_c
            self._kv_c = 2 * kv_heads_per_gpu(model, tp) * model.head_dim * kvb * mem_c
            self._q_c = 2 * heads * model.head_dim * d * mem_c  # q in + out
        self._attn_o = p.attn_overhead_s
        self._layers = model.num_layers
        # sliding-window / chunked local layers read at most the window (item 7)
        kinds = model.attention_types
        windows = [w for kind, w in ((SLIDING, model.sliding_window), (CHUNKED, model.attention_chunk_size))
                   if kind in kinds and w]
        self.window_tokens: int = max(windows) if windows else 0  # 0: no windowed layers
        self._layers_window = sum(kind != FULL for kind in kinds) if windows else 0
        self._layers_full = self._layers - self._layers_window
        self._ext = model.is_mla or self._layers_window > 0  # attention beyond the plain form
        # per-step overhead (module docstring, item 6)
        o = self.overhead = overhead or StepOverhead()
        self.async_scheduling = bool(async_scheduling)
        self.graph_sizes = [] if enforce_eager else cudagraph_sizes(max_num_seqs, max(int(max_tokens), 1),
                                                                    gpu.compute_capability)
        self._max_graph = self.graph_sizes[-1] if self.graph_sizes else 0
        self._pad = list(range(self._max_graph + 1))  # T -> the capture size a graph pads it to
        for t in range(1, self._max_graph + 1):
            self._pad[t] = self.graph_sizes[bisect.bisect_left(self.graph_sizes, t)]
        L = self._layers
        self._launch_full = o.graph_launch_s
        self._launch_piecewise = (L + 1) * o.graph_launch_s + L * o.launch_per_kernel_s
        self._launch_eager = (L * o.kernels_per_layer + 3) * o.launch_per_kernel_s  # + emb, norm, LM head
        self._attn_o_all = L * self._attn_o
        self._cpu_step, self._cpu_seq, self._cpu_tok = o.cpu_step_s, o.cpu_per_seq_s, o.cpu_per_token_s
        self._exposed = o.async_exposed_s
        self._num_rows = 0
        self._by_tokens: list[float] = []
        self._by_sampled: list[float] = []
        self._tabulate(max_tokens)

    def _formats(self, kv_cache_dtype: str, quantization: str | None, enable_expert_parallel: bool,
                 data_parallel_size: int) -> None:
        """Storage formats and expert parallelism (item 7), and the terms they flag."""
        m, gpu = self.model, self.gpu
        self.kv_dtype_bytes = kv_cache_dtype_bytes(kv_cache_dtype, m.dtype_bytes)
        fmt = self.weight_format = m.weight_format(quantization)
        self._quantized = fmt.bytes_per_weight is not None
        self._q_linear = self._quantized and fmt.scope == "linear"  # attention + dense MLPs too
        self.compute_dtype = gpu.compute_dtype(fmt.compute) if self._quantized else "bf16"
        self._q_chip = (Chip(gpu.peak_flops(self.compute_dtype), self.chip.bandwidth, self.chip.num_sms)
                        if self.compute_dtype != "bf16" else None)
        self.expert_parallel = bool(enable_expert_parallel) and m.is_moe
        self.data_parallel_size = data_parallel_size
        self.ep_size = self.tp * data_parallel_size if self.expert_parallel else 1
        self._plain = not (m.is_moe or m.is_mla or self._quantized)  # the measured form only
        kinds = set(m.attention_types)
        terms = [name for name, used in (
            ("MoE", m.is_moe), ("MLA", m.is_mla), ("sliding-window", SLIDING in kinds),
            ("chunked-attention", CHUNKED in kinds),
            (f"{kv_cache_dtype} KV", self.kv_dtype_bytes != m.dtype_bytes),
            (f"{fmt.name} weights ({self.compute_dtype} GEMMs)", self._quantized),
            ("expert-parallel", self.expert_parallel)) if used]
        self.extrapolated_terms: tuple[str, ...] = tuple(terms)

    # --- tables over T (linear ops, all-reduces, embedding) and S (LM head + sampler) -------
    def linear_time_per_layer(self, t: Any) -> np.ndarray:
        """Seconds for one layer's GEMMs + element-wise ops at T tokens, per shard (no
        all-reduce); the mean over the layers where they differ (MoE and dense layers)."""
        t = np.asarray(t, dtype=np.float64)
        if self._plain:
            return _layer_sum(op_times(self._dims, t, self.chip, self.params), t)
        return self._layers_sum(t) / self._layers

    def _layers_sum(self, t: np.ndarray) -> np.ndarray:
        """GEMMs + element-wise ops of every layer at T tokens: dense and MoE layers."""
        m = self.model
        total = np.zeros_like(t)
        num_moe = m.num_moe_layers
        for count, moe in ((m.num_layers - num_moe, False), (num_moe, True)):
            if count:
                total = total + count * _layer_sum(self._layer_ops(t, moe), t)
        return total

    def _layer_ops(self, t: np.ndarray, moe: bool) -> dict[str, np.ndarray]:
        """LAYER_OPS seconds of one dense (moe False) or MoE layer at T tokens, per shard."""
        times = op_times(self._dims, t, self.chip, self.params)
        if self._q_linear:
            for op, (k, n) in self._dims.gemm_shapes().items():
                times[op] = self._gemm(t, k, n, quantized=True)
        if self.model.is_mla:
            times.update(self._mla_ops(t))
        if moe:
            times.update(self._moe_mlp(t))
        return times

    def _gemm(self, t: Any, k: Any, n: Any, *, quantized: bool) -> np.ndarray:
        """A decoder linear layer's GEMM: 16-bit, or in the weight format (item 7): at the
        GPU's fp8 / fp4 peak with operands of bytes_per_weight (w8a8, w4a4) where it has the
        peak, else 16-bit tiles streaming the packed weights (w4a16; Marlin-style weight-only)."""
        p, d = self.params, self._dims.dtype_bytes
        if not quantized:
            return gemm_time(t, k, n, d, self.chip, p)
        w = float(self.weight_format.bytes_per_weight)
        if self._q_chip is not None:
            return gemm_time(t, k, n, w, self._q_chip, p)
        t = np.asarray(t, dtype=np.float64)
        # NOTE: GemmGeometry moves (K*N + T*(K+N)) * d bytes; weight-only moves K*N*w + T*(K+N)*d,
        # so the bandwidth (an array over T) is scaled by the ratio: the tiles stay 16-bit
        scale = (k * n + t * (k + n)) * d / (k * n * w + t * (k + n) * d)
        return gemm_time(t, k, n, d, Chip(self.chip.peak_flops, self.chip.bandwidth * scale,
                                          self.chip.num_sms), p)

    def _mla_ops(self, t: np.ndarray) -> dict[str, np.ndarray]:
        """MLA projections (vLLM 0.33 deepseek_v2.py, mla_attention.py): fused_qkv_a (replicated:
        hidden -> q_lora_rank + kv_lora_rank + rope) and q_b (column parallel), or q_proj and
        kv_a without a q low rank; W_UK and W_UV per head (16-bit: split_kv_b_proj dequantizes
        kv_b_proj; per token the same FLOPs and weights as the prefill's kv_b_proj up-projection
        of its new tokens); o_proj (row parallel); rope over q_pe and k_pe only."""
        m, p, d, q = self.model, self.params, self._dims.dtype_bytes, self._q_linear
        h, heads = m.hidden_size, m.num_heads / self.tp
        lat, rope, lq = m.kv_lora_rank, m.qk_rope_head_dim, m.q_lora_rank
        if lq:
            pre = self._gemm(t, h, lq + lat + rope, quantized=q) + self._gemm(
                t, lq, heads * m.head_dim, quantized=q)
        else:
            pre = self._gemm(t, h, lat + rope, quantized=q) + self._gemm(
                t, h, heads * m.head_dim, quantized=q)
        pre = pre + gemm_time(t, m.head_dim - rope, heads * lat, d, self.chip, p)  # W_UK
        post = gemm_time(t, lat, heads * m.v_head_dim, d, self.chip, p) + self._gemm(  # W_UV, o_proj
            t, heads * m.v_head_dim, h, quantized=q)
        rope_elems = 2 * (heads * rope + rope)
        rope_t = elementwise_time(t, rope_elems, d, self._bw, p.rope_bandwidth_eff, p.rope_overhead_s,
                                  row_time(rope_elems, d, p.rope_row_gbps))
        return {"attn_pre_proj": pre, "attn_post_proj": post, "attn_rope": rope_t}

    def _moe_mlp(self, t: np.ndarray) -> dict[str, np.ndarray]:
        """MLP ops of an MoE layer (item 7): T tokens pick top-k of E routed experts; GEMMs over
        the experts touched, E * (1 - (1 - k/E)^T) expected; shared experts dense over T; the
        router GEMM (16-bit, replicated: vLLM's GateLinear). TP shards every expert's width;
        EP gives each rank E/ep whole experts (vLLM FusedMoE), shared experts stay TP."""
        m, p, dims = self.model, self.params, self._dims
        e, k, h, d = m.num_experts, m.experts_per_token, m.hidden_size, dims.dtype_bytes
        # NOTE: with EP over dp > 1 ranks every rank runs its experts on the tokens of all dp
        # ranks (all-gathered, expert_comm_time_per_layer); the others are assumed to run
        # batches like this one, dp * T tokens in all
        routed = t * self.data_parallel_size if self.ep_size > self.tp else t
        hit = 1.0 - (1.0 - k / e) ** routed  # the chance one expert is hit by the tokens
        rows = routed * k  # token-expert pairs
        per_expert = np.where(hit > 0, rows / np.maximum(e * hit, 1e-9), 0.0)
        if self.expert_parallel:
            local, width = e / self.ep_size, float(m.expert_intermediate_size)
        else:
            local, width = float(e), m.expert_intermediate_size / self.tp
        touched = np.where(t > 0, local * hit, local)  # (T = 0: any width; the GEMM is 0 s then)
        # NOTE: one grouped GEMM over the touched experts (vLLM's fused_moe is one kernel), as one
        # GEMM of per-expert rows against the experts' weights side by side: touched x N columns.
        # Its tiles and weight bytes are the experts'; it counts each expert's input rows once.
        up_n = (1.0 + dims.gated) * width
        up = self._gemm(per_expert, h, touched * up_n, quantized=self._quantized)
        down = self._gemm(per_expert, width, touched * h, quantized=self._quantized)
        act_elems = (2.0 + dims.gated) * width
        act = elementwise_time(rows * (local / e), act_elems, d, self._bw, p.act_bandwidth_eff,
                               p.act_overhead_s, row_time(act_elems, d, p.act_row_gbps))
        up = up + gemm_time(t, h, e, d, self.chip, p)  # router
        if m.num_shared_experts:
            shared = m.num_shared_experts * m.expert_intermediate_size / self.tp
            up = up + self._gemm(t, h, (1.0 + dims.gated) * shared, quantized=self._q_linear)
            down = down + self._gemm(t, shared, h, quantized=self._q_linear)
            shared_elems = (2.0 + dims.gated) * shared
            act = act + elementwise_time(t, shared_elems, d, self._bw, p.act_bandwidth_eff,
                                         p.act_overhead_s, row_time(shared_elems, d, p.act_row_gbps))
        return {"mlp_up_proj": up, "mlp_down_proj": down, "mlp_act": act}

    def allreduce_time_per_layer(self, t: Any) -> np.ndarray:
        """Seconds of the two per-layer all-reduces of T * hidden activations (0 at tp = 1)."""
        nbytes = np.asarray(t, dtype=np.float64) * self.model.hidden_size * self.model.dtype_bytes
        return 2.0 * np.where(nbytes > 0, allreduce_time(nbytes, self.tp, self._link, self.params), 0.0)

    def expert_comm_time_per_layer(self, t: Any) -> np.ndarray:
        """Dispatch + combine of one MoE layer across the data-parallel ranks of the EP group
        (item 7): vLLM 0.33's default all2all_backend allgather_reducescatter all-gathers the
        dp ranks' T * hidden activations and reduce-scatters the outputs, each a ring of
        latency + (dp-1)/dp * dp*T*hidden*bytes / (link * allreduce_bus_eff). Zero without EP
        or at dp = 1 (FusedMoE uses all-to-all kernels only when dp > 1; the TP all-reduce,
        already counted, combines the experts)."""
        t = np.asarray(t, dtype=np.float64)
        dp = self.data_parallel_size
        if self.ep_size <= self.tp:
            return np.zeros_like(t)
        p = self.params
        nbytes = dp * t * self.model.hidden_size * self.model.dtype_bytes
        one = p.allreduce_latency_s + (dp - 1) / dp * nbytes / (self._link * p.allreduce_bus_eff)
        return np.where(t > 0, 2.0 * one, 0.0)

    def per_step_time(self, t: Any) -> np.ndarray:
        """Seconds at T tokens that attention does not depend on: layers x (linear + all-reduce)
        (+ MoE layers x expert dispatch/combine) + embedding (+ its all-reduce)."""
        t = np.asarray(t, dtype=np.float64)
        times = op_times(self._dims, t, self.chip, self.params)
        allreduce = self.allreduce_time_per_layer(t)
        emb, emb_ar = times["emb"], 0.5 * allreduce
        if self._plain:
            return self._layers * (_layer_sum(times, t) + allreduce) + emb + emb_ar
        layers = (self._layers_sum(t) + self._layers * allreduce
                  + self.model.num_moe_layers * self.expert_comm_time_per_layer(t))
        return layers + emb + emb_ar

    def lm_head_time(self, s: Any) -> np.ndarray:
        m = self.model
        return gemm_time(s, m.hidden_size, m.vocab_size / self.tp, m.dtype_bytes, self.chip, self.params)

    def sampler_time(self, s: Any) -> np.ndarray:
        """GPU seconds of the sampler over S rows of vocab logits (StepOverhead; 0 when S = 0)."""
        s = np.asarray(s, dtype=np.float64)
        o = self.overhead
        nbytes = s * self.model.vocab_size * o.sampler_bytes_per_logit
        stream = nbytes / (self._bw * self.params.gemm_bandwidth_eff)
        return np.where(s > 0, o.sampler_overhead_s + stream, 0.0)

    def _tabulate(self, max_tokens: int) -> None:
        n = np.arange(max(int(max_tokens), self._max_graph, 1) + 1)
        # NOTE: the forms are non-decreasing in T up to dips of < 0.1 % where the tile-choice
        # weights shift (item 1); the running max removes them (and float round-off).
        self._by_tokens = np.maximum.accumulate(self.per_step_time(n)).tolist()
        self._by_sampled = np.maximum.accumulate(self.lm_head_time(n) + self.sampler_time(n)).tolist()
        self._tokens_table = np.asarray(self._by_tokens)
        self._sampled_table = np.asarray(self._by_sampled)
        self._pad_table = np.concatenate([np.asarray(self._pad, dtype=np.int64),
                                          np.arange(self._max_graph + 1, len(n), dtype=np.int64)])
        self._num_rows = len(n)
        # per step shape (t, s, seqs, prefill): _fixed_shape_step_times' scalars from these tables
        self._fixed_consts: dict[tuple[int, int, int, int], tuple] = {}
        # per batch size m: decode_run_times' durations by KV entries, and how often m was asked
        self._decode_tables: dict[int, np.ndarray] = {}
        self._decode_asks: dict[int, int] = {}

    # --- one step ------------------------------------------------------------------------
    def step_time(self, shape: StepShape) -> float:
        """Seconds for one iteration. Scalar Python arithmetic: this is on the hot path."""
        t, s, pairs, kv, seqs, prefill, window_kv = shape
        if t <= 0:
            return 0.0
        if t >= self._num_rows or s >= self._num_rows:  # grow the tables (rare)
            self._tabulate(max(t, s, 2 * (self._num_rows - 1)))
        if self._ext:
            attn = self._attention(t, s, pairs, kv, prefill, window_kv)
        else:
            attn = pairs * self._attn_flops_c
            mem = kv * self._kv_c + t * self._q_c
            if mem > attn:
                attn = mem
            attn = self._layers * attn
        if t <= self._max_graph:  # a CUDA graph padded to the next capture size
            gpu = self._by_tokens[self._pad[t]]
            if (prefill == 0) if prefill >= 0 else (t == s):  # decode-only: one full graph
                launch = self._launch_full
            else:
                launch = self._launch_piecewise
        else:
            gpu = self._by_tokens[t]
            launch = self._launch_eager
        gpu += attn + self._attn_o_all + self._by_sampled[s]
        if launch > gpu:  # the GPU waits for the launches
            gpu = launch
        cpu = self._cpu_step + self._cpu_seq * (seqs if seqs > 0 else (s if s > 1 else 1)) + self._cpu_tok * t
        if self.async_scheduling:
            return (cpu if cpu > gpu else gpu) + self._exposed
        return cpu + gpu

    def _attention(self, t: int, s: int, pairs: float, kv: float, prefill: int, window_kv: float) -> float:
        """Attention seconds of every layer (no kernel overheads) for an MLA or windowed model
        (item 7): MLA decode-only steps at the absorbed form's FLOPs; a windowed layer reads
        window_kv entries (kv_tokens when not given) and computes at most T * window pairs."""
        decode = (prefill == 0) if prefill >= 0 else (t == s)
        flops_c = self._attn_flops_decode_c if decode else self._attn_flops_c
        q = t * self._q_c
        a = pairs * flops_c
        m = kv * self._kv_c + q
        out = self._layers_full * (a if a > m else m)
        if self._layers_window:
            cap = t * self.window_tokens
            a = (pairs if pairs < cap else cap) * flops_c
            m = (kv if window_kv < 0 else window_kv) * self._kv_c + q
            out += self._layers_window * (a if a > m else m)
        return out

    def step_times(self, num_tokens: Any, num_sampled: Any, attn_pairs: Any, kv_tokens: Any,
                   num_seqs: Any = 0, num_prefill_tokens: Any = -1, window_kv_tokens: Any = -1
                   ) -> np.ndarray:
        """step_time over arrays of StepShape fields (broadcast), e.g. k decode steps at once for
        an event-level engine. Equals step_time element-wise."""
        # NOTE: the fixed-shape path knows full-attention dense layers only (not item 7's terms)
        if (not self._ext and type(num_tokens) is int and type(num_sampled) is int and type(num_seqs) is int
                and type(num_prefill_tokens) is int and num_tokens > 0
                and isinstance(attn_pairs, np.ndarray) and isinstance(kv_tokens, np.ndarray)
                and attn_pairs.shape == kv_tokens.shape and attn_pairs.ndim == 1):
            return self._fixed_shape_step_times(num_tokens, num_sampled, attn_pairs, kv_tokens,
                                                num_seqs, num_prefill_tokens)
        t = np.asarray(num_tokens, dtype=np.int64)
        s = np.asarray(num_sampled, dtype=np.int64)
        pairs = np.asarray(attn_pairs, dtype=np.float64)
        kv = np.asarray(kv_tokens, dtype=np.float64)
        seqs = np.asarray(num_seqs, dtype=np.int64)
        prefill = np.asarray(num_prefill_tokens, dtype=np.int64)
        wkv = np.asarray(window_kv_tokens, dtype=np.float64)
        t, s, pairs, kv, seqs, prefill, wkv = np.broadcast_arrays(t, s, pairs, kv, seqs, prefill, wkv)
        top = int(max(t.max(initial=0), s.max(initial=0)))
        if top >= self._num_rows:
            self._tabulate(max(top, 2 * (self._num_rows - 1)))
        o = self.overhead
        tc = np.clip(t, 0, None)
        decode_only = np.where(prefill >= 0, prefill == 0, t == s)
        if self._ext:  # _attention's terms, in its order
            flops_c = np.where(decode_only, self._attn_flops_decode_c, self._attn_flops_c)
            q = tc * self._q_c
            attn = self._layers_full * np.maximum(pairs * flops_c, kv * self._kv_c + q)
            if self._layers_window:
                windowed = np.maximum(np.minimum(pairs, tc * self.window_tokens) * flops_c,
                                      np.where(wkv < 0, kv, wkv) * self._kv_c + q)
                attn = attn + self._layers_window * windowed
        else:
            attn = self._layers * np.maximum(pairs * self._attn_flops_c, kv * self._kv_c + tc * self._q_c)
        graph = tc <= self._max_graph
        launch = np.where(graph, np.where(decode_only, self._launch_full, self._launch_piecewise),
                          self._launch_eager)
        # NOTE: the additions in step_time's order (`gpu += a + b + c`), so both are bit-equal
        gpu = self._tokens_table[np.where(graph, self._pad_table[tc], tc)] + (
            attn + self._attn_o_all + self._sampled_table[np.clip(s, 0, None)])
        gpu = np.maximum(gpu, launch)
        seqs_used = np.where(seqs > 0, seqs, np.maximum(s, 1))
        cpu = o.cpu_step_s + o.cpu_per_seq_s * seqs_used + o.cpu_per_token_s * tc
        step = np.maximum(cpu, gpu) + o.async_exposed_s if self.async_scheduling else cpu + gpu
        return np.where(t > 0, step, 0.0)

    def decode_run_times(self, m: int, first: int, k: int,
                         window_kv_tokens: np.ndarray | int = -1) -> np.ndarray:
        """The durations of an event-level decode run's k steps (engine/advance.py): pure
        decodes of m requests whose attention pairs and KV entries are both first + m j at step
        j (exact integers). Looked up in a per-size table of every entry count (`_decode_table`)
        where one is built, else computed; either way step_time's values element for element.
        NOTE: the lookup is a strided view of the table (read-only: a write would change every
        later run of size m); a view keeps its table alive after the table is replaced."""
        if self._ext:  # (the fixed-shape path and its tables have no windowed or MLA terms)
            kv = np.arange(first, first + m * k, m, dtype=np.int64)
            return self.step_times(m, m, kv, kv, m, 0, window_kv_tokens)
        end = first + m * k  # (one past the last step's entries, first + m (k - 1))
        table = self._decode_tables.get(m)
        if table is None or end - m >= len(table):
            table = self._decode_table(m, end - m)
        if table is not None:
            return table[first:end:m]
        kv = np.arange(first, end, m, dtype=np.int64)
        return self._fixed_shape_step_times(m, m, kv, kv, m, 0)

    def _decode_table(self, m: int, top: int) -> np.ndarray | None:
        """decode_run_times' table for batch size m, covering KV entries 0..top (or None): the
        fixed-shape durations of every entry count, element for element what the arrays would
        give. Built once m has been asked for _TABLE_AFTER times (a short run builds none),
        doubled as needed, within _TABLE_ENTRIES entries for one m and _TABLE_BUDGET for all."""
        asks = self._decode_asks.get(m, 0) + 1
        self._decode_asks[m] = asks
        if asks < _TABLE_AFTER:
            return None
        old = self._decode_tables.get(m)
        size = max(2 * (top + 1), 2 * len(old) if old is not None else 1 << 12)
        held = sum(map(len, self._decode_tables.values())) - (len(old) if old is not None else 0)
        if size > _TABLE_ENTRIES or held + size > _TABLE_BUDGET:
            return None
        entries = np.arange(size, dtype=np.float64)
        table = self._decode_tables[m] = self._fixed_shape_step_times(m, m, entries, entries, m, 0)
        table.flags.writeable = False  # (decode_run_times hands out views of it)
        return table

    def _fixed_shape_step_times(self, t: int, s: int, pairs: np.ndarray, kv: np.ndarray, seqs: int,
                                prefill: int) -> np.ndarray:
        """step_times when only the attention terms vary (an event-level decode run: the same
        tokens, samples and sequences every step): the per-shape choices are made once, the
        arrays see ~8 numpy calls instead of ~30. The same float operations in the same order
        as step_times (so step_time's, element for element)."""
        key = (t, s, seqs, prefill)
        consts = self._fixed_consts.get(key)
        if consts is None:
            if max(t, s) >= self._num_rows:
                self._tabulate(max(t, s, 2 * (self._num_rows - 1)))
            if t <= self._max_graph:
                decode_only = (prefill == 0) if prefill >= 0 else (t == s)
                launch = self._launch_full if decode_only else self._launch_piecewise
                base = self._tokens_table[self._pad_table[t]]
            else:
                launch = self._launch_eager
                base = self._tokens_table[t]
            o = self.overhead
            cpu = o.cpu_step_s + o.cpu_per_seq_s * (seqs if seqs > 0 else max(s, 1)) + o.cpu_per_token_s * t
            consts = self._fixed_consts[key] = (t * self._q_c, base, self._sampled_table[max(s, 0)],
                                                launch, cpu)
        tq, base, sampled, launch, cpu = consts
        # step_times' operations in its order, in place where the order allows
        gpu = pairs.astype(np.float64, copy=False) * self._attn_flops_c
        mem = kv.astype(np.float64, copy=False) * self._kv_c
        mem += tq
        np.maximum(gpu, mem, out=gpu)
        gpu *= self._layers
        gpu += self._attn_o_all
        gpu += sampled
        np.add(base, gpu, out=gpu)
        np.maximum(gpu, launch, out=gpu)
        if self.async_scheduling:
            np.maximum(cpu, gpu, out=gpu)
            gpu += self.overhead.async_exposed_s
            return gpu
        np.add(cpu, gpu, out=gpu)
        return gpu

    def attention_time_per_layer(self, pairs: float, kv_tokens: float, t: float) -> float:
        """Attention seconds for one full-attention layer of a step with a prefill (the term
        step_time uses; MLA decode-only steps and windowed layers: `_attention`)."""
        if t <= 0:
            return 0.0
        return max(pairs * self._attn_flops_c, kv_tokens * self._kv_c + t * self._q_c) + self._attn_o

    def overhead_time(self, shape: StepShape) -> float:
        """step_time less the kernel time at the unpadded T (what the per-step overhead adds)."""
        t, s, pairs, kv = shape[:4]
        if t <= 0:
            return 0.0
        if self._ext:
            attn = self._attention(t, s, pairs, kv, shape[5], shape[6]) + self._attn_o_all
        else:
            attn = self._layers * self.attention_time_per_layer(pairs, kv, t)
        kernels = float(self.per_step_time(t)) + attn + float(self.lm_head_time(s))
        return self.step_time(shape) - kernels

    def describe(self) -> str:
        """One line for run output: model, GPU, where the parameters come from (the data set they
        were fitted on, as the profile's provenance names it), a decode step's time, and the
        model terms no kernel here was measured for (item 7), for the models that use them."""
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
        terms = (f"; {'/'.join(self.extrapolated_terms)} terms: extrapolated (no measured kernels)"
                 if self.extrapolated_terms else "")
        return (f"cost model: {self.model.name} on {self.gpu.name} x tp={self.tp}, {src}; "
                f"decode step at batch 1 / ctx 1024: "
                f"{self.step_time(StepShape(1, 1, 1024, 1024)) * 1e3:.2f} ms{terms}")


def window_kv_sums(computed: Any, ahead: Any, window: int) -> np.ndarray:
    """sum over requests i of min(computed_i + a, window), for every a in `ahead`: the
    StepShape.window_kv_tokens of decode steps that each add `a` tokens to every request
    (engine/advance.py). Sorted prefix sums: O((m + k) log m)."""
    c = np.sort(np.asarray(computed, dtype=np.int64))
    csum = np.concatenate([np.zeros(1, np.int64), np.cumsum(c)])
    a = np.asarray(ahead, dtype=np.int64)
    below = np.searchsorted(c, window - a, side="left")  # requests with c + a < window
    return csum[below] + below * a + (len(c) - below) * window


def prefill_pairs(num_new: int, num_computed: int) -> float:
    """Causal query-key pairs for num_new tokens after num_computed earlier ones."""
    return num_new * num_computed + num_new * (num_new + 1) / 2


__all__ = ["GEMM_TILES", "Chip", "CostModel", "CostParams", "GemmGeometry", "ShardDims", "StepOverhead",
           "StepShape", "allreduce_time", "cudagraph_sizes", "elementwise_time", "gemm_time",
           "link_bandwidth", "op_times", "prefill_pairs", "window_kv_sums"]
