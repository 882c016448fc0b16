"""Fitting the cost model's parameters (`CostParams`) to measured kernel timings, one operator
kind at a time: GEMMs (soft roofline), element-wise kernels, attention, and the TP all-reduce.

The fitted forms are the cost model's own (simulator/engine/costmodel.py, docstring items 1-4), so
the simulator predicts exactly what was scored here. Parameters are fractions of the datasheet
peak FLOP/s, memory bandwidth and link bandwidth plus per-kernel overheads in seconds, which is
what lets them transfer to GPUs with no measurements (calibration/transfer.py).

Each fit is a bounded least-squares problem (calibration/solve.py, scipy.optimize.least_squares)
over the parameters' physical ranges (`*_RANGE` below); every fitted parameter comes back with
its standard error, or flagged as sitting on a bound.

Invariants: deterministic (no RNG); every residual is log(predicted / measured); fitted values
are rounded to 4 significant digits, so a committed profile holds exactly what was scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration.data import STAT, ModelTimings, network_frame
from simulator.calibration.solve import LEAST_SQUARES, Objective, Param, ParamStat, Solution, solve
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

# Physical ranges of the fitted parameters: the solver's bounds. Efficiencies are fractions of a
# datasheet figure; CostParams allows (0, 2] (> 1 when a small working set is served from L2),
# and 1e-4 stands in for 0, which log space cannot reach. Overheads and latencies: 0.1 ns to 10 ms
# per kernel or collective. The soft-roofline exponent: 1 = memory and compute do not overlap,
# large = the plain roofline max(m, c) (at 20 the two differ by at most 2^(1/20) - 1 = 3.6 %).
EFF_RANGE = (1e-4, 2.0)
OVERHEAD_RANGE_S = (1e-10, 1e-2)
OVERLAP_EXP_RANGE = (1.0, 20.0)


@dataclass(frozen=True)
class FittedParams:
    """Cost parameters and, for each one a fit produced, its standard error / bound flag; the
    others (defaults, derived, assumed) have no entry in `stats`."""

    params: CostParams
    stats: dict[str, ParamStat] = field(default_factory=dict)

    def with_solution(self, sol: Solution) -> FittedParams:
        """These params with the solution's values, rounded (`round_sig`), and its stats added."""
        rounded = {name: round_sig(v) for name, v in sol.values.items()}
        return FittedParams(replace(self.params, **rounded), {**self.stats, **sol.stats})


def round_sig(x: float, digits: int = 4) -> float:
    """Round to significant digits, so the committed YAML holds exactly what was scored."""
    return float(f"{x:.{digits}g}")


def _eff(name: str, start: float) -> Param:
    return Param(name, start, *EFF_RANGE)


def _overhead(name: str, start: float) -> Param:
    return Param(name, start, *OVERHEAD_RANGE_S)


# --- compute: GEMMs, element-wise kernels, attention ------------------------------------

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


def fit_gemm(models: list[ModelTimings], gpu: GpuSpec, base: CostParams,
             objective: Objective = LEAST_SQUARES) -> FittedParams:
    """Fit the GEMM soft roofline on log(predicted / measured). Steps:
    1. bandwidth-bound rows (T <= MEMORY_BOUND_MAX_TOKENS): gemm_overhead_s and
       gemm_bandwidth_eff of t = o + bytes / (bw * eff), the achieved weight-streaming rate;
    2. all rows, with those two fixed (unrounded): gemm_compute_eff and gemm_overlap_exp;
    (with fewer than 3 bandwidth-bound rows, all four are fitted together on all rows).
    The standard errors of step 2 are conditional on step 1's values."""
    t, k, n, y = _gemm_rows(models)
    peak, bw = gpu.peak_flops(2), gpu.hbm_bandwidth_gbps * 1e9
    log_y = np.log(y)
    memory = [_overhead("gemm_overhead_s", 3e-6), _eff("gemm_bandwidth_eff", 0.8)]
    compute = [_eff("gemm_compute_eff", 0.7), Param("gemm_overlap_exp", 1.5, *OVERLAP_EXP_RANGE, log=False)]
    small = t <= MEMORY_BOUND_MAX_TOKENS
    out = FittedParams(base)
    fixed: dict[str, float] = {}
    if int(small.sum()) >= 3:
        # 1. weight streaming, on the bandwidth-bound rows
        nbytes = (k * n + t * (k + n))[small] * 2.0

        def residual_mem(v: np.ndarray) -> np.ndarray:
            return np.log(v[0] + nbytes / (bw * v[1])) - log_y[small]

        mem = solve(residual_mem, memory, objective)
        fixed, free = mem.values, compute
        out = FittedParams(base, mem.stats)
    else:
        free = compute + memory
    names = [p.name for p in free]

    # 2. compute efficiency and overlap, on all rows
    def residual(v: np.ndarray) -> np.ndarray:
        p = replace(base, **fixed, **dict(zip(names, v.tolist())))
        return np.log(gemm_time(t, k, n, 2.0, peak, bw, p)) - log_y

    sol = solve(residual, free, objective)
    return out.with_solution(Solution({**fixed, **sol.values}, sol.stats, sol.cost))


def fit_elementwise(models: list[ModelTimings], gpu: GpuSpec, base: CostParams,
                    objective: Objective = LEAST_SQUARES) -> FittedParams:
    """Fit <kind>_{overhead_s, bandwidth_eff} of t = o + bytes / (bw * eff) for each element-wise
    kind with measurements, one kind at a time."""
    bw = gpu.hbm_bandwidth_gbps * 1e9
    out = FittedParams(base)
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

        def residual(v: np.ndarray, nbytes=nbytes, log_y=log_y) -> np.ndarray:
            return np.log(v[0] + nbytes / (bw * v[1])) - log_y

        params = [_overhead(f"{kind}_overhead_s", 3e-6), _eff(f"{kind}_bandwidth_eff", 0.5)]
        out = out.with_solution(solve(residual, params, objective))
    return out


