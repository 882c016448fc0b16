"""Memory math: block counts equal vLLM's formula, and the start-up checks fire."""

from __future__ import annotations

import math

import pytest

from simulator.errors import ConfigError
from simulator.hardware.gpus import get_gpu, gpu_names
from simulator.hardware.memory import NON_TORCH_BYTES, activation_peak_bytes, plan_memory, weights_per_gpu
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


# --- weight formats and expert parallelism (issue 15) ---------------------------------------

def _plan(model, gpu, tp, **kw):
    args = dict(block_size=16, gpu_memory_utilization=0.9, max_num_batched_tokens=8192, max_num_seqs=256,
                max_model_len=8192)
    return plan_memory(get_model(model), get_gpu(gpu), tp=tp, **{**args, **kw})


def test_unquantized_weights_per_gpu_unchanged():
    """Every model of the old catalogue: num_params * 2 bytes / tp, as before."""
    for name in ("opt-13b", "llama-2-70b", "llama-3.1-8b", "mixtral-8x7b", "qwen2.5-72b", "phi-2"):
        m = get_model(name)
        for tp in (1, 2, 4, 8):
            assert weights_per_gpu(m, tp) == math.ceil(m.num_params * 2 / tp)


def test_weight_formats_bytes_per_weight():
    """Llama-3.3-70B: linear layers at the format's bytes/weight, embeddings + LM head at bf16."""
    m = get_model("llama-3.3-70b")
    linear = m.num_layers * (m.attn_params_per_layer + m.dense_mlp_params)
    emb = 2 * m.vocab_size * m.hidden_size
    for quantization, per_weight in (("fp8", 1), ("w4a16", 0.5 + 2.5 / 128), ("nvfp4", 0.5 + 1 / 16),
                                     ("bf16", 2), ("gptq", 0.5 + 2.5 / 128), ("modelopt_fp4", 0.5 + 1 / 16)):
        assert weights_per_gpu(m, 1, quantization=quantization) == pytest.approx(
            linear * per_weight + emb * 2, abs=1)
    # mxfp4 quantizes only MoE experts (vLLM's Mxfp4Config): a dense model stays bf16
    assert weights_per_gpu(m, 1, quantization="mxfp4") == m.num_params * 2
    # gpt-oss ships mxfp4 experts: 17/32 byte per expert weight, the rest bf16
    oss = get_model("gpt-oss-120b")
    experts = oss.num_moe_layers * oss.num_experts * oss.mlp_params_per_expert
    assert weights_per_gpu(oss, 1) == math.ceil(experts * 17 / 32 + (oss.num_params - experts) * 2)
    assert weights_per_gpu(oss, 1, quantization="bf16") == oss.num_params * 2


def test_expert_parallel_spreads_whole_experts_over_tp_times_dp():
    """DeepSeek-V3 (fp8): TP 8 with EP over 3 DP replicas puts ceil(256 / 24) = 11 experts on a
    GPU; attention, dense layers, shared expert and embeddings stay TP 8."""
    m = get_model("deepseek-v3")
    other, per_expert = m.weight_bytes_split()
    assert weights_per_gpu(m, 8, enable_expert_parallel=True, data_parallel_size=3) == math.ceil(
        other / 8 + 11 * per_expert)
    assert weights_per_gpu(m, 8, enable_expert_parallel=True) == weights_per_gpu(m, 8)  # 32 experts each
    assert weights_per_gpu(m, 8) / GIB == pytest.approx(78.3, abs=0.1)
    assert weights_per_gpu(get_model("llama-3.3-70b"), 8, enable_expert_parallel=True) == weights_per_gpu(
        get_model("llama-3.3-70b"), 8)  # a dense model has no experts to spread


def test_deepseek_v3_fits_eight_h200_not_eight_h100():
    plan = _plan("deepseek-v3", "h200", 8, enable_expert_parallel=True)
    assert plan.kv_bytes_per_token == 61 * 576 * 2 and plan.num_gpu_blocks > 0
    with pytest.raises(ConfigError) as e:
        _plan("deepseek-v3", "h100-sxm", 8, enable_expert_parallel=True)
    assert str(e.value).startswith("model deepseek-ai/DeepSeek-V3 does not fit even with expert parallelism: "
                                   "h100-sxm x tp=8 (experts over 8 GPUs) gives 71.7 GiB")
    assert str(e.value).endswith("weights need 78.3 GiB/GPU and activations 1.2 GiB; raise "
                                 "tensor_parallel_size or data_parallel_size (cluster.replicas), quantize "
                                 "the weights, or pick a larger GPU")
    assert "\n" not in str(e.value)


def test_moe_that_does_not_fit_suggests_expert_parallelism():
    with pytest.raises(ConfigError, match=r"does not fit: h100-sxm x tp=2 .* raise tensor_parallel_size or "
                                          r"gpu_memory_utilization, enable expert parallelism, or pick"):
        _plan("qwen3-235b-a22b", "h100-sxm", 2)


@pytest.mark.parametrize("kw,message", [
    ({"quantization": "int3"},
     r"^quantization 'int3' is not supported \(did you mean 'int4'\?\); valid: bf16, fp8, w4a16, mxfp4, "
     r"nvfp4 \(vLLM names: none, "),
    ({"kv_cache_dtype": "fp8_e4m3fn"},
     r"^kv_cache_dtype 'fp8_e4m3fn' is not supported \(did you mean 'fp8_e4m3'\?\); valid: auto, bfloat16, "
     r"float16, fp8, fp8_e4m3, fp8_e5m2$"),
    ({"data_parallel_size": 0}, r"^data_parallel_size must be >= 1, got 0$"),
])
def test_bad_format_is_one_line(kw, message):
    with pytest.raises(ConfigError, match=message):
        _plan("qwen3-8b", "h100-sxm", 1, **kw)


def test_memory_lines_for_full_attention_are_unchanged_and_hybrid_ones_name_the_groups():
    full = _plan("llama-3.1-8b", "h100-sxm", 1)
    assert full.lines(8192)[2] == (f"GPU KV cache size: {full.max_tokens:,} tokens; maximum concurrency for "
                                   f"8,192 tokens per request: {full.max_tokens / 8192:.2f}x")
    assert full.max_concurrency == full.num_gpu_blocks / 512  # vLLM's: blocks / cdiv(8192, 16)
    hybrid = _plan("gemma-3-27b", "h100-sxm", 2)
    assert hybrid.lines(8192)[1] == (
        f"# GPU blocks: {hybrid.num_gpu_blocks:,} (block_size 16, 640.0 KiB/block; 7 KV cache groups of "
        f"64.0 KiB pages: 6 x sliding window 1024 (52 layers), 1 x full attention (10 layers))")
    assert hybrid.block_bytes == 10 * 16 * 8 * 2 * 128 * 2  # the widest group: 10 layer pages
