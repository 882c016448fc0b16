"""Model catalogue: derived figures against the published ones in ../shared/REFERENCE.md and
docs/models.md, and HF config.json loading (tests/hf_configs/)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simulator.errors import ConfigError
from simulator.hardware.models import (
    ALIASES,
    CHUNKED,
    FULL,
    SLIDING,
    SUPPORTED_MODEL_TYPES,
    ModelSpec,
    get_model,
    load_model,
    model_names,
)

CONFIGS = Path(__file__).parent / "hf_configs"

# (name, published params in billions, KV bytes/token in fp16) from REFERENCE.md "Models"
PUBLISHED = [
    ("facebook/opt-13b", 12.9, 800 * 1024),
    ("meta-llama/Llama-2-7b-hf", 6.74, 512 * 1024),
    ("meta-llama/Llama-2-13b-hf", 13.0, 800 * 1024),
    ("meta-llama/Llama-2-70b-hf", 69.0, 320 * 1024),
    ("meta-llama/Llama-3.1-8B", 8.03, 128 * 1024),
    ("meta-llama/Llama-3.1-70B", 70.6, 320 * 1024),
    ("mistralai/Mistral-7B-v0.1", 7.24, 128 * 1024),
    ("mistralai/Mixtral-8x7B-v0.1", 46.7, 128 * 1024),
    ("Qwen/Qwen2.5-7B", 7.62, 56 * 1024),
    ("Qwen/Qwen2.5-72B", 72.7, 320 * 1024),
    ("microsoft/phi-2", 2.7, 320 * 1024),
]


@pytest.mark.parametrize("name,params_b,kv_bytes", PUBLISHED)
def test_catalogue_matches_published(name, params_b, kv_bytes):
    m = get_model(name)
    assert m.kv_bytes_per_token == kv_bytes
    # norms and biases are ignored; published totals are rounded: 3 % covers both
    assert m.num_params / 1e9 == pytest.approx(params_b, rel=0.03)


def test_mixtral_active_params():
    assert get_model("mixtral-8x7b").num_active_params / 1e9 == pytest.approx(12.9, rel=0.03)


def test_short_names_and_case():
    assert get_model("llama-3.1-8b") is get_model("META-LLAMA/llama-3.1-8b")


def test_unknown_model_lists_valid_names():
    with pytest.raises(ConfigError) as e:
        get_model("llama-3.1-9b")
    assert "did you mean 'llama-3.1-8b'" in str(e.value)
    assert "phi-2" in str(e.value)
    assert len(model_names()) == 44


def test_load_hf_config(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
           "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(tmp_path)
    ref = get_model("llama-3.1-8b")
    assert (m.num_params, m.kv_bytes_per_token) == (ref.num_params, ref.kv_bytes_per_token)


def test_load_hf_config_missing_field(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ConfigError, match=r"config.json: missing field num_attention_heads or n_head"):
        load_model(tmp_path)


# --- models of 2025-26 (issue 15) -------------------------------------------------------------
# (alias, published total params in billions, published active, KV bytes/token in bf16, all layers)
# Published totals (model cards / technical reports): DeepSeek-V3 671B / 37B active (without
# the 14B MTP module); Qwen3 8.2B, 32.8B, 30.5B / 3.3B, 235B / 22B; Llama-3.3-70B 70.6B (the
# Llama-3.1-70B shape); gpt-oss 20.91B / 3.61B and 116.83B / 5.13B (OpenAI, active without the
# input embedding); Gemma-3-27B 27B, Mistral-Small-3.1 24B, Llama-4-Scout 109B / 17B: these
# include a vision encoder kvsim does not count (0.4, 0.4, 0.9B), hence 3 %.
PUBLISHED_2025 = [
    ("deepseek-v3", 671, 37, 61 * 576 * 2),
    ("qwen3-8b", 8.2, None, 144 * 1024),
    ("qwen3-32b", 32.8, None, 256 * 1024),
    ("qwen3-30b-a3b", 30.5, 3.3, 96 * 1024),
    ("qwen3-235b-a22b", 235, 22, 188 * 1024),
    ("llama-3.3-70b", 70.6, None, 320 * 1024),
    ("gpt-oss-20b", 20.91, 3.61, 48 * 1024),
    ("gpt-oss-120b", 116.83, 5.13, 72 * 1024),
    ("gemma-3-27b", 27.0, None, 496 * 1024),
    ("mistral-small-3.1-24b", 24.0, None, 160 * 1024),
    ("llama-4-scout", 109, 17, 192 * 1024),
]


@pytest.mark.parametrize("name,params_b,active_b,kv_bytes", PUBLISHED_2025)
def test_2025_catalogue_matches_published(name, params_b, active_b, kv_bytes):
    m = get_model(name)
    assert m.kv_bytes_per_token == kv_bytes
    assert m.num_params / 1e9 == pytest.approx(params_b, rel=0.03)
    if active_b is not None:
        active = m.num_active_params
        if name.startswith("gpt-oss"):  # OpenAI counts the unembedding, not the embedding
            active -= m.vocab_size * m.hidden_size
        assert active / 1e9 == pytest.approx(active_b, rel=0.03)


@pytest.mark.parametrize("name", [n for n, *_ in PUBLISHED_2025])
def test_catalogue_row_is_its_config_json(name):
    """Each new row is exactly what load_model reads from the shipped config.json."""
    m = get_model(name)
    assert replace(load_model(CONFIGS / name), name=m.name) == m


def test_kimi_k2_reads_as_deepseek_v3():
    """Kimi-K2's model_type kimi_k2 is DeepSeek-V3's architecture (vLLM: DeepseekV3Config):
    1.04T total / 32B active published; 384 experts, 64 heads, one dense layer."""
    m = load_model(CONFIGS / "kimi-k2")
    assert (m.is_mla, m.num_experts, m.num_heads, m.dense_layers) == (True, 384, 64, (0,))
    assert m.quantization == "fp8"
    assert m.num_params / 1e12 == pytest.approx(1.04, rel=0.03)
    assert m.num_active_params / 1e9 == pytest.approx(32.6, rel=0.03)
    assert m.kv_bytes_per_token == get_model("deepseek-v3").kv_bytes_per_token


def test_layer_kinds_from_config_json():
    assert get_model("gpt-oss-20b").attention_types[:4] == (SLIDING, FULL, SLIDING, FULL)
    gemma = get_model("gemma-3-27b").attention_types
    assert (gemma.count(SLIDING), gemma.count(FULL), gemma[5], gemma[11]) == (52, 10, FULL, FULL)
    scout = get_model("llama-4-scout").attention_types
    assert (scout.count(CHUNKED), scout[3], scout[47]) == (36, FULL, FULL)
    assert set(get_model("deepseek-v3").attention_types) == {FULL}
    # Mistral-7B-v0.1's config.json slides every layer (sliding_window 4096, no layer_types);
    # the catalogue row keeps full attention (see models.py)
    mistral = load_model(CONFIGS / "mistral-7b-v0.1")
    assert (mistral.sliding_window, set(mistral.attention_types)) == (4096, {SLIDING})
    assert not mistral.is_hybrid and get_model("mistral-7b").sliding_window is None
    assert load_model(CONFIGS / "qwen2.5-7b").sliding_window is None  # use_sliding_window false


def test_moe_layers_and_shared_experts():
    ds = get_model("deepseek-v3")
    assert (ds.num_moe_layers, ds.num_shared_experts, ds.expert_intermediate_size) == (58, 1, 2048)
    assert get_model("qwen3-235b-a22b").num_moe_layers == 94
    assert get_model("llama-4-scout").num_moe_layers == 48
    assert get_model("mixtral-8x7b").num_moe_layers == 32


def test_checkpoint_weight_formats():
    """Weight bytes of the published checkpoints: gpt-oss mxfp4 experts (~13 GB / ~65 GB on the
    Hub), DeepSeek-V3 fp8 linear layers with bf16 embeddings (~0.67 TB)."""
    assert get_model("gpt-oss-20b").weights_bytes / 1e9 == pytest.approx(13.7, abs=0.3)
    assert get_model("gpt-oss-120b").weights_bytes / 1e9 == pytest.approx(65.2, abs=0.5)
    assert get_model("deepseek-v3").weights_bytes / 1e9 == pytest.approx(673, abs=2)
    assert get_model("qwen3-8b").weights_bytes == get_model("qwen3-8b").num_params * 2


@pytest.mark.parametrize("base,edit,message", [
    ("gpt-oss-20b", {"model_type": "falcon"},
     r"model_type 'falcon' is not supported; supported: deepseek_v3, gemma3, "),
    ("qwen3-30b-a3b", {"model_type": "qwen3_mo"},
     r"model_type 'qwen3_mo' is not supported \(did you mean 'qwen3_moe'\?\)"),
    ("gpt-oss-20b", {"quantization_config": {"quant_method": "bitsandbytes"}},
     r"quantization_config.quant_method: quantization 'bitsandbytes' is not supported; valid: bf16, fp8, "
     r"w4a16, mxfp4, nvfp4"),
    ("gpt-oss-20b", {"num_hidden_layers": None}, r"missing field num_hidden_layers or n_layer or num_layers"),
    ("mistral-7b-v0.1", {"layer_types": ["sliding_attention", "full_attention"]},
     r"layer_types has 2 entries for 32 layers"),
    ("gpt-oss-20b", {"sliding_window": 0},
     r"sliding_window must be a positive integer for sliding_attention layers, got 0"),
    ("gpt-oss-20b", {"sliding_window": 262144},
     r"sliding_window \(262144\) is larger than max_position_embeddings \(131072\)"),
])
def test_bad_config_json_is_one_line(tmp_path, base, edit, message):
    cfg = json.loads((CONFIGS / base / "config.json").read_text())
    cfg.update(edit)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=message) as e:
        load_model(tmp_path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"model config {tmp_path / 'config.json'}: ")


def test_unsupported_model_type_lists_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(ConfigError) as e:
        load_model(tmp_path)
    assert str(e.value).endswith("supported: " + ", ".join(SUPPORTED_MODEL_TYPES))
    assert {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v3", "kimi_k2", "gpt_oss",
            "gemma3", "llama4"} <= set(SUPPORTED_MODEL_TYPES)


def test_wrapper_text_config_must_match(tmp_path):
    cfg = json.loads((CONFIGS / "gemma-3-27b" / "config.json").read_text())
    cfg["text_config"]["model_type"] = "llama"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"a gemma3 text_config must have model_type 'gemma3_text', "
                                          r"got 'llama'"):
        load_model(tmp_path)


def test_qwen_sliding_window_on_some_layers_is_refused(tmp_path):
    """vLLM's qwen2.py asserts max_window_layers == num_hidden_layers when layers differ."""
    cfg = json.loads((CONFIGS / "qwen3-8b" / "config.json").read_text())
    cfg.update(use_sliding_window=True, sliding_window=4096, max_window_layers=28)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=r"does not support a sliding window on only some layers"):
        load_model(tmp_path)
    cfg["max_window_layers"] = 0  # every layer slides: supported
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert set(load_model(tmp_path).attention_types) == {SLIDING}


def test_model_spec_rejects_inconsistent_layers():
    with pytest.raises(ConfigError, match=r"layer_types 'local' is not supported; valid: full_attention"):
        ModelSpec("x", 2, 64, 4, 4, 16, 128, 100, 1024, layer_types=("local", FULL), sliding_window=8)
    with pytest.raises(ConfigError, match=r"MLA \(kv_lora_rank 64\) needs qk_rope_head_dim"):
        ModelSpec("x", 2, 64, 4, 4, 16, 128, 100, 1024, kv_lora_rank=64)
    with pytest.raises(ConfigError, match=r"dense_layers must be layer indices in 0..1, got \[2\]"):
        ModelSpec("x", 2, 64, 4, 4, 16, 128, 100, 1024, num_experts=4, dense_layers=(2,))


def test_every_alias_resolves():
    for alias, full in ALIASES.items():
        assert get_model(alias).name == full
