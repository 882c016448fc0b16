"""Storage formats: the KV cache dtype (vLLM's `--kv-cache-dtype`) and the weight format
(vLLM's `--quantization`, or the checkpoint's `quantization_config`).

Both are parameters of the memory math (memory.py, kv_spec.py). `WeightFormat.compute` names
the GEMM dtype for the cost model's fp8 / fp4 peaks (costmodel.py docstring, item 7).

    kv_cache_dtype   bytes/element   vLLM 0.33 source
    auto             the model dtype  utils/torch_utils.py kv_cache_dtype_str_to_dtype
    bfloat16,float16 2                config/cache.py CacheDType
    fp8, fp8_e4m3    1                STR_DTYPE_TO_TORCH_DTYPE: torch.uint8 / float8_e4m3fn
    fp8_e5m2         1                STR_DTYPE_TO_TORCH_DTYPE: torch.float8_e5m2

fp8 KV keeps per-tensor scales (KVQuantMode.FP8_PER_TENSOR): nothing per token, so an fp8
page is exactly half a bf16 page (kv_cache_interface.py AttentionSpec.page_size_bytes).

A weight format stores `bytes_per_weight` (the packed value plus its block scales) for the
parameters in its `scope`; embeddings, the LM head, MoE routers and norms keep the model dtype:

    format  bytes/weight            scope    what it is (vLLM 0.33 method)
    fp8     1                       linear   e4m3, 128x128 fp32 block scales (+0.02 %, ignored):
                                             fp8.py Fp8Config (DeepSeek-V3, Kimi-K2 checkpoints)
    w4a16   1/2 + (2 + 1/2)/128     linear   int4, group 128, fp16 scale + 4-bit zero point:
                                             gptq / awq (gptq_marlin, awq_marlin)
    mxfp4   1/2 + 1/32              experts  e2m1, one e8m0 scale per 32: mxfp4.py Mxfp4Config
                                             quantizes only the MoE experts (linear layers
                                             fall back to UnquantizedLinearMethod)
    nvfp4   1/2 + 1/16              linear   e2m1, one fp8 scale per 16 (+ fp32 per tensor):
                                             modelopt.py ModelOptNvFp4Config
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from simulator.errors import ConfigError, did_you_mean

# vLLM's --kv-cache-dtype values kvsim models (the rest of CacheDType - fp8_inc, the
# per-token-head int8/int4 and turboquant formats - are refused with this list).
KV_CACHE_DTYPE_BYTES: dict[str, int | None] = {
    "auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def kv_cache_dtype_bytes(kv_cache_dtype: str, model_dtype_bytes: int) -> int:
    """Bytes per KV element: `auto` is the model's dtype (vLLM's default)."""
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        valid = list(KV_CACHE_DTYPE_BYTES)
        raise ConfigError(f"kv_cache_dtype {kv_cache_dtype!r} is not supported"
                          f"{did_you_mean(kv_cache_dtype, valid)}; valid: {', '.join(valid)}")
    return KV_CACHE_DTYPE_BYTES[kv_cache_dtype] or model_dtype_bytes


@dataclass(frozen=True, slots=True)
class WeightFormat:
    name: str
    bytes_per_weight: Fraction | None  # None: the model dtype (unquantized)
    scope: str  # "linear": every decoder linear layer (attention, MLP, experts); "experts": MoE only
    compute: str  # GEMM dtype the cost model should use: "bf16", "fp8", "fp4" (w4a16 dequantizes)

    def bytes_for(self, num_params: int, dtype_bytes: int, *, expert: bool) -> Fraction:
        """Bytes of `num_params` decoder weights (`expert`: inside a routed expert)."""
        if self.bytes_per_weight is None or (self.scope == "experts" and not expert):
            return Fraction(num_params * dtype_bytes)
        return num_params * self.bytes_per_weight


WEIGHT_FORMATS: dict[str, WeightFormat] = {f.name: f for f in (
    WeightFormat("bf16", None, "linear", "bf16"),
    WeightFormat("fp8", Fraction(1), "linear", "fp8"),
    WeightFormat("w4a16", Fraction(1, 2) + Fraction(5, 2 * 128), "linear", "bf16"),
    WeightFormat("mxfp4", Fraction(1, 2) + Fraction(1, 32), "experts", "fp4"),
    WeightFormat("nvfp4", Fraction(1, 2) + Fraction(1, 16), "linear", "fp4"),
)}

# vLLM --quantization / quantization_config.quant_method names for the same formats.
QUANTIZATION_ALIASES = {
    "none": "bf16", "fp16": "bf16", "bfloat16": "bf16", "float16": "bf16",
    "int4": "w4a16", "gptq": "w4a16", "awq": "w4a16", "gptq_marlin": "w4a16", "awq_marlin": "w4a16",
    "gpt_oss_mxfp4": "mxfp4", "modelopt_fp4": "nvfp4",
}


def weight_format(quantization: str) -> WeightFormat:
    """A weight format by kvsim or vLLM name (case-insensitive)."""
    key = quantization.lower()
    key = QUANTIZATION_ALIASES.get(key, key)
    if key not in WEIGHT_FORMATS:
        valid = [*WEIGHT_FORMATS, *QUANTIZATION_ALIASES]
        raise ConfigError(f"quantization {quantization!r} is not supported"
                          f"{did_you_mean(quantization.lower(), valid)}; valid: {', '.join(WEIGHT_FORMATS)}"
                          f" (vLLM names: {', '.join(QUANTIZATION_ALIASES)})")
    return WEIGHT_FORMATS[key]
