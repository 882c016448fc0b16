"""Fitting the cost model's parameters (`CostParams`) to measured kernel timings, one operator
kind at a time: GEMMs (soft roofline), element-wise kernels, attention, and the TP all-reduce.

The fitted forms are the cost model's own (simulator/engine/costmodel.py, docstring items 1-4), so
the simulator predicts exactly what was scored here. Parameters are fractions of the datasheet
peak FLOP/s, memory bandwidth and link bandwidth plus per-kernel overheads in seconds, which is
what lets them transfer to GPUs with no measurements (calibration/transfer.py).

Each fit is a bounded least-squares problem (calibration/solve.py, scipy.optimize.least_squares)
over the parameters' physical ranges (`*_RANGE` below); every fitted parameter comes back with
its standard error, or flagged as sitting on a bound. One step alone uses a robust loss, the
GEMM tile step (`fit_gemm_joint` step 2, GEMM_TILE_LOSS); every other fit is plain least squares.

Invariants: deterministic (no RNG); every residual is log(predicted / measured); fitted values
are rounded to 4 significant digits, so a committed profile holds exactly what was scored.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.calibration.data import STAT, ModelTimings, network_frame
from simulator.calibration.pool import donors, pool_residuals, pool_terms
from simulator.calibration.solve import Objective, Param, ParamStat, Solution, solve
from simulator.engine.costmodel import (
    ATTN_TO_GEMM_COMPUTE,
    ELEMENTWISE_KIND,
    ELEMENTWISE_KINDS,
    Chip,
    CostParams,
    GemmGeometry,
    allreduce_time,
    link_bandwidth,
    main_loop_eff,
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
# The GEMM parameters: per GPU (weight streaming; tensor-core efficiency, memory/compute overlap,
# and the SM's per-tile costs: operand feed and tile setup) and shared by every GPU fitted
# together (the library's tile choice).
# NOTE: the feed cost r is per GPU because it is the SM's tensor rate over its shared-memory
# rate, a property of the chip: per SM and clock A100 does 2,048 dense fp16 flops, A40 (GA102)
# 1,024 and H100 4,096 (wgmma), against 128 B/clock of shared memory on all three, so one byte
# fed costs A40 half and H100 twice A100's flops (fitted: 0.35x and 5.3x, gpu_profiles/; the
# per-SM rates: the GA102, A100 and H100 architecture whitepapers; 32 banks x 4 B of shared
# memory per clock: the CUDA C++ programming guide).
# The tile setup k0 (pipeline fill, epilogue) is per GPU for a like reason: the epilogue stores
# the output tile at memory speed, so counted in K-steps of tensor work it grows with the chip's
# peak / bandwidth (A100 153, A40 215, H100 295 flop/B: peak_tflops.fp16 / hbm_bandwidth_gbps of
# gpu_profiles/; fitted k0 orders the same way).
GEMM_MEMORY = ("gemm_overhead_s", "gemm_bandwidth_eff")
GEMM_PER_GPU = ("gemm_compute_eff", "gemm_overlap_exp", "gemm_feed_flop_per_byte", "gemm_tile_setup_k")
GEMM_SHARED = ("gemm_select_exp",)
FEED_RANGE = (1e-3, 1e3)  # flop-equivalents per operand byte: 0 (free) .. far beyond any SM
SETUP_K_RANGE = (1e-1, 1e4)  # K-elements of per-tile prologue/epilogue: ~0 .. longer than any K here
SELECT_EXP_RANGE = (1.0, 999.0)  # tile-choice weights (t_min/t_i)^q: 1 = a broad blend .. the plain min


def _gemm_param(name: str, start: float) -> Param:
    """A GEMM parameter with its physical range; `name` may carry a "<gpu>:" prefix."""
    kind = name.rpartition(":")[2]
    if kind == "gemm_overlap_exp":
        return Param(name, start, *OVERLAP_EXP_RANGE, log=False)
    if kind == "gemm_feed_flop_per_byte":
        return Param(name, start, *FEED_RANGE)
    if kind == "gemm_tile_setup_k":
        return Param(name, start, *SETUP_K_RANGE)
    if kind == "gemm_select_exp":
        return Param(name, start, *SELECT_EXP_RANGE)
    return _overhead(name, start) if kind.endswith("_s") else _eff(name, start)


# The GEMM tile step's loss (`fit_gemm_joint` step 2; every other fit is least squares): soft-l1
# with f_scale 0.05 ~ quadratic for residuals within ~5 % (the per-model systematic scale,
# pool.py's MODEL_SCALE), ~linear beyond, i.e. close to the mean absolute error the held-out
# targets use; the GEMM rows where the library's tile choice jumps 20-50 % between neighbouring
# token counts (docs/costmodel.md) then pull the tile costs less than a squared loss lets them.
GEMM_TILE_LOSS = Objective("soft_l1", 0.05)

GEMM_STARTS = {"gemm_overhead_s": 3e-6, "gemm_bandwidth_eff": 0.8, "gemm_compute_eff": 0.8,
               "gemm_overlap_exp": 2.0, "gemm_feed_flop_per_byte": 8.0, "gemm_tile_setup_k": 50.0,
               "gemm_select_exp": 10.0}


@dataclass(frozen=True)
class GemmData:
    """One GPU's GEMM rows for the fit: the parameter-free tile geometry of all rows and of the
    bandwidth-bound ones (T <= MEMORY_BOUND_MAX_TOKENS), and log(measured)."""

    gpu: GpuSpec
    base: CostParams
    geometry: GemmGeometry
    small: GemmGeometry
    log_y: np.ndarray
    log_y_small: np.ndarray

    @classmethod
    def of(cls, models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> GemmData:
        t, k, n, y = _gemm_rows(models)
        chip = Chip.of(gpu)
        keep = t <= MEMORY_BOUND_MAX_TOKENS
        return cls(gpu, base, GemmGeometry(t, k, n, 2.0, chip),
                   GemmGeometry(t[keep], k[keep], n[keep], 2.0, chip), np.log(y), np.log(y[keep]))


def _fit_memory(data: GemmData, compute: CostParams) -> Solution | None:
    """Stage 1: gemm_overhead_s and gemm_bandwidth_eff on the bandwidth-bound rows, through the
    full tile model with the compute parameters of `compute` (their share of these rows' time
    is small, padded skinny tiles, but counting it keeps the weight streaming unbiased).
    None with fewer than 3 such rows.
    NOTE: always least squares: a few weight sizes per model timed at 1 us resolution, no tile
    choice to jump between; a soft-l1 loss here put gemm_overhead_s on its lower bound (tried)."""
    if data.log_y_small.size < 3:
        return None

    def residual(v: np.ndarray) -> np.ndarray:
        p = replace(compute, gemm_overhead_s=float(v[0]), gemm_bandwidth_eff=float(v[1]))
        return np.log(data.small.time(p)) - data.log_y_small

    return solve(residual, [_gemm_param(n, GEMM_STARTS[n]) for n in GEMM_MEMORY])


@dataclass(frozen=True)
class GemmFit:
    """The GEMM fit of one or more GPUs: each GPU's parameters (rounded, `round_sig`) with
    their stats, and which parameters were shared."""

    params: dict[str, CostParams]  # by GPU name
    stats: dict[str, dict[str, ParamStat]]
    shared: tuple[str, ...]  # parameter names fitted jointly (empty: held at the base's values)
    solution: dict[str, float]  # step 2's unrounded values ("<gpu>:<param>", shared ones bare)


GEMM_ROUNDS = 2  # stage 1 then 2, twice: round 2's stage 1 sees round 1's compute parameters


def fit_gemm_joint(data: list[GemmData], fit_shared: bool = True,
                   start: dict[str, float] | None = None) -> GemmFit:
    """Fit the GEMM tile model on log(predicted / measured) over one or more GPUs. Steps:
    1. per GPU, on its bandwidth-bound rows (T <= MEMORY_BOUND_MAX_TOKENS): gemm_overhead_s and
       gemm_bandwidth_eff, the achieved weight-streaming rate, with the compute parameters at
       their current values (`_fit_memory`);
    2. all rows of all GPUs together, with those fixed (unrounded), through GEMM_TILE_LOSS
       (soft-l1; the one robust step): GEMM_PER_GPU per GPU, and (fit_shared) GEMM_SHARED, the tile
       choice's exponent, shared by all of them; without fit_shared it keeps each GPU's base value;
    3. once more (GEMM_ROUNDS): step 1 with step 2's compute parameters, step 2 from its last
       solution, so the weight streaming is not biased by the starting compute values (a fit
       of the model's own output recovers its parameters);
    (a GPU with fewer than 3 bandwidth-bound rows fits its stage-1 parameters in step 2).
    The standard errors of step 2 are conditional on step 1's values. `start` (a previous fit's
    `solution`) starts step 2 there instead of at GEMM_STARTS: the held-out refits, which move
    little, converge in a fraction of the evaluations (deterministic either way)."""
    shared = GEMM_SHARED if fit_shared else ()
    compute = {d.gpu.name: replace(d.base, **{p: GEMM_STARTS[p] for p in (*GEMM_PER_GPU, *shared)})
               for d in data}
    values: dict[str, float] = dict(start or {})
    for _ in range(GEMM_ROUNDS):
        # 1. weight streaming, per GPU
        fixed: dict[str, dict[str, float]] = {}
        stats: dict[str, dict[str, ParamStat]] = {}
        free: list[tuple[str | None, str]] = []  # (GPU name or None for shared, parameter)
        for d in data:
            name = d.gpu.name
            mem = _fit_memory(d, compute[name])
            if mem is None:
                fixed[name], stats[name] = {}, {}
                free += [(name, p) for p in GEMM_MEMORY]
            else:
                fixed[name], stats[name] = dict(mem.values), dict(mem.stats)
            free += [(name, p) for p in GEMM_PER_GPU]
        free += [(None, p) for p in shared]
        # fixed starting points (not the profile's current values), so a refit reproduces the profile
        params = [_gemm_param(p if g is None else f"{g}:{p}", GEMM_STARTS[p]) for g, p in free]
        params = [replace(q, start=min(max(values.get(q.name, q.start), q.lower), q.upper)) for q in params]

        def values_of(v: np.ndarray, free=free, fixed=fixed) -> dict[str, CostParams]:
            out = {}
            for d in data:
                own = {p: float(x) for (g, p), x in zip(free, v) if g in (d.gpu.name, None)}
                out[d.gpu.name] = replace(d.base, **fixed[d.gpu.name], **own)
            return out

        # 2. tensor-core efficiency, overlap and SM tile costs per GPU, the tile-choice exponent shared
        def residual(v: np.ndarray, values_of=values_of) -> np.ndarray:
            ps = values_of(v)
            return np.concatenate([np.log(d.geometry.time(ps[d.gpu.name])) - d.log_y for d in data])

        sol = solve(residual, params, GEMM_TILE_LOSS)
        values = dict(sol.values)
        compute = values_of(np.array([sol.values[q.name] for q in params]))
    final, out_stats = {}, {}
    for d in data:
        name = d.gpu.name
        own = {p: sol.values[p if g is None else f"{g}:{p}"] for g, p in free if g in (name, None)}
        rounded = {k: round_sig(v) for k, v in {**fixed[name], **own}.items()}
        final[name] = replace(d.base, **rounded)
        out_stats[name] = {**stats[name], **{p: sol.stats[p if g is None else f"{g}:{p}"]
                                             for g, p in free if g in (name, None)}}
    return GemmFit(final, out_stats, shared, values)


def fit_gemm(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> FittedParams:
    """One GPU's GEMM fit with the shared tile-choice exponent held at the base's values (see
    `fit_gemm_joint`)."""
    fit = fit_gemm_joint([GemmData.of(models, gpu, base)], fit_shared=False)
    return FittedParams(fit.params[gpu.name], fit.stats[gpu.name])


ELEMENTWISE_SHARED = tuple(f"{kind}_row_gbps" for kind in ELEMENTWISE_KINDS)
SHARED_PARAMS = GEMM_SHARED + ELEMENTWISE_SHARED  # fitted once on every measured GPU together
ROW_GBPS_RANGE = (1e-2, 1e4)  # one CTA streaming one token row: 10 MB/s .. more than any GPU's HBM
ELEMENTWISE_STARTS = {"overhead_s": 2e-6, "bandwidth_eff": 0.5, "row_gbps": 8.0}


def _elementwise_rows(models: list[ModelTimings], kind: str) -> tuple[np.ndarray, ...] | None:
    """(tokens, elements per token, log measured seconds) of every op of this kind, or None."""
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
        return None
    return np.concatenate(t), np.concatenate(elems), np.log(np.concatenate(y))


def fit_elementwise_joint(folders: list[tuple[list[ModelTimings], GpuSpec, CostParams]],
                          fit_shared: bool = True) -> dict[str, FittedParams]:
    """Fit the element-wise form o + sqrt(stream^2 + row^2) (costmodel item 2), one kind at a
    time, over one or more GPUs: per GPU <kind>_overhead_s and <kind>_bandwidth_eff; shared by
    every GPU (fit_shared) <kind>_row_gbps, the rate at which one CTA streams one token row
    (latency-bound, a property of the kernel, not of the GPU's bandwidth). Without fit_shared
    the row rate keeps each GPU's base value. Least squares (fit_compute_joint's NOTE says why).
    Returns each GPU's parameters by name."""
    out = {gpu.name: FittedParams(base) for _, gpu, base in folders}
    # GPU -> kind -> how many models have an op of that kind (the pooling weight's models)
    models_of = {gpu.name: {kind: sum(any(ELEMENTWISE_KIND.get(op) == kind for op in m.ops) for m in models)
                            for kind in ELEMENTWISE_KINDS} for models, gpu, _ in folders}
    for kind in ELEMENTWISE_KINDS:
        rows = [(gpu, base, _elementwise_rows(models, kind)) for models, gpu, base in folders]
        rows = [(gpu, base, r) for gpu, base, r in rows if r is not None]
        if not rows:
            continue
        names: list[str] = []
        for gpu, _, _ in rows:
            names += [f"{gpu.name}:{kind}_overhead_s", f"{gpu.name}:{kind}_bandwidth_eff"]
        if fit_shared:
            names.append(f"{kind}_row_gbps")
        # each GPU's two parameters pooled toward its donor's (calibration/pool.py)
        terms = pool_terms(names, {gpu.name: (r[2].size, models_of[gpu.name].get(kind, 0))
                                   for gpu, _, r in rows}, donors([gpu for gpu, _, _ in rows]))

        def residual(v: np.ndarray, rows=rows, kind=kind, terms=terms) -> np.ndarray:
            parts = []
            for i, (gpu, base, (tt, ee, log_y)) in enumerate(rows):
                row_gbps = v[-1] if fit_shared else getattr(base, f"{kind}_row_gbps")
                stream = tt * ee * 2.0 / (gpu.hbm_bandwidth_gbps * 1e9 * v[2 * i + 1])
                row = ee * 2.0 / (row_gbps * 1e9)
                parts.append(np.log(v[2 * i] + np.sqrt(stream * stream + row * row)) - log_y)
            parts.append(pool_residuals(v, terms))
            return np.concatenate(parts)

        params = []
        for name in names:
            short = name.rpartition(":")[2].removeprefix(f"{kind}_")
            if short == "row_gbps":
                params.append(Param(name, ELEMENTWISE_STARTS[short], *ROW_GBPS_RANGE))
            elif short == "overhead_s":
                params.append(_overhead(name, ELEMENTWISE_STARTS[short]))
            else:
                params.append(_eff(name, ELEMENTWISE_STARTS[short]))
        sol = solve(residual, params)
        for gpu, _, _ in rows:
            mine = {n.rpartition(":")[2]: n for n in names if n.startswith(f"{gpu.name}:") or ":" not in n}
            vals = {k: round_sig(sol.values[n]) for k, n in mine.items()}
            cur = out[gpu.name]
            out[gpu.name] = FittedParams(replace(cur.params, **vals),
                                         {**cur.stats, **{k: sol.stats[n] for k, n in mine.items()}})
    return out


