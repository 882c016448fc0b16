"""Scoring a fit: predicted per-operator times for the measured rows, absolute percentage errors,
and the held-out checks: leave-one-model-out (fit without model M, predict M's per-layer op sum)
and leave-one-GPU-out (fit on the other GPUs, predict this one through its datasheet figures).

Invariant: a prediction is the cost model's own `op_times`, evaluated at the data's shapes; a
held-out row's prediction comes from parameters fitted without that row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator.calibration.data import ALL_OPS, ModelTimings
from simulator.calibration.fit import fit_compute, fit_compute_joint
from simulator.engine.costmodel import Chip, CostParams, op_times
from simulator.hardware.gpus import GpuSpec

# Token-count bands of the error tables and the residual plot: decode (1), small decode
# batches, many-request decode / small prefill chunks, the ridge region, prefill chunks, long
# prefills. (lower, upper) inclusive; None = no upper bound.
TOKEN_BANDS = ((1, 1), (2, 16), (17, 128), (129, 512), (513, 2048), (2049, None))


def band_label(band: tuple[int, int | None]) -> str:
    lo, hi = band
    return f"T = {lo}" if lo == hi else f"> {lo - 1}" if hi is None else f"{lo}-{hi}"


def predict_ops(m: ModelTimings, gpu: GpuSpec, p: CostParams) -> dict[str, np.ndarray]:
    return op_times(m.dims, m.tokens, Chip.of(gpu), p)


def predict_layer_sum(m: ModelTimings, gpu: GpuSpec, p: CostParams) -> np.ndarray:
    pred = predict_ops(m, gpu, p)
    return sum((pred[op] for op in m.layer_ops()), np.zeros(len(m.tokens)))


def ape(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    keep = ~np.isnan(meas)
    return np.abs(pred[keep] / meas[keep] - 1.0)


@dataclass(frozen=True)
class ErrorStats:
    mape_pct: float
    p95_pct: float
    max_pct: float
    rows: int
    bias_pct: float = 0.0  # mean signed error (predicted / measured - 1), when known

    @classmethod
    def of(cls, ape: np.ndarray, signed: np.ndarray | None = None) -> ErrorStats:
        return cls(float(100 * ape.mean()), float(100 * np.quantile(ape, 0.95)), float(100 * ape.max()),
                   int(ape.size), float(100 * signed.mean()) if signed is not None else 0.0)


@dataclass(frozen=True)
class Residuals:
    """Per-row relative errors (predicted / measured - 1) of the per-layer op sum, with each
    row's model, token count and TP degree: what the held-out tables and the plot summarise."""

    model: np.ndarray  # model name per row
    tokens: np.ndarray
    tp: np.ndarray
    ratio: np.ndarray

    @classmethod
    def of(cls, m: ModelTimings, pred: np.ndarray) -> Residuals:
        y = m.layer_sum()
        keep = ~np.isnan(y)
        return cls(np.full(int(keep.sum()), m.name, dtype=object), m.tokens[keep], m.tp[keep],
                   pred[keep] / y[keep] - 1.0)

    @classmethod
    def concat(cls, parts: list[Residuals]) -> Residuals:
        return cls(*(np.concatenate([getattr(r, f) for r in parts])
                     for f in ("model", "tokens", "tp", "ratio")))

    def stats(self, mask: np.ndarray | None = None) -> ErrorStats:
        r = self.ratio if mask is None else self.ratio[mask]
        return ErrorStats.of(np.abs(r), r)

    def by_model(self) -> dict[str, ErrorStats]:
        order = list(dict.fromkeys(self.model.tolist()))
        return {name: self.stats(self.model == name) for name in order}

    def by_band(self) -> dict[str, ErrorStats]:
        out = {}
        for band in TOKEN_BANDS:
            lo, hi = band
            mask = (self.tokens >= lo) & (self.tokens <= (hi if hi is not None else np.inf))
            if mask.any():
                out[band_label(band)] = self.stats(mask)
        return out


def op_errors(models: list[ModelTimings], gpu: GpuSpec, p: CostParams) -> dict[str, ErrorStats]:
    """In-sample error per operator and of the per-layer sum ('layer')."""
    apes: dict[str, list[np.ndarray]] = {}
    for m in models:
        pred = predict_ops(m, gpu, p)
        for op in m.ops:
            apes.setdefault(op, []).append(ape(pred[op], m.ops[op]))
        apes.setdefault("layer", []).append(ape(predict_layer_sum(m, gpu, p), m.layer_sum()))
    order = [op for op in (*ALL_OPS, "layer") if op in apes]
    return {op: ErrorStats.of(np.concatenate(apes[op])) for op in order}


def in_sample(models: list[ModelTimings], gpu: GpuSpec, p: CostParams) -> Residuals:
    return Residuals.concat([Residuals.of(m, predict_layer_sum(m, gpu, p)) for m in models])


Folder = tuple[list[ModelTimings], GpuSpec, CostParams]  # models, GPU, base parameters


def leave_one_model_out(models: list[ModelTimings], gpu: GpuSpec, base: CostParams) -> Residuals | None:
    """One GPU, shared tile-choice exponent held at the base's values: for each model M, fit on the others
    and predict M's per-layer op sum (every token and TP row). None with one model."""
    if len(models) < 2:
        return None
    parts = []
    for held in models:
        p = fit_compute([m for m in models if m is not held], gpu, base).params
        parts.append(Residuals.of(held, predict_layer_sum(held, gpu, p)))
    return Residuals.concat(parts)


def leave_one_model_out_joint(folders: list[Folder], only: Callable[[str, str], bool] | None = None,
                              start: dict[str, float] | None = None) -> dict[str, Residuals]:
    """Every GPU fitted together (shared tile-choice exponent fitted too): for each GPU g and model M of g
    (with `only(gpu, model)` true), refit everything without (g, M), predict M on g. Keyed by GPU
    name; a GPU with one model has no entry. `start`: the full fit's GEMM solution (warm start)."""
    out: dict[str, list[Residuals]] = {}
    for i, (models, gpu, _) in enumerate(folders):
        if len(models) < 2:
            continue
        for held in models:
            if only is not None and not only(gpu.name, held.name):
                continue
            rest = [(ms, g, b) if j != i else ([m for m in ms if m is not held], g, b)
                    for j, (ms, g, b) in enumerate(folders)]
            p = fit_compute_joint(rest, start).by_gpu[gpu.name].params
            out.setdefault(gpu.name, []).append(Residuals.of(held, predict_layer_sum(held, gpu, p)))
    return {g: Residuals.concat(parts) for g, parts in out.items()}


def leave_one_gpu_out(folders: list[Folder], transfer: Callable[[GpuSpec, dict[str, CostParams]], CostParams],
                      only: str | None = None, start: dict[str, float] | None = None) -> dict[str, Residuals]:
    """For each GPU g (or only the one named): fit every other GPU together, take g's parameters
    from them through `transfer(g, fitted params by GPU)` (what an extrapolated profile gets),
    predict every model of g on g's datasheet figures. Needs at least two GPUs."""
    out = {}
    if len(folders) < 2:
        return out
    for i, (models, gpu, _) in enumerate(folders):
        if only is not None and gpu.name != only:
            continue
        rest = [f for j, f in enumerate(folders) if j != i]
        fitted = {name: f.params for name, f in fit_compute_joint(rest, start).by_gpu.items()}
        p = transfer(gpu, fitted)
        out[gpu.name] = Residuals.concat([Residuals.of(m, predict_layer_sum(m, gpu, p)) for m in models])
    return out
