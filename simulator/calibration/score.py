"""Scoring a fit: predicted per-operator times for the measured rows, absolute percentage errors,
and the leave-one-model-out check (fit without model M, predict M's per-layer op sum).

Invariant: a prediction is the cost model's own `op_times`, evaluated at the data's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.calibration.data import ALL_OPS, ModelTimings
from simulator.calibration.fit import fit_compute
from simulator.calibration.solve import LEAST_SQUARES, Objective
from simulator.engine.costmodel import CostParams, op_times
from simulator.hardware.gpus import GpuSpec


def predict_ops(m: ModelTimings, gpu: GpuSpec, p: CostParams) -> dict[str, np.ndarray]:
    return op_times(m.dims, m.tokens, gpu.peak_flops(2), gpu.hbm_bandwidth_gbps * 1e9, p)


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
            apes.setdefault(op, []).append(ape(pred[op], m.ops[op]))
        apes.setdefault("layer", []).append(ape(predict_layer_sum(m, gpu, p), m.layer_sum()))
    order = [op for op in (*ALL_OPS, "layer") if op in apes]
    return {op: ErrorStats.of(np.concatenate(apes[op])) for op in order}


def leave_one_model_out(models: list[ModelTimings], gpu: GpuSpec, base: CostParams,
                        objective: Objective = LEAST_SQUARES) -> dict[str, ErrorStats]:
    """For each model M: fit on the others, score M's per-layer op sum (every token and TP row)."""
    out = {}
    if len(models) < 2:
        return out
    for held in models:
        p = fit_compute([m for m in models if m is not held], gpu, base, objective).params
        out[held.name] = ErrorStats.of(ape(predict_layer_sum(held, gpu, p), held.layer_sum()))
    return out
