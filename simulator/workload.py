"""Workloads: columnar request arrays (arrival, lengths, priority) built from a seeded generator.

A `RequestArrays` holds one numpy column per field so that a million-request workload is a
few arrays, not a million objects; `Request` objects are made lazily at arrival time.
Registries: `ARRIVALS` (arrival processes) and `LENGTHS` (length distributions), so new kinds
are added as functions, not branches.

Determinism: every stochastic piece draws from its own child of one SeedSequence(seed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator.errors import ConfigError
from simulator.registry import Registry
from simulator.workload_config import WorkloadConfig


@dataclass(slots=True)
class RequestArrays:
    arrival_s: np.ndarray  # float64, non-decreasing
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    priority: np.ndarray  # int64, lower = more urgent (vLLM)
    tenant: np.ndarray | None = None  # object/str, optional
    prefix: list | None = None  # per-request content identity for prefix caching, optional

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "priority"):
            if len(getattr(self, name)) != n:
                raise ConfigError(f"workload: column {name} has {len(getattr(self, name))} rows, "
                                  f"arrival_s has {n}")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ConfigError("workload: arrival times must be non-decreasing")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ConfigError("workload: prompt and output lengths must be >= 1 token")

    def __len__(self) -> int:
        return len(self.arrival_s)


ArrivalFn = Callable[[np.random.Generator, dict[str, Any], int | None, float | None], np.ndarray]
LengthFn = Callable[[np.random.Generator, dict[str, Any], int], np.ndarray]

ARRIVALS: Registry[ArrivalFn] = Registry("arrival process")
LENGTHS: Registry[LengthFn] = Registry("length distribution")


def _param(spec: dict[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    if key not in spec:
        raise ConfigError(f"{where}: missing {key!r}")
    value = spec[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ConfigError(f"{where}.{key} must be a number, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{where}.{key} must be > 0, got {value!r}")
    return float(value)


@ARRIVALS.register("poisson")
def poisson_arrivals(rng: np.random.Generator, spec: dict[str, Any], n: int | None,
                     duration_s: float | None) -> np.ndarray:
    """Exponential inter-arrivals at `rate` req/s, first arrival at t=0."""
    rate = _param(spec, "rate", "workload.arrival")
    if n is None:
        n = int(rate * duration_s * 1.2 + 10 * np.sqrt(rate * duration_s) + 10)
    gaps = rng.exponential(1.0 / rate, size=n)
    gaps[0] = 0.0
    times = np.cumsum(gaps)
    return times if duration_s is None else times[times < duration_s]


@LENGTHS.register("constant")
def constant_lengths(rng, spec, n):
    return np.full(n, _param(spec, "value", "length"), dtype=np.float64)


@LENGTHS.register("uniform")
def uniform_lengths(rng, spec, n):
    low, high = _param(spec, "low", "length"), _param(spec, "high", "length")
    if high < low:
        raise ConfigError(f"uniform length: high ({high}) < low ({low})")
    return rng.integers(int(low), int(high) + 1, size=n).astype(np.float64)


@LENGTHS.register("lognormal")
def lognormal_lengths(rng, spec, n):
    """Lognormal with the given mean and coefficient of variation (std / mean)."""
    mean, cv = _param(spec, "mean", "length"), _param(spec, "cv", "length")
    sigma2 = np.log1p(cv * cv)
    mu = np.log(mean) - sigma2 / 2
    return rng.lognormal(mu, np.sqrt(sigma2), size=n)


def sample_lengths(rng: np.random.Generator, spec: dict[str, Any], n: int, where: str) -> np.ndarray:
    if not isinstance(spec, dict) or "dist" not in spec:
        raise ConfigError(f"{where}: expected a mapping with 'dist' ({', '.join(LENGTHS.names())})")
    values = LENGTHS.get(spec["dist"])(rng, spec, n)
    lo = int(spec.get("min", 1))
    hi = spec.get("max")
    if lo < 1:
        raise ConfigError(f"{where}.min must be >= 1, got {lo}")
    out = np.maximum(np.rint(values), lo)
    if hi is not None:
        if hi < lo:
            raise ConfigError(f"{where}.max ({hi}) < min ({lo})")
        out = np.minimum(out, hi)
    return out.astype(np.int64)


def load_lengths_file(path: str | Path, prompt_col: str, output_col: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"lengths file {path}: not found")
    try:
        df = pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError) as e:
        raise ConfigError(f"lengths file {path}: cannot read as CSV ({e})") from None
    if df.empty:
        raise ConfigError(f"lengths file {path}: no rows")
    out = []
    for col in (prompt_col, output_col):
        if col not in df.columns:
            raise ConfigError(f"lengths file {path}: missing column {col!r}; columns: {list(df.columns)}")
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values) | (values < 1))
        if len(bad):
            row = int(bad[0])
            raise ConfigError(f"lengths file {path}: row {row + 2} column {col!r}: "
                              f"{df[col].iloc[row]!r} is not a length >= 1")
        out.append(values.astype(np.int64))
    return out[0], out[1]


def generate(cfg: WorkloadConfig, seed_seq: np.random.SeedSequence) -> RequestArrays:
    """Steps: 1. arrivals from the arrival process; 2. lengths (two distributions or file rows)."""
    arr_seed, prompt_seed, output_seed = seed_seq.spawn(3)
    spec = dict(cfg.arrival)
    process = spec.get("process", "poisson")
    n = cfg.num_requests
    arrivals = ARRIVALS.get(process)(np.random.default_rng(arr_seed), spec, n,
                                     None if n is not None else cfg.duration_s)
    count = len(arrivals)
    if cfg.lengths_file:
        prompts, outputs = load_lengths_file(cfg.lengths_file, cfg.prompt_column, cfg.output_column)
        rows = np.random.default_rng(prompt_seed).integers(0, len(prompts), size=count)
        prompt, output = prompts[rows], outputs[rows]
    else:
        prompt = sample_lengths(np.random.default_rng(prompt_seed), cfg.prompt_tokens, count,
                                "workload.prompt_tokens")
        output = sample_lengths(np.random.default_rng(output_seed), cfg.output_tokens, count,
                                "workload.output_tokens")
    return RequestArrays(arrivals.astype(np.float64), prompt, output, np.zeros(count, np.int64))
