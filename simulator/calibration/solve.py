"""Bounded nonlinear least squares for the calibration fits, with each parameter's standard error.

A thin layer over `scipy.optimize.least_squares` (trust-region reflective, finite-difference
Jacobian). Each parameter is named and bounded by its physical range (`Param`); positive scale
parameters (efficiencies, overheads, bandwidths) are solved for in log space, so a 3e-6 s
overhead and a 0.8 efficiency are equally well conditioned and the steps are relative.

Standard errors come from the Jacobian at the optimum, in the parameters' own units:
cov = inv(J^T J) * s^2, s^2 = sum(r^2) / (m - k) over the m residuals and the k parameters not
on a bound (a parameter on a bound has no standard error: it is reported as `at_bound`).

NOTE: the residuals of one fit are not independent (rows of one model share its kernels' quirks),
so these standard errors measure how well the data pin a parameter down *given the form*, not
the model's error; the leave-one-model-out check (score.py) is the honest error figure.

Invariants: deterministic (no RNG); `solve`'s default loss "linear" is plain least squares (the
one robust loss the committed fits use is the GEMM tile step's, fit.GEMM_TILE_LOSS); each
parameter's stat records the loss it was fitted under.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from simulator.errors import ConfigError

LOSSES = ("linear", "soft_l1", "huber", "cauchy", "arctan")


@dataclass(frozen=True)
class Objective:
    """The fit's loss on the log-ratio residuals: "linear" (least squares) or a robust loss of
    scipy.optimize.least_squares, which treats residuals beyond about `f_scale` as outliers
    (0.1 ~ 10 % off)."""

    loss: str = "linear"
    f_scale: float = 0.1

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ConfigError(f"calibration loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if not (math.isfinite(self.f_scale) and self.f_scale > 0):
            raise ConfigError(f"calibration f_scale must be a number > 0, got {self.f_scale!r}")

    def describe(self) -> str:
        return "linear loss" if self.loss == "linear" else f"{self.loss} loss, f_scale {self.f_scale:g}"


LEAST_SQUARES = Objective()


@dataclass(frozen=True)
class Param:
    """One parameter to fit: start value and physical range [lower, upper], in its own units."""

    name: str
    start: float
    lower: float
    upper: float
    log: bool = True  # solve for log(value); needs lower > 0


@dataclass(frozen=True)
class ParamStat:
    """A fitted parameter's standard error (None on a bound, or when the data cannot pin it down),
    the residual degrees of freedom its t-interval uses and the loss it was fitted under."""

    std_error: float | None
    at_bound: str | None  # "lower" or "upper" when the optimum sits on that bound
    bound: float | None  # that bound's value
    dof: int
    loss: Objective = LEAST_SQUARES


@dataclass(frozen=True)
class Solution:
    values: dict[str, float]
    stats: dict[str, ParamStat]
    cost: float  # sum of squared residuals at the optimum


def solve(residual: Callable[[np.ndarray], np.ndarray], params: Sequence[Param],
          objective: Objective = LEAST_SQUARES) -> Solution:
    """Minimise the objective of residual(values) over the parameters' bounds. Steps:
    1. map start values and bounds into solver space (log for `log` parameters);
    2. scipy.optimize.least_squares (method "trf", tight tolerances);
    3. map back; flag parameters on a bound (the solver's active set);
    4. standard errors of the free ones from the Jacobian in the parameters' own units."""
    from scipy.optimize import least_squares

    # 1. solver space
    for p in params:
        if not p.lower <= p.start <= p.upper or (p.log and p.lower <= 0):
            raise ValueError(f"parameter {p.name}: start {p.start} outside ({p.lower}, {p.upper}]")
    to_solver = [math.log if p.log else float for p in params]
    x0 = np.array([f(p.start) for f, p in zip(to_solver, params)])
    lower = np.array([f(p.lower) for f, p in zip(to_solver, params)])
    upper = np.array([f(p.upper) for f, p in zip(to_solver, params)])
    is_log = np.array([p.log for p in params])

    def values_of(x: np.ndarray) -> np.ndarray:
        return np.where(is_log, np.exp(np.where(is_log, x, 0.0)), x)

    def fun(x: np.ndarray) -> np.ndarray:
        return residual(values_of(x))

    # 2. fit
    result = least_squares(fun, x0, bounds=(lower, upper), method="trf", loss=objective.loss,
                           f_scale=objective.f_scale, xtol=1e-12, ftol=1e-12, gtol=1e-12, max_nfev=2000)
    # 3. back to the parameters' units
    values = values_of(result.x)
    r = result.fun
    active = np.asarray(result.active_mask)
    # 4. d residual / d value = d residual / d x * dx / d value (1 / value in log space)
    jac = result.jac / np.where(is_log, values, 1.0)
    free = active == 0
    dof = int(r.size - free.sum())
    std = _std_errors(jac[:, free], float(r @ r), dof)
    stats, k = {}, 0
    for i, p in enumerate(params):
        if free[i]:
            stats[p.name] = ParamStat(std[k], None, None, dof, objective)
            k += 1
        else:
            side = "lower" if active[i] < 0 else "upper"
            stats[p.name] = ParamStat(None, side, p.lower if side == "lower" else p.upper, dof, objective)
    return Solution({p.name: float(v) for p, v in zip(params, values)}, stats, float(r @ r))


def _std_errors(jac: np.ndarray, sum_sq: float, dof: int) -> list[float | None]:
    """sqrt(diag(inv(J^T J)) * s^2), through the SVD of J (as scipy's curve_fit does); None for a
    direction the data do not determine (rank-deficient J) or with no residual degrees of freedom."""
    k = jac.shape[1]
    if k == 0:
        return []
    if dof <= 0:
        return [None] * k
    _, s, vt = np.linalg.svd(jac, full_matrices=False)
    keep = s > np.finfo(float).eps * max(jac.shape) * (s[0] if s.size else 0.0)
    if not keep.all():
        return [None] * k
    cov = (vt.T / s**2) @ vt * (sum_sq / dof)
    return [float(math.sqrt(c)) for c in np.diag(cov)]


def t_interval(value: float, stat: ParamStat, level: float = 0.95) -> tuple[float, float] | None:
    """Two-sided Student t interval value +- t_{(1+level)/2, dof} * std_error (None without one)."""
    if stat.std_error is None:
        return None
    from scipy.stats import t

    half = float(t.ppf(0.5 + level / 2, stat.dof)) * stat.std_error
    return value - half, value + half
