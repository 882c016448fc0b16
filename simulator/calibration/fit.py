"""Fitting the cost model's parameters (`CostParams`) to measured kernel timings, one operator
kind at a time: GEMMs (soft roofline), element-wise kernels, attention, and the TP all-reduce.

The fitted forms are the cost model's own (simulator/engine/costmodel.py, docstring items 1-4), so
the simulator predicts exactly what was scored here. Parameters are fractions of the datasheet
peak FLOP/s, memory bandwidth and link bandwidth plus per-kernel overheads in seconds, which is
what lets them transfer to GPUs with no measurements (calibration/transfer.py).

Invariants: deterministic (no RNG); every residual is log(predicted / measured); fitted values
are rounded to 4 significant digits, so a committed profile holds exactly what was scored.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration.data import STAT, ModelTimings, network_frame
from simulator.engine.costmodel import (
    ATTN_TO_GEMM_COMPUTE,
    ELEMENTWISE_KIND,
    ELEMENTWISE_KINDS,
    CostParams,
    allreduce_time,
    gemm_time,
    link_bandwidth,
)
from simulator.errors import ConfigError
from simulator.hardware.gpus import GpuSpec

# --- compute: GEMMs, element-wise kernels, attention ------------------------------------

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


def fit_network(topology_dir: Path, gpu: GpuSpec) -> NetworkFit:
    """Steps: 1. all_reduce.csv (intra-node rows): fit latency and bus efficiency of the ring
    form in costmodel.allreduce_time, on log error; 2. else send_recv.csv: fit a point-to-point
    latency a and bandwidth b; a ring all-reduce is 2(n-1) steps of S/n bytes, i.e. bus
    bandwidth b and, for 2 workers, latency 2a."""
    link = link_bandwidth(gpu)
    ar_path, sr_path = topology_dir / "all_reduce.csv", topology_dir / "send_recv.csv"
    if ar_path.is_file():
        df = network_frame(ar_path, "all_reduce")
        size, workers, log_y = df["size"].to_numpy(), df["workers"].to_numpy(), np.log(df["t"].to_numpy())

        def residual(x: np.ndarray) -> np.ndarray:
            p = CostParams(allreduce_latency_s=_exp(x[0]), allreduce_bus_eff=min(_exp(x[1]), 2.0))
            return np.log(allreduce_time(size, workers, link, p)) - log_y

        x = _levenberg_marquardt(residual, [math.log(2e-5), math.log(0.3)])
        latency, eff, source, path = _exp(x[0]), min(_exp(x[1]), 2.0), "all_reduce", ar_path
    elif sr_path.is_file():
        df = network_frame(sr_path, "send_recv")
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
        df = network_frame(ar_path, "all_reduce")
        p = CostParams(allreduce_latency_s=latency, allreduce_bus_eff=eff)
        ape = np.abs(allreduce_time(df["size"], df["workers"], link, p) / df["t"].to_numpy() - 1)
        for w in sorted(df["workers"].unique()):
            mape[int(w)] = float(100 * ape[df["workers"].to_numpy() == w].mean())
    return NetworkFit(latency, eff, source, path, mape)
