"""One GPU's data folder, end to end: read every model, fit compute, attention and all-reduce
parameters, and score the fit (in-sample per operator, leave-one-model-out).

Invariant: `fit_gpu` reads and fits; it writes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from simulator.calibration.data import (
    ModelTimings,
    model_dirs,
    read_attention_csv,
    read_mlp_csv,
    resolve_folder,
)
from simulator.calibration.fit import NetworkFit, derive_attention, fit_attention, fit_compute, fit_network
from simulator.calibration.score import ErrorStats, leave_one_model_out, op_errors
from simulator.calibration.solve import LEAST_SQUARES, Objective, ParamStat
from simulator.engine.costmodel import CostParams, link_bandwidth
from simulator.errors import ConfigError
from simulator.hardware.gpus import GpuSpec, get_gpu


@dataclass(frozen=True)
class GpuFit:
    folder: str
    gpu: GpuSpec
    params: CostParams
    models: list[ModelTimings]
    errors: dict[str, ErrorStats]
    lomo: dict[str, ErrorStats]
    network: NetworkFit | None
    attention_measured: bool
    data_label: str
    folder_reason: str
    dataset: str  # the data set's name, for people (DataFolder.dataset)
    stats: dict[str, ParamStat]  # fitted parameter -> standard error / bound flag
    objective: Objective = LEAST_SQUARES
    notes: list[str] = field(default_factory=list)


def label(path: Path) -> str:
    """A path as the user would type it from the current directory (no absolute home paths)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def fit_gpu(profiles: str | Path, name: str, *, target: GpuSpec | None = None,
            lomo: bool = True, objective: Objective = LEAST_SQUARES) -> GpuFit:
    """Fit one GPU folder. Steps:
    1. resolve the folder to a catalogue GPU (KNOWN_FOLDERS, else the folder's own name);
    2. read every model's mlp.csv (and attention.csv if present);
    3. fit GEMM and element-wise parameters on all models together;
    4. attention: fit if measured, else derive from the GEMM fit;
    5. all-reduce from the folder's network topology, if any (else keep the GPU's current values);
    6. score: in-sample per-op errors, leave-one-model-out errors of the per-layer op sum."""
    profiles = Path(profiles)
    folder, known = resolve_folder(profiles, name)
    if target is None and not known.gpu:
        raise ConfigError(f"data folder {folder!r} is not a catalogue GPU; pass --target PROFILE "
                          f"(a GPU name or a profile YAML with its datasheet figures)")
    gpu = target or get_gpu(known.gpu)
    base = CostParams.from_gpu(gpu) if gpu.calibration else CostParams()
    models, attn_frames = [], []
    for model_name, path in model_dirs(profiles / "compute" / folder):
        models.append(read_mlp_csv(path, model_name))
        if (path.parent / "attention.csv").is_file():
            attn_frames.append(read_attention_csv(path.parent / "attention.csv"))
    fitted = fit_compute(models, gpu, base, objective)
    fitted = fit_attention(attn_frames, gpu, fitted, objective) if attn_frames else derive_attention(fitted)
    params, stats = fitted.params, dict(fitted.stats)
    notes = []
    network = None
    if known.network and (profiles / "network" / known.network).is_dir():
        network = fit_network(profiles / "network" / known.network, gpu, objective)
        params = replace(params, allreduce_latency_s=network.latency_s, allreduce_bus_eff=network.bus_eff)
        stats.update(network.stats)
        bus_gbps = network.bus_eff * link_bandwidth(gpu) / 1e9
        if bus_gbps < gpu.host_link_gbps:
            notes.append(f"measured {network.source} bus bandwidth {bus_gbps:.3g} GB/s is below the host "
                         f"link's {gpu.host_link_gbps:g} GB/s: the profiled machine's GPUs apparently had "
                         f"no fast peer-to-peer path; kept as measured")
    else:
        notes.append("no network measurements: all-reduce parameters kept from the current profile")
    return GpuFit(folder, gpu, params, models, op_errors(models, gpu, params),
                  leave_one_model_out(models, gpu, params, objective) if lomo else {}, network,
                  bool(attn_frames), label(profiles / "compute" / folder), known.reason, known.dataset,
                  stats, objective, notes)
