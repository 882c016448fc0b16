"""Workload section of the configuration (`workload:` in YAML), validated once.

Kept apart from config.py so that workload features grow here without touching engine config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.errors import ConfigError


def positive_int(section: str, name: str, value: Any, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{section}.{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """Synthetic traffic (first version): an arrival process and two length distributions.

    Exactly one of num_requests / duration_s bounds the run (num_requests wins if both set).
    Lengths are either two distributions or `lengths_file` (a CSV sampled row-wise, so that
    prompt and output lengths keep their joint distribution).
    """

    num_requests: int | None = 1000
    duration_s: float | None = None
    arrival: dict[str, Any] = field(default_factory=lambda: {"process": "poisson", "rate": 20.0})
    # ShareGPT means (OPT tokenizer) from PagedAttention, ../shared/REFERENCE.md; the CV of 1.0
    # is an assumption (heavy-tailed lengths), clipped to [1, 2048].
    prompt_tokens: dict[str, Any] = field(default_factory=lambda: {
        "dist": "lognormal", "mean": 161.31, "cv": 1.0, "min": 1, "max": 2048})
    output_tokens: dict[str, Any] = field(default_factory=lambda: {
        "dist": "lognormal", "mean": 337.99, "cv": 1.0, "min": 1, "max": 2048})
    lengths_file: str | None = None
    prompt_column: str = "num_prefill_tokens"
    output_column: str = "num_decode_tokens"

    def __post_init__(self) -> None:
        positive_int("workload", "num_requests", self.num_requests, allow_none=True)
        if self.duration_s is not None and not (isinstance(self.duration_s, (int, float))
                                                and self.duration_s > 0):
            raise ConfigError(f"workload.duration_s must be > 0, got {self.duration_s!r}")
        if self.num_requests is None and self.duration_s is None:
            raise ConfigError("workload: set num_requests or duration_s")