def derive_attention(fitted: FittedParams) -> FittedParams:
    """Attention parameters from the GEMM fit when attention was not measured (costmodel item 3)."""
    p = fitted.params
    derived = replace(p, attn_compute_eff=round_sig(ATTN_TO_GEMM_COMPUTE * p.gemm_compute_eff),
                      attn_bandwidth_eff=p.gemm_bandwidth_eff)
    return replace(fitted, params=derived)


def fit_attention(frames: list[pd.DataFrame], gpu: GpuSpec, base: FittedParams,
                  objective: Objective = LEAST_SQUARES) -> FittedParams:
    """Fit attn_{compute_eff, bandwidth_eff, overhead_s} of
    max(flops / (peak * eff_c), bytes / (bw * eff_bw)) + o to measured attention kernels."""
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

    def residual(v: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(flops / (peak * v[0]), nbytes / (bw * v[1])) + v[2]) - log_y

    params = [_eff("attn_compute_eff", 0.5), _eff("attn_bandwidth_eff", 0.8),
              _overhead("attn_overhead_s", 1e-5)]
    return base.with_solution(solve(residual, params, objective))


def fit_compute(models: list[ModelTimings], gpu: GpuSpec, base: CostParams,
                objective: Objective = LEAST_SQUARES) -> FittedParams:
    """GEMM, then element-wise parameters (they share no parameter, so the order is immaterial)."""
    gemm = fit_gemm(models, gpu, base, objective)
    elementwise = fit_elementwise(models, gpu, gemm.params, objective)
    return FittedParams(elementwise.params, {**gemm.stats, **elementwise.stats})


# --- network ----------------------------------------------------------------------------

def _scaled(stat: ParamStat, factor: float) -> ParamStat:
    """The stat of factor x a parameter."""
    return replace(stat, std_error=None if stat.std_error is None else factor * stat.std_error,
                   bound=None if stat.bound is None else factor * stat.bound)


@dataclass(frozen=True)
class NetworkFit:
    latency_s: float
    bus_eff: float
    source: str  # "all_reduce" or "send_recv (ring model)"
    path: Path
    mape_pct: dict[int, float]  # by number of workers, against all_reduce rows when available
    stats: dict[str, ParamStat]  # allreduce_latency_s, allreduce_bus_eff


def fit_network(topology_dir: Path, gpu: GpuSpec, objective: Objective = LEAST_SQUARES) -> NetworkFit:
    """Steps: 1. all_reduce.csv (intra-node rows): fit latency and bus efficiency of the ring
    form in costmodel.allreduce_time, on log error; 2. else send_recv.csv: fit a point-to-point
    latency a and bandwidth b; a ring all-reduce is 2(n-1) steps of S/n bytes, i.e. bus
    bandwidth b and, for 2 workers, latency 2a (standard errors scale the same way)."""
    link = link_bandwidth(gpu)
    ar_path, sr_path = topology_dir / "all_reduce.csv", topology_dir / "send_recv.csv"
    if ar_path.is_file():
        df = network_frame(ar_path, "all_reduce")
        size, workers, log_y = df["size"].to_numpy(), df["workers"].to_numpy(), np.log(df["t"].to_numpy())

        def residual(v: np.ndarray) -> np.ndarray:
            p = CostParams(allreduce_latency_s=float(v[0]), allreduce_bus_eff=float(v[1]))
            return np.log(allreduce_time(size, workers, link, p)) - log_y

        sol = solve(residual, [_overhead("allreduce_latency_s", 2e-5), _eff("allreduce_bus_eff", 0.3)],
                    objective)
        latency, eff = sol.values["allreduce_latency_s"], sol.values["allreduce_bus_eff"]
        stats, source, path = sol.stats, "all_reduce", ar_path
    elif sr_path.is_file():
        df = network_frame(sr_path, "send_recv")
        size, log_y = df["size"].to_numpy(), np.log(df["t"].to_numpy())
        max_gbps = EFF_RANGE[1] * link / 1e9  # the bus efficiency's range, in GB/s

        def residual(v: np.ndarray) -> np.ndarray:
            return np.log(v[0] + size / (1e9 * v[1])) - log_y  # v[1]: GB/s

        min_gbps = EFF_RANGE[0] * link / 1e9
        p2p = [_overhead("p2p_latency_s", 1e-5),
               Param("p2p_gbps", min(10.0, max_gbps / 2), min_gbps, max_gbps)]
        sol = solve(residual, p2p, objective)
        latency, eff = 2 * sol.values["p2p_latency_s"], 1e9 * sol.values["p2p_gbps"] / link
        a, b = sol.stats["p2p_latency_s"], sol.stats["p2p_gbps"]
        stats = {"allreduce_latency_s": _scaled(a, 2.0), "allreduce_bus_eff": _scaled(b, 1e9 / link)}
        source, path = "send_recv (ring model)", sr_path
    else:
        raise ConfigError(f"{topology_dir}: neither all_reduce.csv nor send_recv.csv")
    latency, eff = round_sig(latency), round_sig(eff)
    mape: dict[int, float] = {}
    if ar_path.is_file():
        df = network_frame(ar_path, "all_reduce")
        p = CostParams(allreduce_latency_s=latency, allreduce_bus_eff=eff)
        ape = np.abs(allreduce_time(df["size"], df["workers"], link, p) / df["t"].to_numpy() - 1)
        for w in sorted(df["workers"].unique()):
            mape[int(w)] = float(100 * ape[df["workers"].to_numpy() == w].mean())
    return NetworkFit(latency, eff, source, path, mape, stats)
