"""Model catalogue: the shapes the cost model and the memory math need.

A `ModelSpec` is the architecture only (no weights). Derived quantities:
- `num_params`: embeddings (+ untied LM head) + per layer (attention + MLP/experts);
  norms and biases are ignored (< 0.1 % of any catalogued model).
- `kv_bytes_per_token` = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes (vLLM's formula).

Catalogue figures come from each model's Hugging Face `config.json`; the parameter
counts they imply match the published totals listed in ../shared/REFERENCE.md
(checked in tests/test_models.py). `load_model(path)` reads any HF `config.json`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from simulator.errors import ConfigError, did_you_mean

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "float8": 1, "int8": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per expert for MoE models
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int = 2  # fp16/bf16 weights and KV cache, vLLM's default "auto" dtype
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs 2-matrix MLP (OPT, phi-2)
    num_experts: int = 1
    experts_per_token: int = 1
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size", "max_position_embeddings",
                      "dtype_bytes", "num_experts", "experts_per_token"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model {self.name!r}: {field} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple "
                              f"of num_kv_heads ({self.num_kv_heads})")
        if self.experts_per_token > self.num_experts:
            raise ConfigError(f"model {self.name!r}: experts_per_token ({self.experts_per_token}) "
                              f"> num_experts ({self.num_experts})")

    # --- per-layer shapes (unsharded) -------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        # QKV projection + output projection
        return self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size

    @property
    def mlp_params_per_expert(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_params(self) -> int:
        per_layer = self.attn_params_per_layer + self.num_experts * self.mlp_params_per_expert
        if self.is_moe:
            per_layer += self.hidden_size * self.num_experts  # router
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings

    @property
    def num_active_params(self) -> int:
        per_layer = self.attn_params_per_layer + self.experts_per_token * self.mlp_params_per_expert
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embeddings

    @property
    def weights_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes


def _spec(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, max_pos, **kw) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, ffn, vocab, max_pos, **kw)


# Source for every row: the model's Hugging Face config.json (fields num_hidden_layers,
# hidden_size, num_attention_heads, num_key_value_heads, intermediate_size / ffn_dim,
# vocab_size, max_position_embeddings, tie_word_embeddings), as summarised in
# ../shared/REFERENCE.md "Models".
CATALOGUE: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        _spec("facebook/opt-13b", 40, 5120, 40, 40, 128, 20480, 50272, 2048,
              gated_mlp=False, tie_word_embeddings=True),
        _spec("meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 128, 11008, 32000, 4096),
        _spec("meta-llama/Llama-2-13b-hf", 40, 5120, 40, 40, 128, 13824, 32000, 4096),
        _spec("meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 128, 28672, 32000, 4096),
        _spec("meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 131072),
        _spec("meta-llama/Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, 131072),
        _spec("mistralai/Mistral-7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768),
        _spec("mistralai/Mixtral-8x7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
              num_experts=8, experts_per_token=2),
        _spec("Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 131072),
        _spec("Qwen/Qwen2.5-72B", 80, 8192, 64, 8, 128, 29568, 152064, 131072),
        _spec("microsoft/phi-2", 32, 2560, 32, 32, 80, 10240, 51200, 2048, gated_mlp=False),
    )
}

# Short names a user is likely to type.
ALIASES = {
    "opt-13b": "facebook/opt-13b",
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-2-70b": "meta-llama/Llama-2-70b-hf",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B",
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B",
    "phi-2": "microsoft/phi-2",
}

# HF model_type values whose MLP is two matrices (fc1, fc2) rather than gated.
_NON_GATED = {"opt", "phi", "gpt2", "gpt_neox", "gptj", "falcon", "bloom", "starcoder2"}


def model_names() -> list[str]:
    return sorted(ALIASES) + sorted(CATALOGUE)


def get_model(name: str) -> ModelSpec:
    """A catalogue model by full or short name (case-insensitive), or a path to a config.json."""
    if name in CATALOGUE:
        return CATALOGUE[name]
    lowered = {k.lower(): v for k, v in CATALOGUE.items()}
    if name.lower() in lowered:
        return lowered[name.lower()]
    if name.lower() in ALIASES:
        return CATALOGUE[ALIASES[name.lower()]]
    path = Path(name)
    if path.suffix == ".json" or path.is_dir():
        return load_model(path)
    valid = model_names()
    raise ConfigError(f"unknown model {name!r}{did_you_mean(name.lower(), valid)}; valid: "
                      f"{', '.join(valid)}, or a path to a Hugging Face config.json")


def load_model(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (or a directory holding one) into a ModelSpec."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"model config {path}: file not found")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"model config {path}: not valid JSON ({e})") from None
    if "text_config" in cfg:  # multimodal wrappers keep the LM under text_config
        cfg = {**cfg, **cfg["text_config"]}

    def need(*keys: str) -> int:
        for k in keys:
            if k in cfg and cfg[k] is not None:
                return cfg[k]
        raise ConfigError(f"model config {path}: missing field {' or '.join(keys)!s}")

    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    model_type = str(cfg.get("model_type", "")).lower()
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return ModelSpec(
        name=cfg.get("_name_or_path") or path.parent.name or str(path),
        num_layers=need("num_hidden_layers", "n_layer", "num_layers"),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        intermediate_size=need("intermediate_size", "ffn_dim", "n_inner"),
        vocab_size=need("vocab_size"),
        max_position_embeddings=need("max_position_embeddings", "n_positions", "seq_length"),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        gated_mlp=model_type not in _NON_GATED,
        num_experts=cfg.get("num_local_experts") or cfg.get("num_experts") or 1,
        experts_per_token=cfg.get("num_experts_per_tok") or 1,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", model_type == "opt")),
    )


def with_dtype(model: ModelSpec, dtype_bytes: int) -> ModelSpec:
    return replace(model, dtype_bytes=dtype_bytes)
