"""Model catalogue: the shapes the cost model and the memory math need.

A `ModelSpec` is the architecture only (no weights). Besides the dense shape it says, as
vLLM 0.33 builds the model:
- the attention kind of every layer (`attention_types`): full, sliding window (Gemma 3,
  gpt-oss alternate them with full layers) or chunked local (Llama 4); MLA (DeepSeek-V3,
  Kimi-K2) when `kv_lora_rank` > 0: one latent of kv_lora_rank + qk_rope_head_dim per token
  and layer replaces the per-head K and V;
- MoE: routed experts (`num_experts`, `experts_per_token`, `moe_intermediate_size`), shared
  experts, and the layers whose MLP stays dense (`dense_layers`, DeepSeek's
  first_k_dense_replace);
- the checkpoint's weight format (`quantization`, dtypes.py), e.g. fp8 for DeepSeek-V3,
  mxfp4 experts for gpt-oss.

Derived quantities:
- `num_params`: embeddings (+ untied LM head) + per layer (attention + MLP or experts +
  shared experts + router); norms and biases are ignored (< 0.1 % of any catalogued model).
- `kv_bytes_per_token` = 2 (K and V) * layers * kv_heads * head_dim * dtype_bytes (vLLM's
  formula; MLA: layers * (kv_lora_rank + qk_rope_head_dim) * dtype_bytes), every layer
  counted: a sliding-window layer keeps its tokens only inside the window (kv_spec.py).

Catalogue figures come from each model's Hugging Face `config.json`; the parameter counts
they imply match the published totals listed in ../shared/REFERENCE.md and docs/models.md
(checked in tests/test_models.py). `load_model(path)` reads a HF `config.json` of a
supported model_type (`SUPPORTED_MODEL_TYPES`) the way transformers and vLLM read it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError, did_you_mean
from simulator.hardware.dtypes import WeightFormat, weight_format

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "float8": 1, "int8": 1}

# Attention kinds per layer, named as HF config.json `layer_types` names them.
FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"
LAYER_TYPES = (FULL, SLIDING, CHUNKED)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int  # query/key head size (MLA: qk_nope_head_dim + qk_rope_head_dim)
    intermediate_size: int  # dense MLP; per expert for MoE models without moe_intermediate_size
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int = 2  # fp16/bf16 weights and KV cache, vLLM's default "auto" dtype
    gated_mlp: bool = True  # SwiGLU (gate, up, down) vs 2-matrix MLP (OPT, phi-2)
    num_experts: int = 1
    experts_per_token: int = 1
    tie_word_embeddings: bool = False
    # --- attention kinds ---------------------------------------------------------------
    layer_types: tuple[str, ...] = ()  # per layer (LAYER_TYPES); () = every layer the same
    sliding_window: int | None = None  # with layer_types (): every layer slides (Mistral-7B-v0.1)
    attention_chunk_size: int | None = None  # chunked local attention (Llama 4)
    kv_lora_rank: int = 0  # > 0: MLA (DeepSeek-V2/V3, Kimi-K2)
    q_lora_rank: int = 0  # MLA query low-rank; 0: a plain q_proj
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0  # MLA value head size
    # --- MoE -----------------------------------------------------------------------------
    moe_intermediate_size: int = 0  # per routed expert; 0: intermediate_size (Mixtral's config)
    num_shared_experts: int = 0  # always-on experts of moe_intermediate_size (DeepSeek, Llama 4)
    dense_layers: tuple[int, ...] = ()  # MoE models: layers with a dense MLP (first_k_dense_replace)
    # --- weights -------------------------------------------------------------------------
    quantization: str | None = None  # the checkpoint's weight format (dtypes.WEIGHT_FORMATS)

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
        self._check_layers()

    def _check_layers(self) -> None:
        name = self.name
        if self.layer_types:
            if len(self.layer_types) != self.num_layers:
                raise ConfigError(f"model {name!r}: layer_types has {len(self.layer_types)} entries for "
                                  f"{self.num_layers} layers")
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad:
                raise ConfigError(f"model {name!r}: layer_types {bad[0]!r} is not supported; valid: "
                                  f"{', '.join(LAYER_TYPES)}")
        kinds = set(self.attention_types)
        for kind, field in ((SLIDING, "sliding_window"), (CHUNKED, "attention_chunk_size")):
            value = getattr(self, field)
            if kind in kinds and not (isinstance(value, int) and value > 0):
                raise ConfigError(f"model {name!r}: {field} must be a positive integer for "
                                  f"{kind} layers, got {value!r}")
        if self.sliding_window is not None and self.sliding_window > self.max_position_embeddings:
            raise ConfigError(f"model {name!r}: sliding_window ({self.sliding_window}) is larger than "
                              f"max_position_embeddings ({self.max_position_embeddings})")
        if self.is_mla and (self.qk_rope_head_dim <= 0 or self.v_head_dim <= 0 or kinds != {FULL}):
            raise ConfigError(f"model {name!r}: MLA (kv_lora_rank {self.kv_lora_rank}) needs "
                              f"qk_rope_head_dim and v_head_dim > 0 and full attention in every layer")
        if any(not 0 <= i < self.num_layers for i in self.dense_layers):
            raise ConfigError(f"model {name!r}: dense_layers must be layer indices in "
                              f"0..{self.num_layers - 1}, got {list(self.dense_layers)}")

    # --- attention kinds -----------------------------------------------------------------
    @property
    def attention_types(self) -> tuple[str, ...]:
        """Kind of every layer. Without layer_types every layer is the same: sliding when the
        model has a window (vLLM sets CacheConfig.sliding_window then; engine/arg_utils.py)."""
        if self.layer_types:
            return self.layer_types
        return (SLIDING if self.sliding_window else FULL,) * self.num_layers

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_hybrid(self) -> bool:
        """Layers of more than one attention kind (vLLM's hybrid KV cache manager groups them)."""
        return len(set(self.attention_types)) > 1

    # --- per-layer shapes (unsharded) -------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:  # q_a/q_b (or q_proj), kv_a_proj_with_mqa, kv_b_proj, o_proj
            q_out = self.num_heads * self.head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * q_out if self.q_lora_rank else h * q_out
            nope = self.head_dim - self.qk_rope_head_dim
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim)
                  + self.kv_lora_rank * self.num_heads * (nope + self.v_head_dim))
            return q + kv + self.num_heads * self.v_head_dim * h
        # QKV projection + output projection
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h

    @property
    def expert_intermediate_size(self) -> int:
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def mlp_params_per_expert(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.expert_intermediate_size

    @property
    def dense_mlp_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - len(self.dense_layers) if self.is_moe else 0

    @property
    def moe_layer_params(self) -> int:
        """Routed experts + shared experts + router of one MoE layer."""
        return ((self.num_experts + self.num_shared_experts) * self.mlp_params_per_expert
                + self.hidden_size * self.num_experts)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        dense = self.num_layers - self.num_moe_layers
        return (self.num_layers * self.attn_params_per_layer + dense * self.dense_mlp_params
                + self.num_moe_layers * self.moe_layer_params + self.embedding_params)

    @property
    def num_active_params(self) -> int:
        """Parameters one token passes through (top-k and shared experts; no router)."""
        dense = self.num_layers - self.num_moe_layers
        active_moe = (self.experts_per_token + self.num_shared_experts) * self.mlp_params_per_expert
        return (self.num_layers * self.attn_params_per_layer + dense * self.dense_mlp_params
                + self.num_moe_layers * active_moe + self.embedding_params)

    # --- bytes -----------------------------------------------------------------------------
    def weight_format(self, quantization: str | None = None) -> WeightFormat:
        """`quantization` (vLLM's --quantization), else the checkpoint's, else 16-bit."""
        return weight_format(quantization or self.quantization or "bf16")

    def weight_bytes_split(self, quantization: str | None = None) -> tuple[Fraction, Fraction]:
        """(bytes of everything but the routed experts, bytes of one routed expert summed over
        the MoE layers); total = first + num_experts * second. Embeddings, LM head, router and
        norms keep the model dtype (dtypes.py)."""
        fmt, d = self.weight_format(quantization), self.dtype_bytes
        dense = self.num_layers - self.num_moe_layers
        linear = (self.num_layers * self.attn_params_per_layer + dense * self.dense_mlp_params
                  + self.num_moe_layers * self.num_shared_experts * self.mlp_params_per_expert)
        other = fmt.bytes_for(linear, d, expert=False) + Fraction(
            (self.embedding_params + self.num_moe_layers * self.hidden_size * self.num_experts) * d)
        if not self.is_moe:
            return other, Fraction(0)
        return other, fmt.bytes_for(self.num_moe_layers * self.mlp_params_per_expert, d, expert=True)

    def weights_bytes_with(self, quantization: str | None = None) -> int:
        other, expert = self.weight_bytes_split(quantization)
        return math.ceil(other + (self.num_experts * expert if self.is_moe else 0))

    @property
    def weights_bytes(self) -> int:
        """Bytes of the checkpoint's weights (num_params * dtype_bytes when unquantized)."""
        if self.quantization is None:
            return self.num_params * self.dtype_bytes
        return self.weights_bytes_with()

    @property
    def kv_bytes_per_token(self) -> int:
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
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
        # NOTE: its config.json has sliding_window 4096 (vLLM slides every layer; load_model
        # does too); the row keeps full attention so that existing results stay as they were.
        _spec("mistralai/Mistral-7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768),
        _spec("mistralai/Mixtral-8x7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
              num_experts=8, experts_per_token=2),
        _spec("Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 131072),
        _spec("Qwen/Qwen2.5-72B", 80, 8192, 64, 8, 128, 29568, 152064, 131072),
        _spec("microsoft/phi-2", 32, 2560, 32, 32, 80, 10240, 51200, 2048, gated_mlp=False),
        # --- 2025-26 (issue 15). Each row is what load_model reads from the config.json in
        # tests/hf_configs/<alias>/ (tests/test_models.py checks they are equal); docs/models.md
        # lists the fields and where each number comes from.
        # meta-llama/Llama-3.3-70B-Instruct: the Llama-3.1-70B shape (llama).
        _spec("meta-llama/Llama-3.3-70B-Instruct", 80, 8192, 64, 8, 128, 28672, 128256, 131072),
        # Qwen/Qwen3-8B, -32B (qwen3): head_dim 128, sliding_window null, use_sliding_window false.
        _spec("Qwen/Qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 40960),
        _spec("Qwen/Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, 40960),
        # Qwen/Qwen3-30B-A3B, -235B-A22B (qwen3_moe): num_experts 128, num_experts_per_tok 8,
        # moe_intermediate_size, decoder_sparse_step 1, mlp_only_layers [] (every layer MoE).
        _spec("Qwen/Qwen3-30B-A3B", 48, 2048, 32, 4, 128, 6144, 151936, 40960,
              num_experts=128, experts_per_token=8, moe_intermediate_size=768),
        _spec("Qwen/Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 12288, 151936, 40960,
              num_experts=128, experts_per_token=8, moe_intermediate_size=1536),
        # deepseek-ai/DeepSeek-V3 (deepseek_v3; also V3-0324, R1): MLA kv_lora_rank 512,
        # q_lora_rank 1536, qk_nope_head_dim 128 + qk_rope_head_dim 64 (head_dim 192),
        # v_head_dim 128; n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1,
        # moe_intermediate_size 2048, first_k_dense_replace 3 (intermediate_size 18432);
        # quantization_config fp8 (128x128 blocks). num_nextn_predict_layers 1 (the MTP layer)
        # is not loaded by vLLM without speculative decoding, so not counted.
        _spec("deepseek-ai/DeepSeek-V3", 61, 7168, 128, 128, 192, 18432, 129280, 163840,
              num_experts=256, experts_per_token=8, moe_intermediate_size=2048, num_shared_experts=1,
              dense_layers=(0, 1, 2), kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
              v_head_dim=128, quantization="fp8"),
        # openai/gpt-oss-20b, -120b (gpt_oss): head_dim 64, num_local_experts 32 / 128,
        # num_experts_per_tok 4, intermediate_size 2880 per expert, sliding_window 128 on the
        # even layers (vLLM gpt_oss.py: layer_idx % 2 == 0; layer_types agrees), mxfp4 experts.
        _spec("openai/gpt-oss-20b", 24, 2880, 64, 8, 64, 2880, 201088, 131072,
              num_experts=32, experts_per_token=4, layer_types=(SLIDING, FULL) * 12,
              sliding_window=128, quantization="mxfp4"),
        _spec("openai/gpt-oss-120b", 36, 2880, 64, 8, 64, 2880, 201088, 131072,
              num_experts=128, experts_per_token=4, layer_types=(SLIDING, FULL) * 18,
              sliding_window=128, quantization="mxfp4"),
        # google/gemma-3-27b-it (gemma3, text_config gemma3_text): head_dim 128, sliding_window
        # 1024, 5 sliding : 1 full (sliding_window_pattern 6, transformers' default); vocab
        # 262208, max_position_embeddings 131072 and tied embeddings are Gemma3TextConfig
        # defaults. GeGLU MLP (gated). The SigLIP vision tower (~0.4B) is not counted.
        _spec("google/gemma-3-27b-it", 62, 5376, 32, 16, 128, 21504, 262208, 131072,
              tie_word_embeddings=True, sliding_window=1024,
              layer_types=tuple(FULL if (i + 1) % 6 == 0 else SLIDING for i in range(62))),
        # mistralai/Mistral-Small-3.1-24B-Instruct-2503 (mistral3, text_config mistral):
        # head_dim 128, sliding_window null. The Pixtral vision encoder (~0.4B) is not counted.
        _spec("mistralai/Mistral-Small-3.1-24B-Instruct-2503", 40, 5120, 32, 8, 128, 32768, 131072,
              131072),
        # meta-llama/Llama-4-Scout-17B-16E-Instruct (llama4, text_config llama4_text):
        # num_local_experts 16, num_experts_per_tok 1, intermediate_size 8192 per expert and
        # for the shared expert, intermediate_size_mlp 16384 (dense layers: none, every layer
        # MoE with interleave_moe_layer_step 1); attention_chunk_size 8192 on the RoPE layers,
        # every 4th layer NoPE full attention (no_rope_layers); max_position_embeddings
        # 10485760. The vision encoder (~0.9B) is not counted.
        _spec("meta-llama/Llama-4-Scout-17B-16E-Instruct", 48, 5120, 40, 8, 128, 16384, 202048,
              10485760, num_experts=16, experts_per_token=1, moe_intermediate_size=8192,
              num_shared_experts=1, attention_chunk_size=8192,
              layer_types=tuple(FULL if (i + 1) % 4 == 0 else CHUNKED for i in range(48))),
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
    "llama-3.3-70b": "meta-llama/Llama-3.3-70B-Instruct",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "qwen3-32b": "Qwen/Qwen3-32B",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
    "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-20b": "openai/gpt-oss-20b",
    "gpt-oss-120b": "openai/gpt-oss-120b",
    "gemma-3-27b": "google/gemma-3-27b-it",
    "mistral-small-3.1-24b": "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
    "llama-4-scout": "meta-llama/Llama-4-Scout-17B-16E-Instruct",
}


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


# --- Hugging Face config.json --------------------------------------------------------------
#
# Fields a published config.json may leave out take the default of its transformers config
# class (transformers 5.20, models/<type>/configuration_<type>.py), as vLLM sees them; the
# core shape (hidden_size, num_hidden_layers, num_attention_heads, intermediate_size) must
# be present. Multimodal wrappers (gemma3, llama4, mistral3) keep the language model under
# text_config, which is what vLLM serves (ModelConfig.hf_text_config).
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "vocab_size": 32000},
    "mistral": {"max_position_embeddings": 131072, "vocab_size": 32000, "sliding_window": 4096,
                "num_key_value_heads": 8},
    "mixtral": {"max_position_embeddings": 131072, "vocab_size": 32000, "num_key_value_heads": 8,
                "num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2": {"max_position_embeddings": 32768, "vocab_size": 151936, "sliding_window": 4096,
              "max_window_layers": 28},
    "qwen3": {"max_position_embeddings": 32768, "vocab_size": 151936, "sliding_window": 4096,
              "max_window_layers": 28, "head_dim": 128},
    "qwen3_moe": {"max_position_embeddings": 32768, "vocab_size": 151936, "sliding_window": 4096,
                  "max_window_layers": 28, "num_experts": 128, "num_experts_per_tok": 8,
                  "moe_intermediate_size": 768, "decoder_sparse_step": 1, "num_key_value_heads": 4},
    "deepseek_v3": {"max_position_embeddings": 4096, "vocab_size": 129280, "kv_lora_rank": 512,
                    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                    "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
                    "moe_layer_freq": 1},
    "gpt_oss": {"max_position_embeddings": 131072, "vocab_size": 201088, "head_dim": 64,
                "sliding_window": 128, "num_local_experts": 128, "num_experts_per_tok": 4,
                "num_key_value_heads": 8},
    "gemma3_text": {"max_position_embeddings": 131072, "vocab_size": 262208, "head_dim": 256,
                    "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": True,
                    "num_key_value_heads": 4},
    "llama4_text": {"max_position_embeddings": 131072, "vocab_size": 202048, "head_dim": 128,
                    "num_local_experts": 16, "num_experts_per_tok": 1, "intermediate_size_mlp": 16384,
                    "attention_chunk_size": 8192, "interleave_moe_layer_step": 1,
                    "no_rope_layer_interval": 4, "num_key_value_heads": 8},
    "opt": {"tie_word_embeddings": True},
    "phi": {},
}
_DEFAULTS["kimi_k2"] = _DEFAULTS["deepseek_v3"]  # vLLM reads Kimi-K2 as DeepseekV3Config
# wrapper model_type -> the model_type its text_config must have
_WRAPPERS = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral"}
SUPPORTED_MODEL_TYPES = tuple(sorted([*_DEFAULTS, *_WRAPPERS]))

# HF model_type values whose MLP is two matrices (fc1, fc2) rather than gated.
_NON_GATED = {"opt", "phi", "gpt2", "gpt_neox", "gptj", "falcon", "bloom", "starcoder2"}


class _Fields:
    """Field access for one config.json: the value (an explicit null stays None, as in
    transformers), else the model type's default."""

    def __init__(self, cfg: dict[str, Any], model_type: str, path: Path):
        self.cfg, self.defaults, self.path = cfg, _DEFAULTS.get(model_type, {}), path

    def get(self, key: str, default: Any = None) -> Any:
        return self.cfg[key] if key in self.cfg else self.defaults.get(key, default)

    def need(self, *keys: str) -> Any:
        for k in keys:
            value = self.get(k)
            if value is not None:
                return value
        raise ConfigError(f"model config {self.path}: missing field {' or '.join(keys)!s}")

    def positive(self, *keys: str) -> int:
        """need(*keys), an integer >= 1 (a shape the others are divided by)."""
        value = self.need(*keys)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model config {self.path}: {keys[0]} must be an integer >= 1, got {value!r}")
        return value

    def int_list(self, key: str) -> list[int]:
        value = self.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
            raise ConfigError(f"model config {self.path}: {key} must be a list of integers, got {value!r}")
        return value


def _layer_types(f: _Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    """Attention kind per layer, as vLLM builds the layers. Steps:
    1. gpt_oss: sliding on even layers (gpt_oss.py); gemma3: layer_types, else 5 sliding : 1
       full from sliding_window_pattern (Gemma3TextConfig); llama4: chunked local on RoPE
       layers, full on the NoPE ones (no_rope_layers[i] == 0; llama4.py);
    2. qwen2/qwen3: a window only with use_sliding_window, from layer max_window_layers on;
    3. otherwise layer_types if given, else the model-level sliding_window on every layer
       (vLLM's CacheConfig.sliding_window; engine/arg_utils.py)."""
    window = f.get("sliding_window")
    types = f.get("layer_types")
    if model_type == "gpt_oss":
        types = [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]
    elif model_type == "gemma3_text" and not types:
        pattern = f.get("sliding_window_pattern")
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    elif model_type == "llama4_text":
        chunk = f.get("attention_chunk_size")
        rope = f.int_list("no_rope_layers") or [
            int((i + 1) % f.get("no_rope_layer_interval") != 0) for i in range(num_layers)]
        types = types or [CHUNKED if r and chunk else FULL for r in rope[:num_layers]]
        return {"layer_types": tuple(types), "attention_chunk_size": chunk} if CHUNKED in types else {}
    elif model_type in ("qwen2", "qwen3", "qwen3_moe"):
        window = window if f.get("use_sliding_window", False) else None
        first = f.get("max_window_layers")
        types = types or ([SLIDING if window and i >= first else FULL for i in range(num_layers)])
        if len(set(types)) > 1:  # vLLM qwen2.py asserts max_window_layers == num_hidden_layers
            raise ConfigError(f"model config {f.path}: vLLM does not support a sliding window on only "
                              f"some layers of a {model_type} model (max_window_layers {first} < "
                              f"num_hidden_layers {num_layers})")
    if not isinstance(types, list) and types is not None:
        raise ConfigError(f"model config {f.path}: layer_types must be a list, got {types!r}")
    if not types or all(t == SLIDING for t in types):
        return {"sliding_window": window} if window else {}
    if all(t == FULL for t in types):
        return {}
    return {"layer_types": tuple(types), "sliding_window": window}


def _moe(f: _Fields, model_type: str, num_layers: int) -> dict[str, Any]:
    """Routed / shared experts and the dense layers of a MoE model, by vLLM's layer rules."""
    if model_type in ("deepseek_v3", "kimi_k2"):
        first, freq = f.get("first_k_dense_replace") or 0, f.get("moe_layer_freq")
        dense = [i for i in range(num_layers) if not (i >= first and i % freq == 0)]
        return {"num_experts": f.need("n_routed_experts"), "experts_per_token": f.need("num_experts_per_tok"),
                "moe_intermediate_size": f.need("moe_intermediate_size"),
                "num_shared_experts": f.get("n_shared_experts") or 0, "dense_layers": tuple(dense)}
    if model_type == "qwen3_moe":
        step, only = f.get("decoder_sparse_step"), set(f.int_list("mlp_only_layers"))
        dense = [i for i in range(num_layers) if i in only or (i + 1) % step]
        return {"num_experts": f.need("num_experts"), "experts_per_token": f.need("num_experts_per_tok"),
                "moe_intermediate_size": f.need("moe_intermediate_size"), "dense_layers": tuple(dense)}
    if model_type == "llama4_text":
        step = f.get("interleave_moe_layer_step")
        moe = set(f.int_list("moe_layers") or range(step - 1, num_layers, step))
        return {"num_experts": f.need("num_local_experts"),
                "experts_per_token": f.need("num_experts_per_tok"),
                "moe_intermediate_size": f.need("intermediate_size"), "num_shared_experts": 1,
                "intermediate_size": f.need("intermediate_size_mlp"),
                "dense_layers": tuple(i for i in range(num_layers) if i not in moe)}
    experts = f.get("num_local_experts") or f.get("num_experts") or 1
    return {"num_experts": experts,
            "experts_per_token": f.get("num_experts_per_tok") or f.get("experts_per_token") or 1}


def _mla(f: _Fields) -> dict[str, Any]:
    nope, rope = f.need("qk_nope_head_dim"), f.need("qk_rope_head_dim")
    return {"kv_lora_rank": f.need("kv_lora_rank"), "q_lora_rank": f.get("q_lora_rank") or 0,
            "qk_rope_head_dim": rope, "v_head_dim": f.need("v_head_dim"), "head_dim": nope + rope,
            "num_kv_heads": f.need("num_attention_heads")}  # one latent, shared by every head


def _quantization(cfg: dict[str, Any], path: Path) -> str | None:
    """The checkpoint's weight format from quantization_config (None: unquantized)."""
    q = cfg.get("quantization_config")
    if not q:
        return None
    method = str(q.get("quant_method", "")).lower()
    if method == "modelopt":  # ModelOpt names the format in quant_algo (FP8 / NVFP4)
        method = {"nvfp4": "nvfp4", "fp8": "fp8"}.get(str(q.get("quant_algo", "")).lower(), method)
    if method in ("gptq", "awq") and q.get("bits", 4) != 4:
        raise ConfigError(f"model config {path}: quantization_config {method} with bits "
                          f"{q.get('bits')} is not supported; valid: 4-bit (w4a16)")
    try:
        return weight_format(method).name
    except ConfigError as e:
        raise ConfigError(f"model config {path}: quantization_config.quant_method: {e}") from None


def load_model(path: str | Path) -> ModelSpec:
    """Read a Hugging Face config.json (or a directory holding one) into a ModelSpec. Steps:
    1. read the JSON; a multimodal wrapper's text_config is the language model;
    2. refuse a model_type vLLM would build differently from what kvsim models (one line
       listing SUPPORTED_MODEL_TYPES); no model_type: read the plain dense fields;
    3. dense shape, attention kinds (_layer_types), MoE (_moe), MLA (_mla), weight format."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"model config {path}: file not found")
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"model config {path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model config {path}: expected a JSON object, got {type(cfg).__name__}")
    model_type = str(cfg.get("model_type", "")).lower()
    if model_type and model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"model config {path}: model_type {model_type!r} is not supported"
                          f"{did_you_mean(model_type, SUPPORTED_MODEL_TYPES)}; supported: "
                          f"{', '.join(SUPPORTED_MODEL_TYPES)}")
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers keep the LM under text_config
        cfg = {**cfg, **cfg["text_config"]}
        inner = str(cfg.get("model_type", "")).lower()
        if model_type in _WRAPPERS and inner != _WRAPPERS[model_type]:
            raise ConfigError(f"model config {path}: a {model_type} text_config must have model_type "
                              f"{_WRAPPERS[model_type]!r}, got {inner!r}")
        model_type = inner
    f = _Fields(cfg, model_type, path)
    hidden = f.positive("hidden_size", "n_embd", "d_model")
    heads = f.positive("num_attention_heads", "n_head")
    layers = f.positive("num_hidden_layers", "n_layer", "num_layers")
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    fields: dict[str, Any] = dict(
        name=cfg.get("_name_or_path") or path.parent.name or str(path),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=f.get("num_key_value_heads") or heads,
        head_dim=f.get("head_dim") or hidden // heads,
        intermediate_size=f.need("intermediate_size", "ffn_dim", "n_inner"),
        vocab_size=f.need("vocab_size"),
        max_position_embeddings=f.need("max_position_embeddings", "n_positions", "seq_length"),
        dtype_bytes=DTYPE_BYTES.get(dtype, 2),
        gated_mlp=model_type not in _NON_GATED,
        tie_word_embeddings=bool(f.get("tie_word_embeddings", False)),
        quantization=_quantization(cfg, path),
    )
    if isinstance(layers, int) and layers > 0:
        fields.update(_layer_types(f, model_type, layers))
        fields.update(_moe(f, model_type, layers))
    if model_type in ("deepseek_v3", "kimi_k2"):
        fields.update(_mla(f))
    try:
        return ModelSpec(**fields)
    except ConfigError as e:  # name the file, not only the model
        raise ConfigError(f"model config {path}: {e}") from None


def with_dtype(model: ModelSpec, dtype_bytes: int) -> ModelSpec:
    return replace(model, dtype_bytes=dtype_bytes)