def fit_elementwise(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> FittedParams:
    """One GPU's element-wise fit, the shared row rates held at the base's values
    (`fit_elementwise_joint`)."""
    return fit_elementwise_joint([(models, gpu, base)], fit_shared=False)[gpu.name]


def derive_attention(fitted: FittedParams) -> FittedParams:
    """Attention parameters from the GEMM fit when attention was not measured (costmodel item 3):
    attn_compute_eff = ATTN_TO_GEMM_COMPUTE x the largest tile's main-loop efficiency
    (`main_loop_eff`; gemm_compute_eff alone is the tensor pipe before the per-GPU feed cost)."""
    p = fitted.params
    derived = replace(p, attn_compute_eff=round_sig(ATTN_TO_GEMM_COMPUTE * main_loop_eff(p)),
                      attn_bandwidth_eff=p.gemm_bandwidth_eff)
    return replace(fitted, params=derived)


def fit_attention(frames: list[pd.DataFrame], gpu: GpuSpec, base: FittedParams) -> FittedParams:
    """Fit attn_{compute_eff, bandwidth_eff, overhead_s} of
    max(flops / (peak * eff_c), bytes / (bw * eff_bw)) + o to measured attention kernels (least
    squares)."""
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
    return base.with_solution(solve(residual, params))


def fit_compute(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> FittedParams:
    """GEMM (shared tile-choice exponent held at the base's values), then element-wise parameters
    (they share no parameter with the GEMMs, so the order is immaterial)."""
    gemm = fit_gemm(models, gpu, base)
    elementwise = fit_elementwise(models, gpu, gemm.params)
    return FittedParams(elementwise.params, {**gemm.stats, **elementwise.stats})


@dataclass(frozen=True)
class JointFit:
    """`fit_compute_joint`'s result: each GPU's compute parameters and the GEMM step-2 solution."""

    by_gpu: dict[str, FittedParams]
    solution: dict[str, float]


def fit_compute_joint(folders: list[tuple[list[ModelTimings], GpuSpec, CostParams]],
                      start: dict[str, float] | None = None) -> JointFit:
    """GEMMs of every GPU together (`fit_gemm_joint`; the shared tile-choice exponent fitted when
    there is more than one GPU), then each GPU's element-wise parameters (least squares)."""
    data = [GemmData.of(models, gpu, base) for models, gpu, base in folders]
    joint = len(data) > 1
    gemm = fit_gemm_joint(data, fit_shared=joint, start=start)
    # NOTE: least squares: a soft-l1 loss on the element-wise fits took every GPU's norm
    # overhead to its lower bound 0 (f_scale 0.05 and 0.1; tried), the row term absorbing it
    ew = fit_elementwise_joint([(models, gpu, gemm.params[gpu.name]) for models, gpu, _ in folders],
                               fit_shared=joint)
    out = {gpu.name: FittedParams(ew[gpu.name].params, {**gemm.stats[gpu.name], **ew[gpu.name].stats})
           for _, gpu, _ in folders}
    return JointFit(out, gemm.solution)


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


def fit_network(topology_dir: Path, gpu: GpuSpec) -> NetworkFit:
    """Steps (least squares): 1. all_reduce.csv (intra-node rows): fit latency and bus efficiency
    of the ring form in costmodel.allreduce_time, on log error; 2. else send_recv.csv: fit a
    point-to-point latency a and bandwidth b; a ring all-reduce is 2(n-1) steps of S/n bytes, i.e.
    bus bandwidth b and, for 2 workers, latency 2a (standard errors scale the same way)."""
    link = link_bandwidth(gpu)
    ar_path, sr_path = topology_dir / "all_reduce.csv", topology_dir / "send_recv.csv"
    if ar_path.is_file():
        df = network_frame(ar_path, "all_reduce")
        size, workers, log_y = df["size"].to_numpy(), df["workers"].to_numpy(), np.log(df["t"].to_numpy())

        def residual(v: np.ndarray) -> np.ndarray:
            p = CostParams(allreduce_latency_s=float(v[0]), allreduce_bus_eff=float(v[1]))
            return np.log(allreduce_time(size, workers, link, p)) - log_y

        sol = solve(residual, [_overhead("allreduce_latency_s", 2e-5), _eff("allreduce_bus_eff", 0.3)])
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
        sol = solve(residual, p2p)
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
