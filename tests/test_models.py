"""Model catalogue: derived figures against the published ones in ../shared/REFERENCE.md."""

from __future__ import annotations

import json

import pytest

from simulator.errors import ConfigError
from simulator.hardware.models import get_model, load_model, model_names

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
    assert len(model_names()) == 22


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
