"""KV cache layout as vLLM 0.33 plans it: one spec per attention layer, layers grouped into
KV cache groups that share one block pool, and the block counts that follow.

Per layer (v1/kv_cache_interface.py), per GPU:

    kind            vLLM spec             page_size_bytes (block_size tokens)
    full_attention  FullAttentionSpec     block_size * kv_heads * 2 * head_dim * dtype_bytes
    sliding_window  SlidingWindowSpec     same, blocks outside the window are freed
    chunked_local   ChunkedLocalAttention same, blocks of finished chunks are freed
    mla             MLAAttentionSpec      block_size * 1 * (kv_lora_rank + qk_rope_head_dim)
                                          * dtype_bytes (one latent "head", no separate V,
                                          replicated on every TP rank: max_tp_shards=1)

Groups (v1/core/kv_cache_planning.py get_kv_cache_groups, the path every catalogued
model takes - equal page sizes, no Mamba, no draft model):

    all layers one spec         -> one group of all layers
    several specs (hybrid)      -> bucket layers by spec in layer order; group_size =
                                   the smallest bucket (the largest when it is < 1.5x the
                                   smallest); bucket b splits into ceil(len/group_size)
                                   groups, group i taking layers[i::n]
    hybrid manager disabled     -> sliding / chunked layers promoted to full attention
                                   (unify_hybrid_kv_cache_specs), one group

    NOTE: gpt-oss-20b (layer 0 sliding, 12+12)   Gemma-3-27B (5 sliding : 1 full, 52+10)
          group 0: sw128 x12                     groups 0-5: sw1024 x9,9,9,9,8,8
          group 1: full  x12                     group 6:    full   x10
          one block id = 12 layer pages          one block id = 10 layer pages (the sliding
                                                 groups of 8 and 9 leave pages unused)

Every group draws block ids from one pool; a block id holds one page of every layer of the
group that owns it, so

    bytes_per_block = max over groups of sum(page_size_bytes of the group's layers)
    num_gpu_blocks  = kv_budget // bytes_per_block            (get_kv_cache_config_from_groups)
    blocks per max_model_len request = sum over groups of the spec's max_memory_usage_bytes
                                       / page_size_bytes
    max concurrency = num_gpu_blocks / that sum     (kv_cache_utils get_max_concurrency_...)

`max_memory_usage_bytes` per kind: full cdiv(max_model_len, bs); sliding window
cdiv(min(window - 1 + in_flight, max_model_len), bs) + 1; chunked local
cdiv(min(chunk + in_flight, max_model_len), bs), where in_flight = vLLM's
`max_in_flight_tokens` = max_num_batched_tokens x (2 with async scheduling, else 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.hardware.dtypes import kv_cache_dtype_bytes
from simulator.hardware.models import CHUNKED, FULL, SLIDING, ModelSpec


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class LayerKVSpec:
    """One attention layer's KV cache on one GPU (vLLM's AttentionSpec subclasses)."""

    kind: str  # "full_attention" | "sliding_window" | "chunked_local" | "mla"
    block_size: int
    num_kv_heads: int  # per GPU; 1 for MLA
    head_size: int  # K head size; MLA: kv_lora_rank + qk_rope_head_dim
    head_size_v: int  # V head size; 0 for MLA (the latent is K and V at once)
    dtype_bytes: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    @property
    def bytes_per_token(self) -> int:
        return self.num_kv_heads * (self.head_size + self.head_size_v) * self.dtype_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the attention window, whose blocks vLLM frees (single_type_kv_cache_
        manager.py get_num_skipped_tokens: SlidingWindowManager, ChunkedLocalAttentionManager)."""
        if self.kind == "sliding_window":
            return max(0, num_computed_tokens - self.sliding_window + 1)
        if self.kind == "chunked_local":
            return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size
        return 0

    def blocks_needed(self, num_tokens: int, num_new_tokens: int = 1) -> int:
        """Blocks one request holds in this layer's group once it has `num_tokens` tokens,
        the last `num_new_tokens` of them being computed this step: every block of the
        sequence less the whole blocks before the window (vLLM's remove_skipped_blocks runs
        before the step's allocation)."""
        skipped = self.num_skipped_tokens(num_tokens - num_new_tokens)
        return cdiv(num_tokens, self.block_size) - skipped // self.block_size

    def max_blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """vLLM's `max_memory_usage_bytes / page_size_bytes`: the blocks a max_model_len request
        is admitted with (SlidingWindowSpec / ChunkedLocalAttentionSpec
        max_admission_blocks_per_request; cdiv(max_model_len, block_size) for full and MLA)."""
        if self.kind == "sliding_window":
            tokens = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
            return cdiv(tokens, self.block_size) + 1  # the window need not start on a block edge
        if self.kind == "chunked_local":
            tokens = min(self.attention_chunk_size + max_in_flight_tokens, max_model_len)
            return cdiv(tokens, self.block_size)
        return cdiv(max_model_len, self.block_size)


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """Layers sharing one block table (vLLM's KVCacheGroupSpec)."""

    spec: LayerKVSpec
    layers: tuple[int, ...]

    @property
    def page_bytes(self) -> int:
        """Bytes one block id occupies in this group (one page per layer)."""
        return len(self.layers) * self.spec.page_size_bytes


