"""Memory math: block counts equal vLLM's formula, and the start-up checks fire."""

from __future__ import annotations

import math

import pytest

from simulator.errors import ConfigError
from simulator.hardware.gpus import get_gpu, gpu_names
from simulator.hardware.memory import NON_TORCH_BYTES, activation_peak_bytes, plan_memory
from simulator.hardware.models import get_model

GIB = 2**30

CASES = [  # model, gpu, tp, block_size, util
    ("llama-2-7b", "a100-40gb", 1, 16, 0.9),
    ("llama-3.1-70b", "h100", 4, 32, 0.9),
    ("opt-13b", "a100-40gb", 1, 16, 0.95),
    ("qwen2.5-7b", "l4", 1, 64, 0.85),
    ("mixtral-8x7b", "h200", 2, 16, 0.9),
]


@pytest.mark.parametrize("model,gpu,tp,bs,util", CASES)
def test_block_count_equals_formula(model, gpu, tp, bs, util):
    m, g = get_model(model), get_gpu(gpu)
    plan = plan_memory(m, g, tp=tp, block_size=bs, gpu_memory_utilization=util,
                       max_num_batched_tokens=2048, max_num_seqs=256, max_model_len=2048)
    kv_heads = max(1, math.ceil(m.num_kv_heads / tp))
    per_token = 2 * m.num_layers * kv_heads * m.head_dim * 2
    budget = (int(g.memory_gib * GIB * util) - math.ceil(m.num_params * 2 / tp)
              - activation_peak_bytes(m, tp, 2048, 256) - NON_TORCH_BYTES)
    assert plan.num_gpu_blocks == budget // (bs * per_token)
    assert plan.max_tokens == plan.num_gpu_blocks * bs


def test_paged_attention_table1_shape():
    """OPT-13B on one A100-40GB: ~26 GB of weights (PagedAttention Table 1)."""
    plan = plan_memory(get_model("opt-13b"), get_gpu("a100-40gb"), tp=1, block_size=16,
                       gpu_memory_utilization=0.9, max_num_batched_tokens=2048, max_num_seqs=256,
                       max_model_len=2048)
    assert plan.weights_bytes / 1e9 == pytest.approx(25.7, abs=0.3)
    assert plan.kv_bytes_per_token == 800 * 1024


def test_model_that_does_not_fit():
    with pytest.raises(ConfigError, match="does not fit.*raise tensor_parallel_size"):
        plan_memory(get_model("llama-3.1-70b"), get_gpu("l4"), tp=1, block_size=16,
                    gpu_memory_utilization=0.9, max_num_batched_tokens=2048, max_num_seqs=256,
                    max_model_len=4096)


def test_max_model_len_larger_than_cache():
    with pytest.raises(ConfigError, match=r"max_model_len \(131072\) is larger than"):
        plan_memory(get_model("llama-3.1-8b"), get_gpu("l4"), tp=1, block_size=16,
                    gpu_memory_utilization=0.9, max_num_batched_tokens=2048, max_num_seqs=256,
                    max_model_len=131072)


def test_every_gpu_profile_loads_with_sources():
    for name in gpu_names():
        g = get_gpu(name)
        assert g.memory_gib > 0 and g.hbm_bandwidth_gbps > 0 and g.peak_tflops["bf16"] > 0


def test_unknown_gpu():
    with pytest.raises(ConfigError, match=r"unknown GPU 'h1000'.*did you mean 'h100'.*valid:"):
        get_gpu("h1000")
