"""The requests a run replays: from a trace or the synthetic generators, then transformed."""

from __future__ import annotations

import numpy as np

from simulator.config.workload import WorkloadConfig
from simulator.workload import traces
from simulator.workload.generators import RequestArrays, _synthetic


def generate(cfg: WorkloadConfig, seed_seq: np.random.SeedSequence) -> RequestArrays:
    """Steps: 1. requests from the trace (simulator/workload/traces.py) or the synthetic generators;
    2. transforms in config order (window, num_requests, sample_n, rate scaling, clipping);
    3. arrivals shifted so that the first request arrives at t=0."""
    if cfg.trace is not None:
        return traces.load_workload(cfg, seed_seq)
    # spawn() is stateful: the synthetic part takes its children first (first version's order).
    work = _synthetic(cfg, seed_seq)
    return traces.apply_transforms(work, cfg, seed_seq.spawn(1)[0])