@dataclass(frozen=True, slots=True)
class KVCacheLayout:
    """The KV cache groups of one GPU and the block arithmetic over them."""

    groups: tuple[KVCacheGroup, ...]

    @property
    def block_size(self) -> int:
        return self.groups[0].spec.block_size

    @property
    def bytes_per_block(self) -> int:
        """vLLM's _get_kv_cache_bytes_per_block: the widest group's bytes per block id."""
        return max(g.page_bytes for g in self.groups)

    @property
    def is_hybrid(self) -> bool:
        return len(self.groups) > 1 or self.groups[0].spec.kind in ("sliding_window", "chunked_local")

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of one token in every layer (what a token costs inside every window)."""
        return sum(g.spec.bytes_per_token * len(g.layers) for g in self.groups)

    def num_blocks(self, kv_budget_bytes: int) -> int:
        return kv_budget_bytes // self.bytes_per_block

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int) -> int:
        """Block ids a max_model_len request may hold, summed over groups (vLLM's start-up
        check and max concurrency use this sum)."""
        return sum(g.spec.max_blocks_per_request(max_model_len, max_in_flight_tokens)
                   for g in self.groups)

    def blocks_needed(self, num_tokens: int, num_new_tokens: int = 1) -> tuple[int, ...]:
        """Blocks per group for a request of `num_tokens` tokens (LayerKVSpec.blocks_needed)."""
        return tuple(g.spec.blocks_needed(num_tokens, num_new_tokens) for g in self.groups)

    def max_concurrency(self, num_blocks: int, max_model_len: int, max_in_flight_tokens: int) -> float:
        """vLLM's get_max_concurrency_for_kv_cache_config."""
        return num_blocks / self.blocks_per_request(max_model_len, max_in_flight_tokens)

    def capacity_tokens(self, num_blocks: int, max_model_len: int, max_in_flight_tokens: int) -> int:
        """vLLM's 'GPU KV cache size: N tokens' (get_kv_cache_capacity)."""
        return int(self.max_concurrency(num_blocks, max_model_len, max_in_flight_tokens) * max_model_len)

    def describe(self) -> str:
        """e.g. '2 KV cache groups of 16.0 KiB pages: 1 x sliding window 128 (18 layers), 1 x full
        attention (18 layers)'."""
        kinds: dict[str, list[int]] = {}  # label -> [groups, layers]
        for g in self.groups:
            s = g.spec
            label = {"sliding_window": f"sliding window {s.sliding_window}",
                     "chunked_local": f"chunked local {s.attention_chunk_size}",
                     "full_attention": "full attention"}.get(s.kind, s.kind.upper())
            counts = kinds.setdefault(label, [0, 0])
            counts[0] += 1
            counts[1] += len(g.layers)
        page = self.groups[0].spec.page_size_bytes
        return (f"{len(self.groups)} KV cache group{'s' if len(self.groups) > 1 else ''} of "
                f"{page / 1024:.1f} KiB pages: "
                + ", ".join(f"{n} x {label} ({layers} layers)" for label, (n, layers) in kinds.items()))


