"""What vLLM 0.33 refuses to start with, checked before any simulation work.

Each rule mirrors one vLLM check (file and function in its comment) and raises one
ConfigError line naming the field, the value and what is allowed. `plan_memory` calls
them all (tensor parallelism and block size before the memory math, the KV capacity
after it), so every entry point that sets up an engine refuses the same inputs vLLM does.

    rule                                   vLLM 0.33 source
    heads % tp == 0                        config/model.py ModelConfig.verify_with_parallel_config
    kv_heads % tp == 0 or tp % kv_heads    model_executor/layers/linear.py QKVParallelLinear.__init__
    intermediate_size % tp == 0 (dense)    model_executor/layers/linear.py MergedColumnParallelLinear
      (also the dense layers of a MoE model, DeepSeek's first_k_dense_replace)
    block_size % 16 == 0                   platforms/cuda.py, platforms/rocm.py get_attn_backend_cls
    ceil(max_model_len / block_size)       v1/core/kv_cache_planning.py get_kv_cache_configs ->
      <= num_gpu_blocks - 1 (null block)     _check_enough_kv_cache_memory
    hybrid models: the blocks of one       same: _max_memory_usage_bytes_from_groups sums the
      max_model_len request summed over      groups' max_memory_usage_bytes / page_size_bytes
      the KV cache groups <= num_gpu_blocks - 1
"""

from __future__ import annotations

from simulator.errors import ConfigError
from simulator.hardware.models import ModelSpec

# Every CUDA and ROCm attention backend vLLM 0.33 picks for a decoder model with an
# unquantized KV cache accepts a block size only if it is a multiple of 16:
# FLASH_ATTN, TRITON_ATTN, FLEX_ATTENTION, ROCM_ATTN, ROCM_AITER_UNIFIED_ATTN: MultipleOf(16);
# FLASHINFER [16, 32, 64] and ROCM_AITER_FA [16, 32] with `supports_block_size` taking any
# multiple of those (v1/attention/backend.py AttentionBackend.supports_block_size).
ATTENTION_BLOCK_MULTIPLE = 16


def tp_refusal(model: ModelSpec, tp: int) -> str | None:
    """Why vLLM refuses `tp` for this model, or None when it accepts it.

    Steps (vLLM's order):
    1. attention heads divisible by tp (ModelConfig.verify_with_parallel_config);
    2. KV heads divisible by tp, or, when tp >= KV heads, tp divisible by KV heads, each KV
       head then replicated on tp / kv_heads GPUs (QKVParallelLinear: `divide(...)`);
    3. a dense MLP's intermediate size divisible by tp (Merged/ColumnParallelLinear:
       `assert output_size % tp_size == 0`); MoE experts round down (FusedMoE), no check.
    """
    name, kv = model.name, model.num_kv_heads
    if model.num_heads % tp:
        return f"must divide the {model.num_heads} attention heads of {name}"
    if kv % tp and tp % kv:  # tp < kv: kv % tp must be 0; tp > kv: tp % kv must be 0
        return f"must divide the {kv} KV heads of {name} or be a multiple of them"
    if (not model.is_moe or model.dense_layers) and model.intermediate_size % tp:
        return f"must divide the MLP intermediate size {model.intermediate_size} of {name}"
    return None


def allowed_tp_sizes(model: ModelSpec) -> list[int]:
    """Every tensor_parallel_size vLLM accepts for this model (all divide its head count)."""
    return [tp for tp in range(1, model.num_heads + 1) if tp_refusal(model, tp) is None]


def check_tensor_parallel(model: ModelSpec, tp: int) -> None:
    why = tp_refusal(model, tp)
    if why is not None:
        allowed = ", ".join(map(str, allowed_tp_sizes(model)))
        raise ConfigError(f"engine.tensor_parallel_size {why} (vLLM refuses others), got {tp}; "
                          f"allowed: {allowed}")


def check_block_size(block_size: int, gpu_name: str) -> None:
    """vLLM: a user-set --block-size that no attention backend supports leaves no valid
    backend (platforms/cuda.py CudaPlatformBase.get_attn_backend_cls: "No valid attention
    backend found"; platforms/rocm.py likewise)."""
    if block_size % ATTENTION_BLOCK_MULTIPLE:
        raise ConfigError(
            f"engine.block_size must be a multiple of {ATTENTION_BLOCK_MULTIPLE} (no vLLM attention "
            f"backend for {gpu_name} takes another size), got {block_size}; e.g. 16, 32, 64, 128")


def check_kv_capacity(num_gpu_blocks: int, block_size: int, max_model_len: int, where: str) -> None:
    """vLLM keeps one block of the pool as the null block (BlockPool.null_block) and refuses to
    start unless the rest holds one max_model_len request: ceil(max_model_len / block_size)
    <= num_gpu_blocks - 1 (v1/core/kv_cache_planning.py get_kv_cache_configs subtracts one
    block's bytes, then _check_enough_kv_cache_memory). `where` names the GPU and TP."""
    usable = num_gpu_blocks - 1
    if usable <= 0:  # vLLM: "No available memory for the cache blocks."
        raise ConfigError(
            f"the KV cache has {num_gpu_blocks} block(s) of {block_size} on {where}, but vLLM needs at "
            f"least 2 (one is its null block); raise gpu_memory_utilization or "
            f"engine.num_gpu_blocks_override")
    if -(-max_model_len // block_size) > usable:  # same as max_model_len > usable * block_size
        raise ConfigError(
            f"engine.max_model_len ({max_model_len}) is larger than the {usable * block_size} tokens the "
            f"KV cache can hold ({num_gpu_blocks} blocks of {block_size} on {where}, less vLLM's null "
            f"block); lower max_model_len or raise gpu_memory_utilization / tensor_parallel_size")


def check_kv_capacity_groups(num_gpu_blocks: int, block_size: int, max_model_len: int,
                             blocks_per_request: int, where: str) -> None:
    """check_kv_capacity for a model with sliding-window / chunked-local layers: one
    max_model_len request holds `blocks_per_request` block ids summed over its KV cache groups
    (kv_spec.KVCacheLayout.blocks_per_request), which must fit beside the null block."""
    usable = num_gpu_blocks - 1
    if usable <= 0:
        check_kv_capacity(num_gpu_blocks, block_size, max_model_len, where)
    if blocks_per_request > usable:
        raise ConfigError(
            f"engine.max_model_len ({max_model_len}) does not fit in the KV cache: one request of that "
            f"length holds {blocks_per_request} blocks over its KV cache groups, but {where} has "
            f"{num_gpu_blocks} blocks of {block_size} (less vLLM's null block); lower max_model_len or "
            f"raise gpu_memory_utilization / tensor_parallel_size")
