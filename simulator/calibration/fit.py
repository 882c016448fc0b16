"""Calibration: fit each GPU's cost-model parameters (`CostParams`) to measured kernel timings.

Input is Vidur's profiling layout (as in ../shared/data/kernels, or as `kvsim profile` writes):

    <profiles>/compute/<gpu>/<org>/<model>/mlp.csv        per-layer operators, per TP shard
    <profiles>/compute/<gpu>/<org>/<model>/attention.csv  optional (kvsim profile)
    <profiles>/network/<topology>/all_reduce.csv          optional; else send_recv.csv

mlp.csv has one row per (num_tokens, num_tensor_parallel_workers) with columns
`time_stats.<op>.{min,max,mean,median,std}` in milliseconds and the architecture (n_head,
n_kv_head, n_embd, n_expanded_embd, use_gated_mlp). The median is used; weights are fp16.

The fitted forms are the cost model's own (simulator/engine/costmodel.py, docstring items 1-4), so the
simulator predicts exactly what was scored here. Parameters are fractions of the datasheet
peak FLOP/s, memory bandwidth and link bandwidth plus per-kernel overheads in seconds, which is
what lets them transfer to GPUs with no measurements (`transfer_params`).

Invariants: deterministic (no RNG; the only date is the fit date passed in); bad input raises
ConfigError naming the file, column and value; nothing is written unless every GPU fitted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from simulator import __version__
from simulator.config.paths import data_dir
from simulator.engine.costmodel import (
    ATTN_TO_GEMM_COMPUTE,
    ELEMENTWISE_KIND,
    ELEMENTWISE_KINDS,
    GEMM_OPS,
    LAYER_OPS,
    CostParams,
    ShardDims,
    allreduce_time,
    gemm_time,
    link_bandwidth,
    op_times,
)
from simulator.errors import ConfigError, did_you_mean
from simulator.hardware.gpus import GpuSpec, get_gpu, gpu_names
from simulator.hardware.models import ALIASES, CATALOGUE

ALL_OPS = (*LAYER_OPS, "emb")
ARCH_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")
INDEX_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")
STAT = "median"


@dataclass(frozen=True)
class DataFolder:
    """Which catalogue GPU a data folder measured, and which network topology goes with it."""

    gpu: str
    network: str | None
    reason: str


# Decision (docs/costmodel.md, "Which GPU is each data folder"): Vidur's device SKUs are
# a100 = 312 TFLOPS / 80 GB, h100 = 80 GB SXM (DGX), a40 = 45 GB. The data agree: at one
# token the big GEMMs stream weights at ~1.6 TB/s on "a100" (above 0.8 x 1,555 GB/s of the
# 40 GB part, plausible for the 80 GB part's 2,039 GB/s) and ~2.65 TB/s on "h100" (above the
# PCIe card's ~2,000 GB/s peak). TP all-reduces run inside one node, so the DGX topologies
# (NVSwitch) go with the SXM parts; the a40 machine has only send_recv measurements.
KNOWN_FOLDERS = {
    "a100": DataFolder("a100-80gb", "a100_dgx",
                       "Vidur a100 SKU is 312 TFLOPS / 80 GB; T=1 GEMMs stream weights at ~1.6 TB/s, "
                       "only the 80 GB part (2,039 GB/s) reaches that; network: DGX A100 (NVSwitch)"),
    "a40": DataFolder("a40", "a40_pairwise_nvlink",
                      "Vidur a40 SKU (150 TFLOPS / 45 GB); network: only send_recv was measured"),
    "h100": DataFolder("h100-sxm", "h100_dgx",
                       "Vidur h100 SKU is 80 GB in a DGX node; T=1 GEMMs stream weights at ~2.65 TB/s, "
                       "above H100 PCIe's ~2,000 GB/s peak; network: DGX H100 (NVSwitch)"),
}


# --- reading ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelTimings:
    """Measured per-operator seconds of one model directory, one entry per CSV row."""

    name: str  # "<org>/<model>" as in the directory
    path: Path
    tokens: np.ndarray
    tp: np.ndarray
    dims: ShardDims
    ops: dict[str, np.ndarray]  # op -> seconds, NaN where not measured

    def layer_ops(self) -> list[str]:
        return [op for op in LAYER_OPS if op in self.ops]

    def layer_sum(self) -> np.ndarray:
        return sum((self.ops[op] for op in self.layer_ops()), np.zeros(len(self.tokens)))


def _numeric(df: pd.DataFrame, col: str, path: Path) -> np.ndarray:
    values = pd.to_numeric(df[col], errors="coerce")
    bad = values.isna() & df[col].notna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ConfigError(f"{path}: column {col!r} row {i + 2}: not a number: {df[col].iloc[i]!r}")
    return values.to_numpy(dtype=np.float64)


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{path}: empty file (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if df.empty:
        raise ConfigError(f"{path}: empty file (a header but no rows)")
    return df


def _catalogue_arch(name: str) -> dict[str, float] | None:
    """Architecture columns for a model directory name from the model catalogue, if known."""
    lowered = {k.lower(): v for k, v in CATALOGUE.items()}
    spec = lowered.get(name.lower()) or CATALOGUE.get(ALIASES.get(name.split("/")[-1].lower(), ""))
    if spec is None:
        return None
    return {"n_head": spec.num_heads, "n_kv_head": spec.num_kv_heads, "n_embd": spec.hidden_size,
            "n_expanded_embd": spec.intermediate_size, "use_gated_mlp": float(spec.gated_mlp),
            "head_dim": spec.head_dim}


def read_mlp_csv(path: str | Path, name: str | None = None) -> ModelTimings:
    """Read one mlp.csv. Steps:
    1. parse; an empty file is an error;
    2. the index columns and the four GEMM ops' median columns are required;
    3. architecture from the file's columns, else from the catalogue by directory name;
    4. every value numeric, times > 0 (an element-wise op may be absent: NaN, e.g. phi-2 has no
       post_attention_layernorm), ms -> s."""
    path = Path(path)
    name = name or f"{path.parent.parent.name}/{path.parent.name}"
    df = _read_csv(path)
    required = [*INDEX_COLUMNS, *(f"time_stats.{op}.{STAT}" for op in GEMM_OPS)]
    for col in required:
        if col not in df.columns:
            hint = did_you_mean(col, list(df.columns))
            raise ConfigError(f"{path}: missing column {col!r}{hint} (Vidur profiling layout, see "
                              f"docs/costmodel.md)")
    tokens = _numeric(df, "num_tokens", path)
    tp = _numeric(df, "num_tensor_parallel_workers", path)
    for col, v in (("num_tokens", tokens), ("num_tensor_parallel_workers", tp)):
        bad = ~(v >= 1) | (v != np.round(v))
        if bad.any():
            raise ConfigError(f"{path}: column {col!r} must hold integers >= 1, got {float(v[bad][0]):g}")
    missing_arch = [c for c in ARCH_COLUMNS if c not in df.columns]
    if missing_arch:
        arch = _catalogue_arch(name)
        if arch is None:
            raise ConfigError(
                f"{path}: no matching architecture for model directory {name!r}: the file lacks "
                f"columns {missing_arch} and {name!r} is not a catalogue model "
                f"(e.g. {', '.join(sorted(CATALOGUE)[:3])}, ...); add the architecture columns")
        cols = {k: np.full(len(df), float(v)) for k, v in arch.items()}
    else:
        cols = {c: _numeric(df, c, path) if c != "use_gated_mlp" else
                df[c].astype(str).str.lower().isin(["true", "1", "1.0"]).to_numpy(dtype=np.float64)
                for c in ARCH_COLUMNS}
        for c in ARCH_COLUMNS[:4]:
            bad = ~(cols[c] >= 1)
            if bad.any():
                raise ConfigError(f"{path}: column {c!r} must be >= 1, got {float(cols[c][bad][0]):g}")
        cols["head_dim"] = cols["n_embd"] / cols["n_head"]
        if (cols["head_dim"] != np.round(cols["head_dim"])).any():
            raise ConfigError(f"{path}: n_embd {cols['n_embd'][0]:g} is not a multiple of "
                              f"n_head {cols['n_head'][0]:g}")
    hd = cols["head_dim"]
    dims = ShardDims(hidden=cols["n_embd"], q=cols["n_head"] * hd / tp,
                     kv=np.maximum(1.0, np.ceil(cols["n_kv_head"] / tp)) * hd,
                     ffn=cols["n_expanded_embd"] / tp, gated=cols["use_gated_mlp"], dtype_bytes=2.0)
    ops: dict[str, np.ndarray] = {}
    for op in ALL_OPS:
        col = f"time_stats.{op}.{STAT}"
        if col not in df.columns:
            continue
        ms = _numeric(df, col, path)
        bad = ~(ms > 0) & ~np.isnan(ms)
        if bad.any() or (op in GEMM_OPS and np.isnan(ms).any()):
            value = f"{float(ms[bad][0]):g}" if bad.any() else "an empty cell"
            raise ConfigError(f"{path}: column {col!r} must hold times > 0 ms, got {value}")
        if not np.isnan(ms).all():
            ops[op] = ms * 1e-3
    return ModelTimings(name, path, tokens, tp, dims, ops)


def model_dirs(gpu_dir: Path) -> list[tuple[str, Path]]:
    """(name, mlp.csv path) for every model directory under compute/<gpu>/; a leaf directory
    without mlp.csv is an error (a typo'd or half-copied profile)."""
    if not gpu_dir.is_dir():
        raise ConfigError(f"{gpu_dir}: not a directory")
    out = []
    for d in sorted(p for p in gpu_dir.rglob("*") if p.is_dir()):
        has_subdirs = any(c.is_dir() for c in d.iterdir())
        if (d / "mlp.csv").is_file():
            out.append(("/".join(d.relative_to(gpu_dir).parts), d / "mlp.csv"))
        elif not has_subdirs:
            raise ConfigError(f"{d}: model directory has no mlp.csv")
    if not out:
        raise ConfigError(f"{gpu_dir}: no <org>/<model>/mlp.csv found")
    return out


def gpu_folders(profiles: Path) -> list[str]:
    compute = profiles / "compute"
    if not compute.is_dir():
        raise ConfigError(f"{profiles}: no compute/ folder (expected the Vidur profiling layout "
                          f"compute/<gpu>/<org>/<model>/mlp.csv)")
    folders = sorted(p.name for p in compute.iterdir() if p.is_dir())
    if not folders:
        raise ConfigError(f"{compute}: no GPU folders")
    return folders


def resolve_folder(profiles: Path, name: str) -> tuple[str, DataFolder]:
    """A --gpu argument (data folder or catalogue name) -> (folder, DataFolder). For a folder
    outside KNOWN_FOLDERS the catalogue GPU is the folder's own name ('' when it is not one)."""
    folders = gpu_folders(profiles)
    if name in folders:
        folder = name
    else:
        by_gpu = {v.gpu: k for k, v in KNOWN_FOLDERS.items() if k in folders}
        try:
            canonical = get_gpu(name).name
        except ConfigError:
            canonical = None
        folder = by_gpu.get(canonical or "") or (canonical if canonical in folders else None)
        if folder is None:
            raise ConfigError(f"no measurements for GPU {name!r} under {profiles / 'compute'}"
                              f"{did_you_mean(name, folders)}; folders: {', '.join(folders)}")
    known = KNOWN_FOLDERS.get(folder)
    if known is None:
        net = folder if (profiles / "network" / folder).is_dir() else None
        try:
            gpu = get_gpu(folder).name
        except ConfigError:
            gpu = ""
        known = DataFolder(gpu, net, f"folder named after the GPU ({folder!r})")
    return folder, known


# --- fitting ----------------------------------------------------------------------------

def _levenberg_marquardt(fun: Callable[[np.ndarray], np.ndarray], x0: Iterable[float],
                         max_iter: int = 200, tol: float = 1e-12) -> np.ndarray:
    """Minimise |fun(x)|^2. Steps: 1. forward-difference Jacobian; 2. damped Gauss-Newton step;
    3. accept if the cost falls (damping / 10), else damping x 10 and retry; 4. stop when the
    relative fall is below tol or no step helps."""
    x = np.asarray(list(x0), dtype=np.float64)
    r = fun(x)
    cost = float(r @ r)
    lam = 1e-3
    for _ in range(max_iter):
        jac = np.empty((r.size, x.size))
        for i in range(x.size):
            xi = x.copy()
            xi[i] += 1e-6
            jac[:, i] = (fun(xi) - r) / 1e-6
        a, g = jac.T @ jac, jac.T @ r
        while lam < 1e12:
            step = np.linalg.solve(a + lam * np.diag(np.diag(a) + 1e-12), -g)
            rn = fun(x + step)
            cn = float(rn @ rn)
            if math.isfinite(cn) and cn < cost:
                break
            lam *= 10
        else:
            break
        fall = (cost - cn) / max(cost, 1e-300)
        x, r, cost = x + step, rn, cn
        lam = max(lam / 10, 1e-12)
        if fall < tol:
            break
    return x


def _exp(v: float) -> float:
    """exp of a log-parameter, clamped so that a wild trial step stays finite."""
    return math.exp(min(max(float(v), -30.0), 8.0))


def _sig(x: float, digits: int = 4) -> float:
    """Round to significant digits, so the committed YAML holds exactly what was scored."""
    return float(f"{x:.{digits}g}")


def _gemm_rows(models: list[ModelTimings]) -> tuple[np.ndarray, ...]:
    t, k, n, y = [], [], [], []
    for m in models:
        for op, (kk, nn) in m.dims.gemm_shapes().items():
            keep = ~np.isnan(m.ops[op])
            t.append(m.tokens[keep])
            k.append(np.broadcast_to(kk, m.tokens.shape)[keep])
            n.append(np.broadcast_to(nn, m.tokens.shape)[keep])
            y.append(m.ops[op][keep])
    return tuple(np.concatenate(a) for a in (t, k, n, y))


# Rows with at most this many tokens are deep in the bandwidth-bound regime on every GPU here
# (ridge points are ~100-300 tokens), so they identify the weight-streaming parameters alone.
MEMORY_BOUND_MAX_TOKENS = 8


def fit_gemm(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> CostParams:
    """Fit the GEMM soft roofline on log(predicted / measured). Steps:
    1. bandwidth-bound rows (T <= MEMORY_BOUND_MAX_TOKENS): gemm_overhead_s and
       gemm_bandwidth_eff of t = o + bytes / (bw * eff), the achieved weight-streaming rate;
    2. all rows, with those two fixed: gemm_compute_eff and gemm_overlap_exp;
    (with fewer than 3 bandwidth-bound rows, all four are fitted together on all rows)."""
    t, k, n, y = _gemm_rows(models)
    peak, bw = gpu.peak_flops(2), gpu.hbm_bandwidth_gbps * 1e9
    log_y = np.log(y)
    small = t <= MEMORY_BOUND_MAX_TOKENS
    staged = int(small.sum()) >= 3
    if staged:
        nbytes = (k * n + t * (k + n))[small] * 2.0

        def residual_mem(x: np.ndarray) -> np.ndarray:
            return np.log(_exp(x[0]) + nbytes / (bw * _exp(x[1]))) - log_y[small]

        x_mem = _levenberg_marquardt(residual_mem, [math.log(3e-6), math.log(0.8)])

    def params(x: np.ndarray) -> CostParams:
        o, eb = (x_mem if staged else x[2:])[:2]
        return replace(base, gemm_overhead_s=_exp(o),
                       gemm_bandwidth_eff=min(_exp(eb), 2.0),
                       gemm_compute_eff=min(_exp(x[0]), 2.0), gemm_overlap_exp=1.0 + _exp(x[1]))

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(gemm_time(t, k, n, 2.0, peak, bw, params(x))) - log_y

    x0 = [math.log(0.7), math.log(0.5)] + ([] if staged else [math.log(3e-6), math.log(0.8)])
    p = params(_levenberg_marquardt(residual, x0))
    return replace(p, gemm_overhead_s=_sig(p.gemm_overhead_s), gemm_bandwidth_eff=_sig(p.gemm_bandwidth_eff),
                   gemm_compute_eff=_sig(p.gemm_compute_eff), gemm_overlap_exp=_sig(p.gemm_overlap_exp))


def fit_elementwise(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> CostParams:
    """Fit <kind>_{overhead_s, bandwidth_eff} for each element-wise kind with measurements."""
    bw = gpu.hbm_bandwidth_gbps * 1e9
    out = base
    for kind in ELEMENTWISE_KINDS:
        t, elems, y = [], [], []
        for m in models:
            table = m.dims.elementwise_elems()
            for op, k in ELEMENTWISE_KIND.items():
                if k == kind and op in m.ops:
                    keep = ~np.isnan(m.ops[op])
                    t.append(m.tokens[keep])
                    elems.append(np.broadcast_to(table[op], m.tokens.shape)[keep])
                    y.append(m.ops[op][keep])
        if not t:
            continue
        tt, ee, log_y = np.concatenate(t), np.concatenate(elems), np.log(np.concatenate(y))
        nbytes = tt * ee * 2.0

        def residual(x: np.ndarray, nbytes=nbytes, log_y=log_y) -> np.ndarray:
            return np.log(_exp(x[0]) + nbytes / (bw * _exp(x[1]))) - log_y

        x = _levenberg_marquardt(residual, [math.log(3e-6), math.log(0.5)])
        out = replace(out, **{f"{kind}_overhead_s": _sig(_exp(x[0])),
                              f"{kind}_bandwidth_eff": _sig(min(_exp(x[1]), 2.0))})
    return out


def derive_attention(p: CostParams) -> CostParams:
    """Attention parameters from the GEMM fit when attention was not measured (costmodel item 3)."""
    return replace(p, attn_compute_eff=_sig(ATTN_TO_GEMM_COMPUTE * p.gemm_compute_eff),
                   attn_bandwidth_eff=p.gemm_bandwidth_eff)


ATTN_COLUMNS = ("num_tensor_parallel_workers", "n_head", "n_kv_head", "n_embd", "batch_size",
                "num_tokens", "kv_cache_size", f"time_stats.attention.{STAT}")


def read_attention_csv(path: Path) -> pd.DataFrame:
    """attention.csv as `kvsim profile` writes it: per row, batch_size sequences each with
    num_tokens new tokens and kv_cache_size tokens of context (including the new ones)."""
    df = _read_csv(path)
    for col in ATTN_COLUMNS:
        if col not in df.columns:
            raise ConfigError(f"{path}: missing column {col!r}{did_you_mean(col, list(df.columns))}")
    out = pd.DataFrame({c: _numeric(df, c, path) for c in ATTN_COLUMNS})
    if not (out[f"time_stats.attention.{STAT}"] > 0).all():
        raise ConfigError(f"{path}: column 'time_stats.attention.{STAT}' must hold times > 0 ms")
    return out


def fit_attention(frames: list[pd.DataFrame], gpu: GpuSpec, base: CostParams) -> CostParams:
    """Fit attn_{compute_eff, bandwidth_eff, overhead_s} to measured attention kernels."""
    df = pd.concat(frames, ignore_index=True)
    peak, bw = gpu.peak_flops(2), gpu.hbm_bandwidth_gbps * 1e9
    tp = df["num_tensor_parallel_workers"].to_numpy()
    heads = df["n_head"].to_numpy() / tp
    hd = df["n_embd"].to_numpy() / df["n_head"].to_numpy()
    kv_heads = np.maximum(1.0, np.ceil(df["n_kv_head"].to_numpy() / tp))
    b, n, ctx = (df[c].to_numpy() for c in ("batch_size", "num_tokens", "kv_cache_size"))
    pairs = b * (n * (ctx - n) + n * (n + 1) / 2)
    flops = 4.0 * pairs * heads * hd
    nbytes = (b * ctx * 2 * kv_heads * hd + b * n * 2 * heads * hd) * 2.0
    log_y = np.log(df[f"time_stats.attention.{STAT}"].to_numpy() * 1e-3)

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(flops / (peak * _exp(x[0])), nbytes / (bw * _exp(x[1])))
                      + _exp(x[2])) - log_y

    x = _levenberg_marquardt(residual, [math.log(0.5), math.log(0.8), math.log(1e-5)])
    return replace(base, attn_compute_eff=_sig(min(_exp(x[0]), 2.0)),
                   attn_bandwidth_eff=_sig(min(_exp(x[1]), 2.0)),
                   attn_overhead_s=_sig(_exp(x[2])))


def fit_compute(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> CostParams:
    return fit_elementwise(models, gpu, fit_gemm(models, gpu, base))


# --- network ----------------------------------------------------------------------------

@dataclass(frozen=True)
class NetworkFit:
    latency_s: float
    bus_eff: float
    source: str  # "all_reduce" or "send_recv (ring model)"
    path: Path
    mape_pct: dict[int, float]  # by number of workers, against all_reduce rows when available


def _network_frame(path: Path, collective: str) -> pd.DataFrame:
    df = _read_csv(path)
    col = f"time_stats.{collective}.{STAT}"
    for c in ("size", "num_workers", col):
        if c not in df.columns:
            raise ConfigError(f"{path}: missing column {c!r}{did_you_mean(c, list(df.columns))}")
    out = pd.DataFrame({"size": _numeric(df, "size", path), "workers": _numeric(df, "num_workers", path),
                        "t": _numeric(df, col, path) * 1e-3})
    if "devices_per_node" in df.columns:  # tensor parallelism runs inside one node
        out = out[_numeric(df, "devices_per_node", path) == out["workers"].to_numpy()]
    out = out[(out["t"] > 0) & (out["size"] > 0)]
    if out.empty:
        raise ConfigError(f"{path}: no intra-node rows with size > 0 and time > 0")
    return out.reset_index(drop=True)


def fit_network(topology_dir: Path, gpu: GpuSpec) -> NetworkFit:
    """Steps: 1. all_reduce.csv (intra-node rows): fit latency and bus efficiency of the ring
    form in costmodel.allreduce_time, on log error; 2. else send_recv.csv: fit a point-to-point
    latency a and bandwidth b; a ring all-reduce is 2(n-1) steps of S/n bytes, i.e. bus
    bandwidth b and, for 2 workers, latency 2a."""
    link = link_bandwidth(gpu)
    ar_path, sr_path = topology_dir / "all_reduce.csv", topology_dir / "send_recv.csv"
    if ar_path.is_file():
        df = _network_frame(ar_path, "all_reduce")
        size, workers, log_y = df["size"].to_numpy(), df["workers"].to_numpy(), np.log(df["t"].to_numpy())

        def residual(x: np.ndarray) -> np.ndarray:
            p = CostParams(allreduce_latency_s=_exp(x[0]), allreduce_bus_eff=min(_exp(x[1]), 2.0))
            return np.log(allreduce_time(size, workers, link, p)) - log_y

        x = _levenberg_marquardt(residual, [math.log(2e-5), math.log(0.3)])
        latency, eff, source, path = _exp(x[0]), min(_exp(x[1]), 2.0), "all_reduce", ar_path
    elif sr_path.is_file():
        df = _network_frame(sr_path, "send_recv")
        size, log_y = df["size"].to_numpy(), np.log(df["t"].to_numpy())

        def residual(x: np.ndarray) -> np.ndarray:
            return np.log(_exp(x[0]) + size / (1e9 * _exp(x[1]))) - log_y  # x[1]: log GB/s

        x = _levenberg_marquardt(residual, [math.log(1e-5), math.log(10.0)])
        latency, eff = 2 * _exp(x[0]), min(1e9 * _exp(x[1]) / link, 2.0)
        source, path = "send_recv (ring model)", sr_path
    else:
        raise ConfigError(f"{topology_dir}: neither all_reduce.csv nor send_recv.csv")
    latency, eff = _sig(latency), _sig(eff)
    mape: dict[int, float] = {}
    if ar_path.is_file():
        df = _network_frame(ar_path, "all_reduce")
        p = CostParams(allreduce_latency_s=latency, allreduce_bus_eff=eff)
        ape = np.abs(allreduce_time(df["size"], df["workers"], link, p) / df["t"].to_numpy() - 1)
        for w in sorted(df["workers"].unique()):
            mape[int(w)] = float(100 * ape[df["workers"].to_numpy() == w].mean())
    return NetworkFit(latency, eff, source, path, mape)


# --- scoring ----------------------------------------------------------------------------

def predict_ops(m: ModelTimings, gpu: GpuSpec, p: CostParams) -> dict[str, np.ndarray]:
    return op_times(m.dims, m.tokens, gpu.peak_flops(2), gpu.hbm_bandwidth_gbps * 1e9, p)


def predict_layer_sum(m: ModelTimings, gpu: GpuSpec, p: CostParams) -> np.ndarray:
    pred = predict_ops(m, gpu, p)
    return sum((pred[op] for op in m.layer_ops()), np.zeros(len(m.tokens)))


def _ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    keep = ~np.isnan(meas)
    return np.abs(pred[keep] / meas[keep] - 1.0)


@dataclass(frozen=True)
class ErrorStats:
    mape_pct: float
    p95_pct: float
    max_pct: float
    rows: int

    @classmethod
    def of(cls, ape: np.ndarray) -> ErrorStats:
        return cls(float(100 * ape.mean()), float(100 * np.quantile(ape, 0.95)), float(100 * ape.max()),
                   int(ape.size))


def op_errors(models: list[ModelTimings], gpu: GpuSpec, p: CostParams) -> dict[str, ErrorStats]:
    """In-sample error per operator and of the per-layer sum ('layer')."""
    apes: dict[str, list[np.ndarray]] = {}
    for m in models:
        pred = predict_ops(m, gpu, p)
        for op in m.ops:
            apes.setdefault(op, []).append(_ape(pred[op], m.ops[op]))
        apes.setdefault("layer", []).append(_ape(predict_layer_sum(m, gpu, p), m.layer_sum()))
    order = [op for op in (*ALL_OPS, "layer") if op in apes]
    return {op: ErrorStats.of(np.concatenate(apes[op])) for op in order}


def leave_one_model_out(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> dict[str, ErrorStats]:
    """For each model M: fit on the others, score M's per-layer op sum (every token and TP row)."""
    out = {}
    if len(models) < 2:
        return out
    for held in models:
        p = fit_compute([m for m in models if m is not held], gpu, base)
        out[held.name] = ErrorStats.of(_ape(predict_layer_sum(held, gpu, p), held.layer_sum()))
    return out


# --- one GPU ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuFit:
    folder: str
    gpu: GpuSpec
    params: CostParams
    models: list[ModelTimings]
    errors: dict[str, ErrorStats]
    lomo: dict[str, ErrorStats]
    network: NetworkFit | None
    attention_measured: bool
    data_label: str
    folder_reason: str
    notes: list[str] = field(default_factory=list)


def _label(path: Path) -> str:
    """A path as the user would type it from the current directory (no absolute home paths)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def fit_gpu(profiles: str | Path, name: str, *, target: GpuSpec | None = None,
            lomo: bool = True) -> GpuFit:
    """Fit one GPU folder. Steps:
    1. resolve the folder to a catalogue GPU (KNOWN_FOLDERS, else the folder's own name);
    2. read every model's mlp.csv (and attention.csv if present);
    3. fit GEMM and element-wise parameters on all models together;
    4. attention: fit if measured, else derive from the GEMM fit;
    5. all-reduce from the folder's network topology, if any (else keep the GPU's current values);
    6. score: in-sample per-op errors, leave-one-model-out errors of the per-layer op sum."""
    profiles = Path(profiles)
    folder, known = resolve_folder(profiles, name)
    if target is None and not known.gpu:
        raise ConfigError(f"data folder {folder!r} is not a catalogue GPU; pass --target PROFILE "
                          f"(a GPU name or a profile YAML with its datasheet figures)")
    gpu = target or get_gpu(known.gpu)
    base = CostParams.from_gpu(gpu) if gpu.calibration else CostParams()
    models, attn_frames = [], []
    for model_name, path in model_dirs(profiles / "compute" / folder):
        models.append(read_mlp_csv(path, model_name))
        if (path.parent / "attention.csv").is_file():
            attn_frames.append(read_attention_csv(path.parent / "attention.csv"))
    params = fit_compute(models, gpu, base)
    params = fit_attention(attn_frames, gpu, params) if attn_frames else derive_attention(params)
    notes = []
    network = None
    if known.network and (profiles / "network" / known.network).is_dir():
        network = fit_network(profiles / "network" / known.network, gpu)
        params = replace(params, allreduce_latency_s=network.latency_s, allreduce_bus_eff=network.bus_eff)
        bus_gbps = network.bus_eff * link_bandwidth(gpu) / 1e9
        if bus_gbps < gpu.host_link_gbps:
            notes.append(f"measured {network.source} bus bandwidth {bus_gbps:.3g} GB/s is below the host "
                         f"link's {gpu.host_link_gbps:g} GB/s: the profiled machine's GPUs apparently had "
                         f"no fast peer-to-peer path; kept as measured")
    else:
        notes.append("no network measurements: all-reduce parameters kept from the current profile")
    return GpuFit(folder, gpu, params, models, op_errors(models, gpu, params),
                  leave_one_model_out(models, gpu, params) if lomo else {}, network, bool(attn_frames),
                  _label(profiles / "compute" / folder), known.reason, notes)


# --- transfer to GPUs without measurements -----------------------------------------------

def spec_distance(a: GpuSpec, b: GpuSpec) -> float:
    """Distance in (log peak bf16 FLOP/s, log memory bandwidth): the two specs the roofline uses."""
    return math.hypot(math.log(a.peak_flops(2) / b.peak_flops(2)),
                      math.log(a.hbm_bandwidth_gbps / b.hbm_bandwidth_gbps))


def nearest_donor(target: GpuSpec, measured: list[GpuSpec]) -> GpuSpec:
    if not measured:
        raise ConfigError("no measured GPU to transfer parameters from")
    return min(measured, key=lambda g: (spec_distance(target, g), g.name))


def transfer_errors(fits: list[GpuFit]) -> dict[tuple[str, str], ErrorStats]:
    """(donor, other) -> error of the donor's parameters applied to the other measured GPU's specs:
    the measured price of extrapolating across GPUs."""
    out = {}
    for donor in fits:
        for other in fits:
            if other is donor:
                continue
            apes = [_ape(predict_layer_sum(m, other.gpu, donor.params), m.layer_sum()) for m in other.models]
            out[(donor.gpu.name, other.gpu.name)] = ErrorStats.of(np.concatenate(apes))
    return out


# --- YAML sections ------------------------------------------------------------------------

def _r(x: float) -> float:
    return round(x, 2)


ASSUMED = ("iteration_overhead_s (scheduler, sampler, input preparation: not in kernel data)",)


def measured_section(fit: GpuFit, fit_date: str) -> dict[str, Any]:
    """The `calibration:` mapping written into gpu_profiles/<gpu>.yaml for a measured GPU."""
    not_fitted = list(ASSUMED)
    if not fit.attention_measured:
        not_fitted.insert(0, f"attn_compute_eff = {ATTN_TO_GEMM_COMPUTE} x gemm_compute_eff, "
                             "attn_bandwidth_eff = gemm_bandwidth_eff, attn_overhead_s assumed "
                             "(no attention kernels in the data; costmodel.py docstring item 3)")
    provenance: dict[str, Any] = {
        "data": fit.data_label,
        "models": [m.name for m in fit.models],
        "rows": int(sum(len(m.tokens) for m in fit.models)),
        "data_folder_to_gpu": fit.folder_reason,
        "statistic": f"{STAT} of repeated timings (ms -> s), fp16",
        "fit": "Levenberg-Marquardt on log(predicted/measured), all models together",
        "fit_date": fit_date,
        "fitted_by": f"kvsim calibrate (kvsim {__version__})",
        "not_fitted": not_fitted,
    }
    if fit.network:
        provenance["network"] = f"{_label(fit.network.path)} ({fit.network.source}, intra-node rows)"
    if fit.notes:
        provenance["notes"] = list(fit.notes)
    error: dict[str, Any] = {
        "per_op_mape_pct": {op: _r(e.mape_pct) for op, e in fit.errors.items() if op != "layer"},
        "layer_sum_mape_pct": _r(fit.errors["layer"].mape_pct),
        "layer_sum_p95_pct": _r(fit.errors["layer"].p95_pct),
    }
    if fit.lomo:
        error["leave_one_model_out_mape_pct"] = {k: _r(v.mape_pct) for k, v in fit.lomo.items()}
    if fit.network and fit.network.mape_pct:
        error["allreduce_mape_pct_by_workers"] = {k: _r(v) for k, v in fit.network.mape_pct.items()}
    return {"status": "measured", "params": fit.params.as_dict(), "provenance": provenance, "error": error}


def extrapolated_section(target: GpuSpec, fits: list[GpuFit], fit_date: str,
                         transfers: dict[tuple[str, str], ErrorStats]) -> dict[str, Any]:
    """The `calibration:` mapping for a GPU without measurements. Steps:
    1. compute parameters (GEMM, element-wise, attention, iteration overhead) from the nearest
       measured GPU in spec space (`nearest_donor`), unchanged: they are fractions of the
       datasheet figures, so they scale with this GPU's peak FLOP/s and bandwidth;
    2. all-reduce parameters from the nearest measured GPU whose all-reduce was *measured*
       (not derived from send_recv), applied to this GPU's link (its host link when it has no
       GPU link: no PCIe-only all-reduce was measured, so that case is the least certain);
    3. provenance, and the donor's transfer check on the other measured GPUs as an error estimate."""
    donor = next(f for f in fits if f.gpu.name == nearest_donor(target, [f.gpu for f in fits]).name)
    params = donor.params
    measured_net = [f for f in fits if f.network and f.network.source == "all_reduce"]
    net_donor = donor
    if measured_net and donor not in measured_net:
        net_donor = next(f for f in measured_net
                         if f.gpu.name == nearest_donor(target, [g.gpu for g in measured_net]).name)
        params = replace(params, allreduce_latency_s=net_donor.params.allreduce_latency_s,
                         allreduce_bus_eff=net_donor.params.allreduce_bus_eff)
    link = "GPU link" if target.gpu_link_gbps else "host link (no GPU link: PCIe all-reduce not measured)"
    checks = {f"{d} -> {o}": _r(e.mape_pct) for (d, o), e in transfers.items() if d == donor.gpu.name}
    section: dict[str, Any] = {
        "status": "extrapolated",
        "donor": donor.gpu.name,
        "params": params.as_dict(),
        "provenance": {
            "method": "no kernel measurements for this GPU: the donor's fitted efficiencies (fractions of "
                      "datasheet peak FLOP/s, memory and link bandwidth) and overheads applied to this "
                      "GPU's datasheet figures; donor = nearest measured GPU in (log peak bf16 FLOP/s, "
                      f"log memory bandwidth), distance {spec_distance(target, donor.gpu):.2f}",
            "data": donor.data_label,
            "allreduce": f"from {net_donor.gpu.name}'s measured all-reduce, applied to this GPU's {link}",
            "fit_date": fit_date,
            "fitted_by": f"kvsim calibrate (kvsim {__version__})",
        },
    }
    if checks:
        section["error"] = {"transfer_check_layer_sum_mape_pct": checks,
                            "note": "error of this donor's parameters on the other measured GPUs "
                                    "(their own specs): an estimate of extrapolation error"}
    return section


def write_calibration(path: Path, section: dict[str, Any]) -> None:
    """Replace (or append) the top-level `calibration:` block of a profile YAML, keeping every
    other line (comments included) as it is."""
    text = path.read_text()
    before = yaml.safe_load(text) or {}
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        top_level = bool(line.strip()) and not line[0].isspace() and not line.startswith("#")
        if top_level:
            skipping = line.startswith("calibration:")
        if not skipping:
            kept.append(line)
    block = yaml.safe_dump({"calibration": section}, sort_keys=False, width=100, allow_unicode=True)
    new_text = "".join(kept).rstrip("\n") + "\n" + block
    after = yaml.safe_load(new_text)
    expected = {**{k: v for k, v in before.items() if k != "calibration"}, "calibration": section}
    if after != expected:  # never corrupt a profile
        raise ConfigError(f"{path}: could not rewrite the calibration section safely")
    path.write_text(new_text)


def profiles_dir() -> Path:
    """The packaged gpu_profiles/ folder (the repo's top-level one in a source checkout)."""
    return data_dir("gpu_profiles")


def profile_path(gpu: GpuSpec, out_dir: Path) -> Path:
    """The YAML to update in out_dir; copied from the packaged profile when absent there."""
    file_name = Path(gpu.source_file).name if gpu.source_file else f"{gpu.name}.yaml"
    dest = out_dir / file_name
    if not dest.is_file():
        src = Path(gpu.source_file)
        if not src.is_file():
            src = profiles_dir() / file_name
        out_dir.mkdir(parents=True, exist_ok=True)
        dest.write_text(src.read_text())
    return dest


def catalogue_gpus() -> list[GpuSpec]:
    seen, out = set(), []
    for name in gpu_names():
        g = get_gpu(name)
        if g.name not in seen:
            seen.add(g.name)
            out.append(g)
    return out


# --- plot ---------------------------------------------------------------------------------

def parity_plot(fits: list[GpuFit], path: Path) -> Path:
    """Predicted vs measured per-op and per-layer times, one panel per GPU, log-log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fits), figsize=(5.2 * len(fits), 5), squeeze=False)
    for ax, fit in zip(axes[0], fits):
        for op in (*ALL_OPS, "layer"):
            meas, pred = [], []
            for m in fit.models:
                p = predict_ops(m, fit.gpu, fit.params)
                if op == "layer":
                    meas.append(m.layer_sum())
                    pred.append(predict_layer_sum(m, fit.gpu, fit.params))
                elif op in m.ops:
                    meas.append(m.ops[op])
                    pred.append(p[op])
            if not meas:
                continue
            x, y = np.concatenate(meas) * 1e3, np.concatenate(pred) * 1e3
            keep = ~np.isnan(x)
            style = {"s": 4, "alpha": 0.35} if op != "layer" else {"s": 5, "alpha": 0.6, "c": "k"}
            ax.scatter(x[keep], y[keep], label=op, **style)
        lo, hi = 5e-4, 2e2
        grid = np.array([lo, hi])
        ax.plot(grid, grid, "k-", lw=0.8)
        for f in (0.9, 1.1):
            ax.plot(grid, grid * f, "k:", lw=0.6)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured (ms)",
               ylabel="predicted (ms)",
               title=f"{fit.gpu.name}: layer-sum MAPE {fit.errors['layer'].mape_pct:.1f}%")
        ax.legend(fontsize=6, markerscale=2, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["KNOWN_FOLDERS", "GpuFit", "ModelTimings", "NetworkFit", "catalogue_gpus",
           "extrapolated_section", "fit_compute", "fit_gpu", "fit_network", "leave_one_model_out",
           "measured_section", "nearest_donor", "op_errors", "parity_plot", "predict_layer_sum",
           "read_mlp_csv", "transfer_errors", "write_calibration"]
