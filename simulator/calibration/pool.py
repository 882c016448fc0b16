"""Partial pooling of the per-GPU element-wise parameters: a GPU measured on few models borrows
strength from its nearest measured neighbour in spec space.

Each element-wise kind's per-GPU parameters (<kind>_overhead_s, a per-kernel latency, and
<kind>_bandwidth_eff, a fraction of the datasheet bandwidth) have a natural prior: their value on
the nearest other measured GPU, exactly what transfer gives a GPU without measurements
(calibration/transfer.py). The joint element-wise fit adds, for each GPU g and each of them, one
residual

    w_g * (log theta_g - log theta_donor(g)) / tau,      w_g = MODEL_SCALE * sqrt(rows_g / models_g)

- donor(g): the nearest *other* GPU of the fit in (log peak FLOP/s, log memory bandwidth)
  (`spec_distance`), the donor transfer would pick; both ends are free, so the pair is pulled
  together, each end in proportion to how little its own data pin it down.
- tau (`POOL_WIDTH`): the prior's width, in log units, stated below.
- w_g: the rows of one model share its kernels' quirks (phi-2's LayerNorm and GELU are other
  kernels than the Llama family's RMSNorm and SiLU-and-mul), so a GPU's data are worth about one
  observation per model, each with the per-model systematic offset MODEL_SCALE; scaling the
  prior by sqrt(rows per model) puts it on the same footing as the data's sum of squares. A GPU
  with 8 models moves a few percent toward its neighbour, one with 2 (or 1, when a model is held
  out) several times more: H100's element-wise kernels, measured on Llama-2-7B and phi-2 only,
  no longer take phi-2's LayerNorm for the norm of every model.

NOTE: the GEMM per-GPU parameters are not pooled. Tried (same widths): pulling H100's
tensor-core efficiency and overlap toward A100's moved the shared tile costs with them, which cost
A100 and A40 in-sample accuracy (layer sum 3.95 -> 4.07 %) and H100's leave-one-model-out more
than it gained (4.84 % against 4.23 % with the element-wise pooling alone).

Invariant: deterministic; with one GPU in the fit there is no donor and no pooling residual.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.errors import ConfigError
from simulator.hardware.gpus import GpuSpec

# A model's rows share a systematic offset of about the in-sample per-model layer-sum error
# (3-6 % on every measured GPU, docs/costmodel.md "In-sample"), so one model = one observation of
# this scale.
MODEL_SCALE = 0.05
# Prior widths (1 sigma, log units): how far one GPU's value may sit from its spec-space
# neighbour's before the data must say so.
# - bandwidth efficiencies: the same kernel reaches about the same fraction of HBM bandwidth on
#   neighbouring parts (streaming copies 0.8-0.95 on A100 / H100 / H200, ../shared/REFERENCE.md:
#   0.90 on H200), i.e. within ~15 %;
# - per-kernel overheads (launch, prologue, tail): a few microseconds on every generation,
#   within ~30 % of each other.
POOL_WIDTH = {"eff": 0.15, "overhead_s": 0.3}


def pool_width(param: str) -> float:
    """tau of a parameter by its name ("<gpu>:" prefix allowed)."""
    return POOL_WIDTH["overhead_s"] if param.endswith("_s") else POOL_WIDTH["eff"]


def spec_distance(a: GpuSpec, b: GpuSpec) -> float:
    """Distance in (log peak bf16 FLOP/s, log memory bandwidth): the two specs the roofline uses."""
    return math.hypot(math.log(a.peak_flops(2) / b.peak_flops(2)),
                      math.log(a.hbm_bandwidth_gbps / b.hbm_bandwidth_gbps))


def nearest_donor(target: GpuSpec, measured: list[GpuSpec]) -> GpuSpec:
    if not measured:
        raise ConfigError("no measured GPU to transfer parameters from")
    return min(measured, key=lambda g: (spec_distance(target, g), g.name))


def donors(gpus: list[GpuSpec]) -> dict[str, str]:
    """GPU name -> its nearest other GPU of the fit (empty with one GPU)."""
    return {g.name: nearest_donor(g, [o for o in gpus if o.name != g.name]).name
            for g in gpus if len(gpus) > 1}


def pool_weight(rows: int, models: int, param: str) -> float:
    """w_g / tau for one GPU's parameter (module docstring)."""
    return MODEL_SCALE * math.sqrt(rows / max(models, 1)) / pool_width(param)


def pool_terms(free: list[str], by_gpu: dict[str, tuple[int, int]], donor: dict[str, str]
               ) -> list[tuple[int, int, float]]:
    """The pooling residuals over a solver's free parameter names ("<gpu>:<param>"): (index of
    theta_g, index of theta_donor, weight) for every name whose donor's counterpart is free too.
    by_gpu: GPU name -> (rows, models) of the data that fit its parameters."""
    index = {name: i for i, name in enumerate(free)}
    out = []
    for i, name in enumerate(free):
        gpu, sep, param = name.partition(":")
        if not sep or gpu not in donor or gpu not in by_gpu:
            continue
        j = index.get(f"{donor[gpu]}:{param}")
        if j is not None:
            rows, models = by_gpu[gpu]
            out.append((i, j, pool_weight(rows, models, param)))
    return out


def pool_residuals(values: np.ndarray, terms: list[tuple[int, int, float]]) -> np.ndarray:
    """w * (log theta_g - log theta_donor) for each term (all pooled parameters are > 0)."""
    if not terms:
        return np.zeros(0)
    i, j, w = (np.array(c) for c in zip(*terms))
    return w * (np.log(values[i]) - np.log(values[j]))