def layer_kv_specs(model: ModelSpec, *, tp: int, block_size: int,
                   kv_cache_dtype: str = "auto") -> list[LayerKVSpec]:
    """One LayerKVSpec per layer, as the model's attention layers build them (Attention /
    MLAAttention / ChunkedLocalAttention .get_kv_cache_spec). Steps:
    1. dtype: `kv_cache_dtype` (auto -> the model dtype);
    2. KV heads per GPU: max(1, kv_heads // tp), a replicated head when tp > kv_heads
       (ModelConfig.get_num_kv_heads); MLA keeps its single latent on every rank;
    3. kind per layer from ModelSpec.attention_types; a sliding-window layer takes the
       engine block size (vLLM's _largest_kernel_block_within picks it: every CUDA backend
       takes MultipleOf(16), so the page budget block_size * bytes_per_token gives block_size)."""
    dtype_bytes = kv_cache_dtype_bytes(kv_cache_dtype, model.dtype_bytes)
    if model.is_mla:
        mla = LayerKVSpec("mla", block_size, 1, model.kv_lora_rank + model.qk_rope_head_dim, 0, dtype_bytes)
        return [mla] * model.num_layers
    heads = max(1, -(-model.num_kv_heads // tp))
    base = dict(block_size=block_size, num_kv_heads=heads, head_size=model.head_dim,
                head_size_v=model.head_dim, dtype_bytes=dtype_bytes)
    by_type = {FULL: LayerKVSpec("full_attention", **base),
               SLIDING: LayerKVSpec("sliding_window", sliding_window=model.sliding_window, **base),
               CHUNKED: LayerKVSpec("chunked_local", attention_chunk_size=model.attention_chunk_size, **base)}
    return [by_type[t] for t in model.attention_types]


def group_layers(specs: list[LayerKVSpec], *, hybrid_kv_cache_manager: bool = True) -> KVCacheLayout:
    """vLLM's get_kv_cache_groups for equal page sizes. Steps:
    1. hybrid manager disabled: promote sliding-window and chunked-local layers to full
       attention (unify_hybrid_kv_cache_specs);
    2. one spec for all layers: one group (_get_kv_cache_groups_uniform_spec);
    3. otherwise bucket the layers by spec in layer order, pick the group size (the smallest
       bucket, or the largest if it is under 1.5x the smallest) and split each bucket into
       ceil(len / group_size) groups of layers[i::n] (_get_kv_cache_groups_uniform_page_size)."""
    if not hybrid_kv_cache_manager:
        specs = [LayerKVSpec("full_attention", s.block_size, s.num_kv_heads, s.head_size,
                             s.head_size_v, s.dtype_bytes) if s.kind in ("sliding_window", "chunked_local")
                 else s for s in specs]
    buckets: dict[LayerKVSpec, list[int]] = {}
    for i, s in enumerate(specs):
        buckets.setdefault(s, []).append(i)
    if len(buckets) == 1:
        (spec, layers), = buckets.items()
        return KVCacheLayout((KVCacheGroup(spec, tuple(layers)),))
    pages = {s.page_size_bytes for s in buckets}
    if len(pages) > 1:  # not reached by any supported model: every layer kind shares head sizes
        raise NotImplementedError(f"KV cache layers with different page sizes {sorted(pages)}")
    sizes = [len(v) for v in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for spec, layers in buckets.items():
        n = cdiv(len(layers), group_size)
        groups.extend(KVCacheGroup(spec, tuple(layers[i::n])) for i in range(n))
    return KVCacheLayout(tuple(groups))


def kv_cache_layout(model: ModelSpec, *, tp: int, block_size: int, kv_cache_dtype: str = "auto",
                    hybrid_kv_cache_manager: bool = True) -> KVCacheLayout:
    """The KV cache groups of `model` on one of `tp` GPUs."""
    return group_layers(layer_kv_specs(model, tp=tp, block_size=block_size, kv_cache_dtype=kv_cache_dtype),
                        hybrid_kv_cache_manager=hybrid_kv_cache_manager)
