"""KV cache layout (simulator/hardware/kv_spec.py) against vLLM 0.33's own planning code.

For every config.json under tests/hf_configs/ (the new catalogue models, Kimi-K2 and three
older ones), on two GPUs (TP 2; TP 8 for three models that replicate KV), with kv_cache_dtype
auto and fp8: KV bytes per token, the KV cache groups with their page sizes, num_gpu_blocks
and max concurrency for one memory budget. The figures vLLM computes are committed in
tests/hf_configs/vllm_kv_expected.json; kvsim must equal them always, and where vLLM is
importable (docs/parity.md: CPU-only install) vLLM must still compute them.

How vLLM computes them on CPU (`_vllm_figures`): vLLM's ModelConfig reads the config.json
(head size, KV heads per TP rank, layer types, sliding window, chunk size, MLA), one KV cache
spec per layer is built with vLLM's spec classes by the per-layer rule of the model's vLLM
file (the attention layer's get_kv_cache_spec needs an attention backend, which CPU lacks),
then get_global_kv_cache_groups, get_kv_cache_configs and
get_max_concurrency_for_kv_cache_config run unchanged. Two adaptations: quantization_config
is dropped (the fp8 / mxfp4 kernels do not import on CPU; it does not change the KV cache),
and a multimodal wrapper's text_config is served as its text-only architecture (what vLLM
builds the language model from). The hybrid KV cache manager, which vLLM turns off on CPU
platforms only, is switched back on as on GPU.

Regenerate the committed file (needs vLLM): PYTHONPATH=. python tests/test_kv_layout.py
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.hardware.gpus import GIB, get_gpu
from simulator.hardware.kv_spec import cdiv, kv_cache_layout
from simulator.hardware.memory import plan_memory
from simulator.hardware.models import ALIASES, CATALOGUE, get_model, load_model

CONFIGS = Path(__file__).parent / "hf_configs"
EXPECTED_FILE = CONFIGS / "vllm_kv_expected.json"
BLOCK, MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS = 16, 32768, 8192
IN_FLIGHT = 2 * MAX_NUM_BATCHED_TOKENS  # vLLM's max_in_flight_tokens with async scheduling (default)
BUDGET = 20 * GIB + 12345  # KV cache bytes per GPU, the same for kvsim and vLLM
NAMES = sorted(p.name for p in CONFIGS.iterdir() if (p / "config.json").is_file())
CASES = ([(n, kvd, 2) for n in NAMES for kvd in ("auto", "fp8")]
         + [(n, "auto", 8) for n in ("deepseek-v3", "gpt-oss-120b", "qwen3-235b-a22b")])


def _key(name: str, kv_cache_dtype: str, tp: int) -> str:
    return f"{name} kv={kv_cache_dtype} tp={tp}"


def kvsim_figures(name: str, kv_cache_dtype: str, tp: int) -> dict:
    layout = kv_cache_layout(load_model(CONFIGS / name), tp=tp, block_size=BLOCK,
                             kv_cache_dtype=kv_cache_dtype)
    blocks = layout.num_blocks(BUDGET)
    return {"kv_bytes_per_token": layout.kv_bytes_per_token,
            "groups": [[g.spec.kind, len(g.layers), g.spec.page_size_bytes] for g in layout.groups],
            "num_gpu_blocks": blocks,
            "max_concurrency": layout.max_concurrency(blocks, MAX_MODEL_LEN, IN_FLIGHT)}


# --- vLLM's side ----------------------------------------------------------------------------

_TEXT_ARCH = {"gemma3": "Gemma3ForCausalLM", "llama4": "Llama4ForCausalLM", "mistral3": "MistralForCausalLM"}
_KIND = {"FullAttentionSpec": "full_attention", "SlidingWindowSpec": "sliding_window",
         "ChunkedLocalAttentionSpec": "chunked_local", "MLAAttentionSpec": "mla"}


def _vllm_model_dir(name: str, tmp: Path) -> Path:
    cfg = json.loads((CONFIGS / name / "config.json").read_text())
    cfg.pop("quantization_config", None)
    if "text_config" in cfg:
        cfg = {**cfg["text_config"], "architectures": [_TEXT_ARCH[cfg["model_type"]]],
               "torch_dtype": cfg.get("torch_dtype", "bfloat16")}
    out = tmp / name
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _vllm_layer_specs(mc, pc, kv_cache_dtype: str) -> dict:
    """Per layer, what the model's vLLM attention layer's get_kv_cache_spec returns:
    MLA (deepseek_v2.py -> MLAAttention); gpt_oss.py: sliding on layer_idx % 2 == 0;
    gemma3.py / llama.py: layer_types; llama4.py: ChunkedLocalAttention on chunked layers;
    a model without mixed layer_types: CacheConfig.sliding_window on every layer
    (engine/arg_utils.py)."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        get_kv_quant_mode,
    )
    common = dict(block_size=BLOCK, head_size=mc.get_head_size(),
                  kv_quant_mode=get_kv_quant_mode(kv_cache_dtype),
                  dtype=kv_cache_dtype_str_to_dtype(kv_cache_dtype, mc))
    heads, hf = mc.get_num_kv_heads(pc), mc.hf_text_config
    layer_types = getattr(hf, "layer_types", None)
    uniform_window = not layer_types or all(t == "sliding_attention" for t in layer_types)
    window = mc.get_sliding_window()
    specs = {}
    for i in range(mc.get_num_layers(pc)):
        kind = layer_types[i] if layer_types else None
        if hf.model_type == "gpt_oss":
            kind = "sliding_attention" if i % 2 == 0 else "full_attention"
        if mc.use_mla:
            spec = MLAAttentionSpec(num_kv_heads=1, max_tp_shards=1, cache_dtype_str=kv_cache_dtype, **common)
        elif kind == "chunked_attention":
            spec = ChunkedLocalAttentionSpec(num_kv_heads=heads, attention_chunk_size=mc.attention_chunk_size,
                                             **common)
        elif window and (kind == "sliding_attention" or uniform_window):
            spec = SlidingWindowSpec(num_kv_heads=heads, sliding_window=window, **common)
        else:
            spec = FullAttentionSpec(num_kv_heads=heads, **common)
        specs[f"model.layers.{i}.self_attn.attn"] = spec
    return specs


