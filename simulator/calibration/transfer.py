"""Transfer to GPUs without measurements: the nearest measured GPU in spec space is the donor of
its fitted per-GPU efficiencies, overheads and SM tile costs (the tile-choice exponent and the
element-wise row rates are shared by every measured GPU already), and each measured GPU's
parameters applied to another measured GPU's specs give the measured price of that
extrapolation. Leave-one-GPU-out (score.py) runs the same transfer.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from simulator.calibration.data import ModelTimings
from simulator.calibration.pool import nearest_donor
from simulator.calibration.score import ErrorStats, ape, predict_layer_sum
from simulator.engine.costmodel import CostParams
from simulator.hardware.gpus import GpuSpec, get_gpu, gpu_names


class Fitted(Protocol):
    """What a transfer needs of a fitted GPU (calibration.gpu_fit.GpuFit has it)."""

    gpu: GpuSpec
    params: CostParams
    models: list[ModelTimings]


def transfer_params(target: GpuSpec, fitted: dict[str, CostParams]) -> CostParams:
    """The parameters an unmeasured GPU gets: its nearest fitted GPU's (fractions of datasheet
    figures, so times scale with the target's own peak, bandwidth and SM count)."""
    donor = nearest_donor(target, [get_gpu(name) for name in fitted])
    return fitted[donor.name]


def transfer_errors(fits: list[Fitted]) -> dict[tuple[str, str], ErrorStats]:
    """(donor, other) -> error of the donor's parameters applied to the other measured GPU's specs:
    the measured price of extrapolating across GPUs (in sample: the donor's fit saw the other's
    GEMMs through the shared tile-choice exponent; leave-one-GPU-out is the held-out figure)."""
    out = {}
    for donor in fits:
        for other in fits:
            if other is donor:
                continue
            apes = [ape(predict_layer_sum(m, other.gpu, donor.params), m.layer_sum()) for m in other.models]
            out[(donor.gpu.name, other.gpu.name)] = ErrorStats.of(np.concatenate(apes))
    return out


def catalogue_gpus() -> list[GpuSpec]:
    seen, out = set(), []
    for name in gpu_names():
        g = get_gpu(name)
        if g.name not in seen:
            seen.add(g.name)
            out.append(g)
    return out
