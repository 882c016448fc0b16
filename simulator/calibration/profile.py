"""`kvsim profile`: time a model's per-layer operators on the local device with PyTorch and write
them in the layout `kvsim calibrate` reads (Vidur's profiling layout):

    <out>/compute/<gpu>/<org>/<model>/mlp.csv        one row per (num_tokens, TP degree)
    <out>/compute/<gpu>/<org>/<model>/attention.csv  prefill and decode attention kernels

Like Vidur, each TP degree is profiled as one shard's shapes on one device: query heads, KV
heads (replicated when tp > KV heads) and the intermediate size divided by tp. The operators
are those of a vLLM decoder layer in eager PyTorch: norm (RMSNorm for gated-MLP models, else
LayerNorm), QKV / O / up / down projections, rotary embedding on q and k, the MLP activation
(SiLU-and-mul or GELU), the residual add, and the embedding lookup. Attention is PyTorch's
scaled_dot_product_attention: causal over a fresh prompt (prefill) and one query against a
context (decode). MoE models are profiled as their dense per-expert MLP. Collectives (all-reduce)
need several devices and are not profiled here.

Times are in milliseconds with min/max/mean/median/std over `repeats` runs after `warmup` runs;
CUDA times come from CUDA events, CPU times from perf_counter. Needs the optional extra:
pip install 'kvsim[profile]'. Invariant: the CSVs round-trip through calibration.data.read_mlp_csv.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.engine.costmodel import LAYER_OPS
from simulator.errors import ConfigError
from simulator.hardware.memory import kv_heads_per_gpu
from simulator.hardware.models import ModelSpec

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
STATS = ("min", "max", "mean", "median", "std")


@dataclass(frozen=True, slots=True)
class ProfileConfig:
    model: ModelSpec
    gpu: str  # folder name under compute/, normally the catalogue GPU name
    out_dir: Path
    tp_sizes: tuple[int, ...] = (1, 2, 4, 8)
    num_tokens: tuple[int, ...] = DEFAULT_TOKENS
    repeats: int = 20
    warmup: int = 3
    device: str = "cuda"
    dtype: str = "float16"  # the kernel data is fp16; use float32 for CPU smoke tests
    attention: bool = True
    prefill_tokens: tuple[int, ...] = (128, 512, 2048)
    decode_batch_sizes: tuple[int, ...] = (1, 8, 32)
    decode_contexts: tuple[int, ...] = (512, 2048)
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("tp_sizes", "num_tokens", "prefill_tokens", "decode_batch_sizes", "decode_contexts"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ConfigError(f"profile {name} must be positive integers, got {values!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise ConfigError(f"profile repeats must be >= 1 and warmup >= 0, "
                              f"got {self.repeats}, {self.warmup}")
        if self.dtype not in ("float16", "bfloat16", "float32"):
            raise ConfigError(f"profile dtype must be float16, bfloat16 or float32, got {self.dtype!r}")


def require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("kvsim profile needs PyTorch: pip install 'kvsim[profile]' "
                          "(or a torch build for your accelerator)") from None
    return torch


def _timer(torch: Any, device: str) -> Callable[[Callable[[], Any], int, int], np.ndarray]:
    """fn, repeats, warmup -> milliseconds per run."""
    if device.startswith("cuda"):
        def run(fn: Callable[[], Any], repeats: int, warmup: int) -> np.ndarray:
            for _ in range(warmup):
                fn()
            torch.cuda.synchronize()
            out = []
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                out.append(start.elapsed_time(end))
            return np.asarray(out)
        return run

    def run_cpu(fn: Callable[[], Any], repeats: int, warmup: int) -> np.ndarray:
        for _ in range(warmup):
            fn()
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return np.asarray(out)
    return run_cpu


def _stats(prefix: str, ms: np.ndarray) -> dict[str, float]:
    return {f"time_stats.{prefix}.{s}": float(getattr(np, s)(ms)) for s in STATS}


def _layer_ops(torch: Any, m: ModelSpec, tp: int, t: int, dtype: Any, device: str) -> dict[str, Callable]:
    """Closures running each operator of one layer shard at t tokens (tensors allocated here)."""
    F = torch.nn.functional  # noqa: N806 (torch's conventional name)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> Any:
        return (torch.randn(*shape, generator=gen) * 0.02).to(device=device, dtype=dtype)

    h, hd = m.hidden_size, m.head_dim
    heads, kv_heads = m.num_heads // tp, kv_heads_per_gpu(m, tp)
    ffn = m.intermediate_size // tp
    up = (2 if m.gated_mlp else 1) * ffn
    x, res = rand(t, h), rand(t, h)
    norm_w, norm_b = rand(h), rand(h)
    w_qkv, w_o = rand((heads + 2 * kv_heads) * hd, h), rand(h, heads * hd)
    w_up, w_down = rand(up, h), rand(h, ffn)
    q, k = rand(t, heads, hd), rand(t, kv_heads, hd)
    attn_out, up_out, act_out = rand(t, heads * hd), rand(t, up), rand(t, ffn)
    cos, sin = rand(t, 1, hd), rand(t, 1, hd)
    ids = torch.randint(0, max(1, m.vocab_size // tp), (t,), generator=gen).to(device)
    table = rand(max(1, m.vocab_size // tp), h)

    def norm() -> Any:
        if m.gated_mlp and hasattr(F, "rms_norm"):
            return F.rms_norm(x, (h,), norm_w, 1e-5)
        if m.gated_mlp:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * norm_w
        return F.layer_norm(x, (h,), norm_w, norm_b, 1e-5)

    def rope() -> Any:
        def rot(v: Any) -> Any:
            v1, v2 = v.chunk(2, dim=-1)
            return v * cos + torch.cat((-v2, v1), dim=-1) * sin
        return rot(q), rot(k)

    def act() -> Any:
        if m.gated_mlp:
            return F.silu(up_out[:, :ffn]) * up_out[:, ffn:]
        return F.gelu(up_out)

    return {
        "emb": lambda: F.embedding(ids, table),
        "input_layernorm": norm,
        "attn_pre_proj": lambda: F.linear(x, w_qkv),
        "attn_rope": rope,
        "attn_post_proj": lambda: F.linear(attn_out, w_o),
        "post_attention_layernorm": norm,
        "mlp_up_proj": lambda: F.linear(x, w_up),
        "mlp_act": act,
        "mlp_down_proj": lambda: F.linear(act_out, w_down),
        "add": lambda: x + res,
    }


def _arch(m: ModelSpec) -> dict[str, Any]:
    return {"n_head": m.num_heads, "n_kv_head": m.num_kv_heads, "n_embd": m.hidden_size,
            "n_expanded_embd": m.intermediate_size, "vocab_size": m.vocab_size,
            "use_gated_mlp": bool(m.gated_mlp)}


def _tp_sizes(cfg: ProfileConfig) -> list[int]:
    m = cfg.model
    ok = [tp for tp in cfg.tp_sizes if m.num_heads % tp == 0 and m.intermediate_size % tp == 0]
    for tp in sorted(set(cfg.tp_sizes) - set(ok)):
        cfg.notes.append(f"tp={tp} skipped: heads {cfg.model.num_heads} / intermediate "
                         f"{cfg.model.intermediate_size} not divisible")
    if not ok:
        raise ConfigError(f"profile: no TP size in {cfg.tp_sizes} divides the model's heads and "
                          f"intermediate size")
    return ok


def profile_mlp(cfg: ProfileConfig) -> pd.DataFrame:
    """Steps: for each TP size and token count: 1. allocate one shard's tensors; 2. time every
    operator (warmup, then repeats); 3. one row of stats + architecture columns."""
    torch = require_torch()
    dtype = getattr(torch, cfg.dtype)
    timer = _timer(torch, cfg.device)
    rows = []
    with torch.inference_mode():
        for tp in _tp_sizes(cfg):
            for t in cfg.num_tokens:
                ops = _layer_ops(torch, cfg.model, tp, t, dtype, cfg.device)
                row: dict[str, Any] = {}
                for op in ("emb", *LAYER_OPS):
                    row.update(_stats(op, timer(ops[op], cfg.repeats, cfg.warmup)))
                row.update(_arch(cfg.model))
                row.update(num_tokens=t, num_tensor_parallel_workers=tp)
                rows.append(row)
    return pd.DataFrame(rows)


def profile_attention(cfg: ProfileConfig) -> pd.DataFrame:
    """Prefill (batch 1, causal over n fresh tokens) and decode (b sequences x 1 query against
    c cached tokens) with scaled_dot_product_attention, per TP shard."""
    torch = require_torch()
    F = torch.nn.functional  # noqa: N806
    dtype = getattr(torch, cfg.dtype)
    timer = _timer(torch, cfg.device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    m = cfg.model
    gqa = _sdpa_has_gqa(torch)
    if not gqa and m.num_kv_heads != m.num_heads:
        cfg.notes.append("this torch has no enable_gqa: KV heads expanded before timing (reads more bytes)")

    def rand(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen).to(device=cfg.device, dtype=dtype)

    cases = [(1, n, n, True) for n in cfg.prefill_tokens] + \
            [(b, 1, c, False) for b in cfg.decode_batch_sizes for c in cfg.decode_contexts]
    rows = []
    with torch.inference_mode():
        for tp in _tp_sizes(cfg):
            heads, kv_heads = m.num_heads // tp, kv_heads_per_gpu(m, tp)
            for batch, n, ctx, is_prefill in cases:
                q = rand(batch, heads, n, m.head_dim)
                k, v = rand(batch, kv_heads, ctx, m.head_dim), rand(batch, kv_heads, ctx, m.head_dim)
                kwargs: dict[str, Any] = {"is_causal": is_prefill}
                if gqa:
                    kwargs["enable_gqa"] = kv_heads != heads
                elif kv_heads != heads:
                    k = k.repeat_interleave(heads // kv_heads, dim=1)
                    v = v.repeat_interleave(heads // kv_heads, dim=1)

                def fn(q=q, k=k, v=v, kwargs=kwargs) -> Any:
                    return F.scaled_dot_product_attention(q, k, v, **kwargs)

                row: dict[str, Any] = _stats("attention", timer(fn, cfg.repeats, cfg.warmup))
                row.update(num_tensor_parallel_workers=tp, n_head=m.num_heads, n_kv_head=m.num_kv_heads,
                           n_embd=m.hidden_size, batch_size=batch, num_tokens=n, kv_cache_size=ctx,
                           is_prefill=is_prefill)
                rows.append(row)
    return pd.DataFrame(rows)


def _sdpa_has_gqa(torch: Any) -> bool:
    """Whether scaled_dot_product_attention takes enable_gqa (torch >= 2.5); probed by calling
    it, since a builtin has no inspectable signature."""
    q = torch.zeros(1, 2, 1, 4)
    kv = torch.zeros(1, 1, 1, 4)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    except (TypeError, RuntimeError):
        return False
    return True


def model_dir(cfg: ProfileConfig) -> Path:
    parts = cfg.model.name.strip("/").split("/")
    org, name = (parts[-2], parts[-1]) if len(parts) >= 2 else ("local", parts[-1])
    return cfg.out_dir / "compute" / cfg.gpu / org / name


def run_profile(cfg: ProfileConfig) -> list[Path]:
    """Profile and write mlp.csv (+ attention.csv); returns the files written."""
    out = model_dir(cfg)
    mlp = profile_mlp(cfg)
    written = []
    out.mkdir(parents=True, exist_ok=True)
    mlp.to_csv(out / "mlp.csv", index=False)
    written.append(out / "mlp.csv")
    if cfg.attention:
        profile_attention(cfg).to_csv(out / "attention.csv", index=False)
        written.append(out / "attention.csv")
    return written
