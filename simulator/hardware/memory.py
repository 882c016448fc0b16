"""Memory math (vLLM's): how many KV blocks fit on one GPU.

    kv_bytes_per_token (per GPU) = 2 * layers * ceil(kv_heads / tp) * head_dim * dtype_bytes
    block_bytes                  = block_size * kv_bytes_per_token
    requested                    = gpu_memory * gpu_memory_utilization
    kv_budget                    = requested - weights_per_gpu - activation_peak - non_torch
    num_gpu_blocks               = floor(kv_budget / block_bytes)
    start-up check               : ceil(max_model_len / block_size) <= num_gpu_blocks - 1
                                   (block 0 is vLLM's null block; vllm_limits.py)

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
from simulator.hardware.models import ModelSpec
from simulator.hardware.vllm_limits import check_block_size, check_kv_capacity, check_tensor_parallel

NON_TORCH_BYTES = GIB // 2  # assumption: CUDA context + cuBLAS/NCCL workspaces ~0.5 GiB


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    # vLLM replicates KV heads when tp > num_kv_heads (each shard keeps at least one).
    return max(1, math.ceil(model.num_kv_heads / tp))


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int) -> int:
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * model.dtype_bytes


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
    kv_bytes_per_token: int
    block_size: int
    num_gpu_blocks: int

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.kv_bytes_per_token

    @property
    def max_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def lines(self, max_model_len: int) -> list[str]:
        g = GIB
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
                num_gpu_blocks_override: int | None = None) -> MemoryPlan:
    """Steps: 1. refuse a tensor_parallel_size or block_size vLLM refuses (vllm_limits.py);
    2. bytes per token per GPU; 3. weights and activation shares; 4. KV budget; 5. blocks;
    6. check that one max_model_len request fits beside vLLM's null block (vLLM refuses to
    start otherwise)."""
    check_tensor_parallel(model, tp)
    check_block_size(block_size, gpu.name)
    kv_per_token = kv_bytes_per_token_per_gpu(model, tp)
    total = gpu.memory_bytes
    requested = int(total * gpu_memory_utilization)
    weights = math.ceil(model.weights_bytes / tp)
    if activation_reserve_gib is None:
        activation = activation_peak_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
        non_torch = NON_TORCH_BYTES
    else:
        activation, non_torch = int(activation_reserve_gib * GIB), 0
    budget = requested - weights - activation - non_torch
    if budget <= 0:
        raise ConfigError(
            f"model {model.name} does not fit: {gpu.name} x tp={tp} gives "
            f"{requested / GIB:.1f} GiB at gpu_memory_utilization={gpu_memory_utilization}, but weights "
            f"need {weights / GIB:.1f} GiB/GPU and activations {(activation + non_torch) / GIB:.1f} GiB; "
            f"raise tensor_parallel_size or gpu_memory_utilization, or pick a larger GPU")
    num_blocks = budget // (block_size * kv_per_token)
    if num_gpu_blocks_override is not None:  # vLLM: profiling is kept, the count replaced
        num_blocks = num_gpu_blocks_override
    plan = MemoryPlan(total, requested, weights, activation, non_torch, budget, kv_per_token,
                      block_size, num_blocks)
    check_kv_capacity(num_blocks, block_size, max_model_len, f"{gpu.name} x tp={tp}")
    return plan