def _vllm_figures(name: str, kv_cache_dtype: str, tp: int, tmp: Path) -> dict:
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.core import kv_cache_planning
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    mc = ModelConfig(model=str(_vllm_model_dir(name, tmp)), skip_tokenizer_init=True,
                     max_model_len=MAX_MODEL_LEN)
    pc = ParallelConfig(tensor_parallel_size=tp)
    cache = CacheConfig(block_size=BLOCK, cache_dtype=kv_cache_dtype)
    cache.kv_cache_layout = "LBHNC"  # normally resolved by the engine core
    scheduler = SchedulerConfig(max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False,
                                max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS)
    config = VllmConfig(model_config=mc, cache_config=cache, parallel_config=pc,
                        scheduler_config=scheduler, device_config=DeviceConfig(device="cpu"))
    config.scheduler_config.disable_hybrid_kv_cache_manager = False  # off only on CPU platforms
    assert config.max_in_flight_tokens == IN_FLIGHT
    specs = _vllm_layer_specs(mc, pc, kv_cache_dtype)
    groups = kv_cache_planning.get_global_kv_cache_groups(config, [specs])
    kv_config = kv_cache_planning.get_kv_cache_configs(config, [specs], [BUDGET], groups)[0]
    return {"kv_bytes_per_token": sum(s.page_size_bytes // BLOCK for s in specs.values()),
            "groups": [[_KIND[type(g.kv_cache_spec).__name__], len(g.layer_names),
                        g.kv_cache_spec.page_size_bytes] for g in kv_config.kv_cache_groups],
            "num_gpu_blocks": kv_config.num_blocks,
            "max_concurrency": get_max_concurrency_for_kv_cache_config(config, kv_config)}


def _expected() -> dict:
    return json.loads(EXPECTED_FILE.read_text())


# --- 1. kvsim computes what vLLM computes ---------------------------------------------------

@pytest.mark.parametrize("name,kv_cache_dtype,tp", CASES)
def test_kvsim_equals_vllm_figures(name, kv_cache_dtype, tp):
    assert kvsim_figures(name, kv_cache_dtype, tp) == _expected()[_key(name, kv_cache_dtype, tp)]


def test_committed_figures_cover_every_case():
    assert sorted(_expected()) == sorted(_key(*c) for c in CASES)


def test_every_new_catalogue_model_has_a_config():
    new = [name for name in CATALOGUE if name not in _OLD_CATALOGUE]
    assert len(new) == 11
    for name in new:
        short = [alias for alias, full in ALIASES.items() if full == name]
        assert short and short[0] in NAMES, name


_OLD_CATALOGUE = {"facebook/opt-13b", "meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-13b-hf",
                  "meta-llama/Llama-2-70b-hf", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B",
                  "mistralai/Mistral-7B-v0.1", "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen2.5-7B",
                  "Qwen/Qwen2.5-72B", "microsoft/phi-2"}


@pytest.fixture(scope="module")
def vllm_tmp(tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM is not installed (the `vllm` extra, docs/parity.md)")
    return tmp_path_factory.mktemp("vllm-configs")


@pytest.mark.parametrize("name,kv_cache_dtype,tp", CASES)
def test_vllm_still_computes_the_committed_figures(vllm_tmp, name, kv_cache_dtype, tp):
    assert _vllm_figures(name, kv_cache_dtype, tp, vllm_tmp) == _expected()[_key(name, kv_cache_dtype, tp)]


def test_vllm_sliding_and_chunked_skip_rules(vllm_tmp):
    """kvsim's blocks_needed frees what vLLM's managers free (get_num_skipped_tokens)."""
    from vllm.v1.core.single_type_kv_cache_manager import ChunkedLocalAttentionManager, SlidingWindowManager
    sliding = kv_cache_layout(get_model("gpt-oss-20b"), tp=2, block_size=BLOCK).groups[0].spec
    chunked = kv_cache_layout(get_model("llama-4-scout"), tp=2, block_size=BLOCK).groups[0].spec
    sw = types.SimpleNamespace(sliding_window=128, extra_retained_tokens=0)
    ch = types.SimpleNamespace(attention_chunk_size=8192)
    for n in range(0, 40000, 7):
        assert sliding.num_skipped_tokens(n) == SlidingWindowManager.get_num_skipped_tokens(sw, n)
        assert chunked.num_skipped_tokens(n) == ChunkedLocalAttentionManager.get_num_skipped_tokens(ch, n)


# --- 2. fp8 KV: exactly half the bytes, exactly twice the tokens ----------------------------

@pytest.mark.parametrize("name", NAMES)
def test_fp8_kv_doubles_token_capacity_exactly(name):
    model = load_model(CONFIGS / name)
    auto = kv_cache_layout(model, tp=2, block_size=BLOCK)
    fp8 = kv_cache_layout(model, tp=2, block_size=BLOCK, kv_cache_dtype="fp8")
    assert model.dtype_bytes == 2
    assert fp8.bytes_per_block * 2 == auto.bytes_per_block
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token
    budget = 1000 * auto.bytes_per_block  # a whole number of bf16 blocks
    assert fp8.num_blocks(budget) == 2 * auto.num_blocks(budget) == 2000
    assert fp8.max_concurrency(2000, MAX_MODEL_LEN, IN_FLIGHT) == 2 * auto.max_concurrency(
        1000, MAX_MODEL_LEN, IN_FLIGHT)


def test_fp8_kv_through_plan_memory():
    """The same GPU budget holds twice the blocks of the same tokens (plus at most one)."""
    kw = dict(tp=1, block_size=16, gpu_memory_utilization=0.9, max_num_batched_tokens=8192,
              max_num_seqs=256, max_model_len=32768)
    auto = plan_memory(get_model("qwen3-8b"), get_gpu("h100-sxm"), **kw)
    fp8 = plan_memory(get_model("qwen3-8b"), get_gpu("h100-sxm"), kv_cache_dtype="fp8", **kw)
    assert fp8.kv_budget_bytes == auto.kv_budget_bytes
    assert fp8.kv_bytes_per_token * 2 == auto.kv_bytes_per_token == 144 * 1024
    assert fp8.num_gpu_blocks - 2 * auto.num_gpu_blocks in (0, 1)


# --- 3. sliding windows: a long request keeps window / block_size + 1 blocks per group -----

@pytest.mark.parametrize("model,window", [("gpt-oss-20b", 128), ("gpt-oss-120b", 128), ("gemma-3-27b", 1024)])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_sliding_group_holds_at_most_window_over_block_plus_one(model, window, block_size):
    layout = kv_cache_layout(get_model(model), tp=2, block_size=block_size)
    sliding = [i for i, g in enumerate(layout.groups) if g.spec.kind == "sliding_window"]
    full = [i for i, g in enumerate(layout.groups) if g.spec.kind == "full_attention"]
    assert sliding and full
    cap = window // block_size + 1
    most = 0
    for n in range(1, 40001):  # decoding one token at a time up to 40k tokens
        blocks = layout.blocks_needed(n)
        for i in sliding:
            assert blocks[i] <= cap, (n, blocks[i])
            # the blocks that hold the window's tokens [n - window, n), counted directly
            assert blocks[i] == cdiv(n, block_size) - max(0, n - window) // block_size
        for i in full:
            assert blocks[i] == cdiv(n, block_size)
        most = max(most, blocks[sliding[0]])
    assert most == cap  # the bound is reached (a window straddling block edges)


def test_chunked_local_group_holds_one_chunk():
    layout = kv_cache_layout(get_model("llama-4-scout"), tp=2, block_size=BLOCK)
    chunked = [g for g in layout.groups if g.spec.kind == "chunked_local"]
    assert [len(g.layers) for g in chunked] == [12, 12, 12]
    for n in range(1, 40001, 3):
        blocks = layout.blocks_needed(n)
        assert max(blocks[:3]) <= 8192 // BLOCK + 1
        assert blocks[3] == cdiv(n, BLOCK)


def test_prefill_chunk_keeps_the_window_plus_the_chunk():
    """Chunked prefill: the last 8,192-token chunk of a 32k prompt needs the window behind it
    plus the chunk (what vLLM's SlidingWindowSpec admission cap reserves)."""
    layout = kv_cache_layout(get_model("gpt-oss-20b"), tp=2, block_size=BLOCK)
    sliding, full = layout.blocks_needed(32768, num_new_tokens=8192)
    assert full == 2048
    assert sliding == 2048 - (24576 - 127) // 16 == 520
    assert sliding <= layout.groups[0].spec.max_blocks_per_request(32768, 8192) == cdiv(127 + 8192, 16) + 1


def test_32k_prompt_on_gpt_oss_fits_only_with_the_hybrid_allocator():
    """gpt-oss-120b on one H100 at gpu_memory_utilization 0.8: 1.85 GiB of KV cache. As vLLM
    plans it (sliding layers hold window + in-flight tokens) a 32k request fits 1.31 times;
    the full-attention calculation (every layer keeps every token, vLLM's
    --disable-hybrid-kv-cache-manager) refuses to start."""
    kw = dict(tp=1, block_size=16, gpu_memory_utilization=0.8, max_num_batched_tokens=8192,
              max_num_seqs=256, max_model_len=32768)
    model, gpu = get_model("gpt-oss-120b"), get_gpu("h100-sxm")
    plan = plan_memory(model, gpu, **kw)
    assert plan.kv_budget_bytes / GIB == pytest.approx(1.85, abs=0.01)
    assert plan.num_gpu_blocks == 3360 and plan.max_concurrency == pytest.approx(1.31, abs=0.005)
    full_need = model.kv_bytes_per_token * 32768  # 2.25 GiB: more than the budget
    assert full_need > plan.kv_budget_bytes
    with pytest.raises(ConfigError, match=r"max_model_len \(32768\) is larger than the 26864 tokens"):
        plan_memory(model, gpu, hybrid_kv_cache_manager=False, **kw)
    lines = plan.lines(32768)
    assert lines[1].endswith("2 KV cache groups of 32.0 KiB pages: 1 x sliding window 128 (18 layers), "
                             "1 x full attention (18 layers))")
    assert lines[2].endswith("maximum concurrency for 32,768 tokens per request: 1.31x")


def test_hybrid_request_that_does_not_fit_is_one_line():
    kw = dict(tp=1, block_size=16, gpu_memory_utilization=0.8, max_num_batched_tokens=8192,
              max_num_seqs=256, max_model_len=131072)
    with pytest.raises(ConfigError) as e:
        plan_memory(get_model("gpt-oss-120b"), get_gpu("h100-sxm"), **kw)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("engine.max_model_len (131072) does not fit in the KV cache: one request of that "
                          "length holds 8713 blocks over its KV cache groups")
    assert 8713 == 131072 // 16 + (cdiv(127 + 8192, 16) + 1)  # full group + sliding group cap


# --- 4. layout details vLLM fixes ------------------------------------------------------------

def test_gemma3_groups_pad_the_sliding_layers():
    layout = kv_cache_layout(get_model("gemma-3-27b"), tp=2, block_size=BLOCK)
    assert [len(g.layers) for g in layout.groups] == [9, 9, 9, 9, 8, 8, 10]
    assert layout.groups[0].layers[:3] == (0, 7, 14)  # sliding bucket [0..4, 6..10, ...][0::6]
    assert layout.groups[-1].layers == tuple(range(5, 62, 6))
    assert layout.bytes_per_block == 10 * layout.groups[0].spec.page_size_bytes


def test_mla_kv_is_replicated_across_tp():
    """DeepSeek-V3 stores one 576-wide latent per token and layer on every TP rank."""
    for tp in (1, 2, 8):
        layout = kv_cache_layout(get_model("deepseek-v3"), tp=tp, block_size=BLOCK)
        assert layout.kv_bytes_per_token == 61 * 576 * 2 == 70272


def test_kv_heads_replicated_when_tp_exceeds_them():
    """Qwen3-235B-A22B has 4 KV heads: TP 8 keeps one per GPU (vLLM: max(1, 4 // 8))."""
    m = get_model("qwen3-235b-a22b")
    assert [kv_cache_layout(m, tp=tp, block_size=BLOCK).kv_bytes_per_token for tp in (1, 2, 4, 8)] == [
        2 * 94 * h * 128 * 2 for h in (4, 2, 1, 1)]


def test_unknown_kv_cache_dtype_is_one_line():
    with pytest.raises(ConfigError) as e:
        kv_cache_layout(get_model("qwen3-8b"), tp=1, block_size=16, kv_cache_dtype="fp4")
    assert str(e.value) == ("kv_cache_dtype 'fp4' is not supported (did you mean 'fp8'?); valid: auto, "
                            "bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2")


if __name__ == "__main__":  # regenerate the committed figures from vLLM
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        figures = {_key(*c): _vllm_figures(*c, Path(d)) for c in CASES}
    rows = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(figures.items())]
    EXPECTED_FILE.write_text("{\n" + ",\n".join(rows) + "\n}\n")
    print(f"wrote {EXPECTED_FILE} ({len(figures)} cases)")
