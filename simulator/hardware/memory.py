"""Memory math (vLLM's): how many KV blocks fit on one GPU.

    weights_per_gpu              = weights / tp, or with expert parallelism (EP over
                                   tp * dp GPUs): non-expert weights / tp
                                   + ceil(num_experts / (tp * dp)) experts per MoE layer
    requested                    = gpu_memory * gpu_memory_utilization
    kv_budget                    = requested - weights_per_gpu - activation_peak - non_torch
    KV cache groups              : kv_spec.py (vLLM's get_kv_cache_groups); one group for a
                                   full-attention model, several for hybrid ones
    bytes_per_block              = the widest group's pages of block_size tokens; for one
                                   full-attention group: block_size * kv_bytes_per_token, with
    kv_bytes_per_token (per GPU) = 2 * layers * ceil(kv_heads / tp) * head_dim * kv_dtype_bytes
                                   (MLA: layers * (kv_lora_rank + qk_rope_head_dim) * kv_dtype_bytes,
                                   on every GPU)
    num_gpu_blocks               = floor(kv_budget / bytes_per_block)
    start-up check               : blocks of one max_model_len request (summed over groups)
                                   <= num_gpu_blocks - 1 (block 0 is vLLM's null block;
                                   vllm_limits.py)

`activation_peak` stands in for vLLM's profiling pass (a dummy forward of
max_num_batched_tokens tokens plus the sampler over max_num_seqs rows): the largest
live intermediates of one layer (residual, QKV output, gate/up output, activation
output) for max_num_batched_tokens tokens, plus fp32 logits for max_num_seqs rows
(logits and their softmax copy). `non_torch` is memory outside PyTorch's allocator
(CUDA context, cuBLAS workspace, NCCL buffers). Both are estimates, documented as
such, and can be overridden with `activation_reserve_gib`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import ConfigError
from simulator.hardware.gpus import GIB, GpuSpec
from simulator.hardware.kv_spec import KVCacheLayout, kv_cache_layout
from simulator.hardware.models import ModelSpec
from simulator.hardware.vllm_limits import (
    check_block_size,
    check_kv_capacity,
    check_kv_capacity_groups,
    check_tensor_parallel,
)

NON_TORCH_BYTES = GIB // 2  # assumption: CUDA context + cuBLAS/NCCL workspaces ~0.5 GiB


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    # vLLM replicates KV heads when tp > num_kv_heads (each shard keeps at least one).
    return max(1, math.ceil(model.num_kv_heads / tp))


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int) -> int:
    if model.is_mla:  # one latent per token and layer, replicated on every TP rank
        return model.kv_bytes_per_token
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * model.dtype_bytes


def weights_per_gpu(model: ModelSpec, tp: int, *, quantization: str | None = None,
                    enable_expert_parallel: bool = False, data_parallel_size: int = 1) -> int:
    """Weight bytes on the fullest GPU. Steps:
    1. bytes by part in the weight format (`quantization`, else the checkpoint's; dtypes.py);
    2. without EP everything is split over the tp GPUs (experts TP-sharded, vLLM's FusedMoE
       default);
    3. with EP (--enable-expert-parallel) the routed experts are spread whole over
       ep = tp * data_parallel_size GPUs, the first num_experts % ep ranks holding one more
       (FusedMoE determine_expert_map); attention, dense MLPs, shared experts and embeddings
       stay TP-sharded (replicated across DP ranks)."""
    if not (enable_expert_parallel and model.is_moe):
        return math.ceil(model.weights_bytes_with(quantization) / tp)
    other, per_expert = model.weight_bytes_split(quantization)
    ep = tp * data_parallel_size
    return math.ceil(other / tp + -(-model.num_experts // ep) * per_expert)


def activation_peak_bytes(model: ModelSpec, tp: int, max_num_batched_tokens: int,
                          max_num_seqs: int) -> int:
    per_token = (model.hidden_size * 2  # residual stream + normed input
                 + (model.q_size + 2 * model.kv_size) // tp  # QKV output
                 + (3 if model.gated_mlp else 2) * model.intermediate_size // tp)  # gate/up + act
    layer = max_num_batched_tokens * per_token * model.dtype_bytes
    logits = max_num_seqs * model.vocab_size * 4 * 2  # fp32 logits + softmax copy
    return layer + logits


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """The result of the memory math, printed at start like vLLM's log lines."""

    total_bytes: int
    requested_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    kv_budget_bytes: int
    kv_bytes_per_token: int  # bytes_per_block / block_size (a hybrid model: of the widest group)
    block_size: int
    num_gpu_blocks: int
    kv_layout: KVCacheLayout | None = None  # the KV cache groups (kv_spec.py)
    max_concurrency: float | None = None  # vLLM's, for the max_model_len it was planned with
    capacity_tokens: int | None = None  # vLLM's "GPU KV cache size: N tokens"

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    @property
    def max_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def lines(self, max_model_len: int) -> list[str]:
        g = GIB
        if self.kv_layout is not None and self.kv_layout.is_hybrid:
            return [
                f"memory: requested {self.requested_bytes / g:.2f} GiB = weights {self.weights_bytes / g:.2f}"
                f" + activations {self.activation_bytes / g:.2f} + non-torch {self.non_torch_bytes / g:.2f}"
                f" + KV cache {self.kv_budget_bytes / g:.2f} GiB",
                f"# GPU blocks: {self.num_gpu_blocks:,} (block_size {self.block_size}, "
                f"{self.block_bytes / 1024:.1f} KiB/block; {self.kv_layout.describe()})",
                f"GPU KV cache size: {self.capacity_tokens:,} tokens; maximum concurrency for "
                f"{max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
            ]
        return [
            f"memory: requested {self.requested_bytes / g:.2f} GiB = weights {self.weights_bytes / g:.2f}"
            f" + activations {self.activation_bytes / g:.2f} + non-torch {self.non_torch_bytes / g:.2f}"
            f" + KV cache {self.kv_budget_bytes / g:.2f} GiB",
            f"# GPU blocks: {self.num_gpu_blocks:,} (block_size {self.block_size}, "
            f"{self.kv_bytes_per_token / 1024:.1f} KiB/token/GPU)",
            f"GPU KV cache size: {self.max_tokens:,} tokens; maximum concurrency for {max_model_len:,}"
            f" tokens per request: {self.max_tokens / max_model_len:.2f}x",
        ]


def plan_memory(model: ModelSpec, gpu: GpuSpec, *, tp: int, block_size: int,
                gpu_memory_utilization: float, max_num_batched_tokens: int, max_num_seqs: int,
                max_model_len: int, activation_reserve_gib: float | None = None,
                num_gpu_blocks_override: int | None = None, kv_cache_dtype: str = "auto",
                quantization: str | None = None, enable_expert_parallel: bool = False,
                data_parallel_size: int = 1, max_in_flight_tokens: int | None = None,
                hybrid_kv_cache_manager: bool = True) -> MemoryPlan:
    """Steps: 1. refuse a tensor_parallel_size or block_size vLLM refuses (vllm_limits.py);
    2. the KV cache groups and bytes per block (kv_spec.py; `kv_cache_dtype` is vLLM's
    --kv-cache-dtype); 3. weights (`quantization`, expert parallelism) and activation shares;
    4. KV budget; 5. blocks; 6. check that one max_model_len request fits beside vLLM's null
    block (vLLM refuses to start otherwise).

    `max_in_flight_tokens` is vLLM's VllmConfig.max_in_flight_tokens, which sizes sliding-window
    and chunked-local groups: max_num_batched_tokens (the default here) under sync scheduling,
    twice that with async scheduling. `hybrid_kv_cache_manager=False` is vLLM's
    --disable-hybrid-kv-cache-manager (every layer keeps every token)."""
    check_tensor_parallel(model, tp)
    check_block_size(block_size, gpu.name)
    if data_parallel_size < 1:
        raise ConfigError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
    layout = kv_cache_layout(model, tp=tp, block_size=block_size, kv_cache_dtype=kv_cache_dtype,
                             hybrid_kv_cache_manager=hybrid_kv_cache_manager)
    bytes_per_block = layout.bytes_per_block
    total = gpu.memory_bytes
    requested = int(total * gpu_memory_utilization)
    weights = weights_per_gpu(model, tp, quantization=quantization,
                              enable_expert_parallel=enable_expert_parallel,
                              data_parallel_size=data_parallel_size)
    if activation_reserve_gib is None:
        activation = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
        non_torch = NON_TORCH_BYTES
    else:
        activation, non_torch = int(activation_reserve_gib * GIB), 0
    budget = requested - weights - activation - non_torch
    if budget <= 0:
        where = f"{gpu.name} x tp={tp}"
        if enable_expert_parallel and model.is_moe:
            ep = tp * data_parallel_size
            raise ConfigError(
                f"model {model.name} does not fit even with expert parallelism: {where} (experts over "
                f"{ep} GPUs) gives {requested / GIB:.1f} GiB at gpu_memory_utilization="
                f"{gpu_memory_utilization}, but weights need {weights / GIB:.1f} GiB/GPU and activations "
                f"{(activation + non_torch) / GIB:.1f} GiB; raise tensor_parallel_size or "
                f"data_parallel_size (cluster.replicas), quantize the weights, or pick a larger GPU")
        hint = ", enable expert parallelism" if model.is_moe else ""
        raise ConfigError(
            f"model {model.name} does not fit: {where} gives "
            f"{requested / GIB:.1f} GiB at gpu_memory_utilization={gpu_memory_utilization}, but weights "
            f"need {weights / GIB:.1f} GiB/GPU and activations {(activation + non_torch) / GIB:.1f} GiB; "
            f"raise tensor_parallel_size or gpu_memory_utilization{hint}, or pick a larger GPU")
    num_blocks = layout.num_blocks(budget)
    if num_gpu_blocks_override is not None:  # vLLM: profiling is kept, the count replaced
        num_blocks = num_gpu_blocks_override
    in_flight = max_num_batched_tokens if max_in_flight_tokens is None else max_in_flight_tokens
    per_request = layout.blocks_per_request(max_model_len, in_flight)
    plan = MemoryPlan(total, requested, weights, activation, non_torch, budget,
                      bytes_per_block // block_size, block_size, num_blocks, layout,
                      num_blocks / per_request, int(num_blocks / per_request * max_model_len))
    where = f"{gpu.name} x tp={tp}"
    if layout.is_hybrid:
        check_kv_capacity_groups(num_blocks, block_size, max_model_len, per_request, where)
    else:
        check_kv_capacity(num_blocks, block_size, max_model_len, where)
    return plan
