"""GPU data folders, end to end: read every model, fit compute (the GEMMs of all folders
together, so the tile-choice exponent they share is fitted on every GPU's data), attention and
all-reduce parameters, and score the fit (in-sample per operator, leave-one-model-out,
leave-one-GPU-out).

Invariant: `fit_gpus` reads and fits; it writes nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from simulator.calibration.data import (
    DataFolder,
    ModelTimings,
    model_dirs,
    read_attention_csv,
    read_mlp_csv,
    resolve_folder,
)
from simulator.calibration.fit import (
    SHARED_PARAMS,
    NetworkFit,
    derive_attention,
    fit_attention,
    fit_compute,
    fit_compute_joint,
    fit_network,
)
from simulator.calibration.score import (
    ErrorStats,
    Residuals,
    in_sample,
    leave_one_gpu_out,
    leave_one_model_out,
    leave_one_model_out_joint,
    op_errors,
    predict_layer_sum,
)
from simulator.calibration.solve import ParamStat
from simulator.calibration.transfer import transfer_params
from simulator.engine.costmodel import CostParams, link_bandwidth
from simulator.errors import ConfigError, did_you_mean
from simulator.hardware.gpus import GpuSpec, get_gpu


@dataclass(frozen=True)
class FolderData:
    """One data folder read: which GPU it measured, its models and attention timings."""

    folder: str
    known: DataFolder
    gpu: GpuSpec
    base: CostParams  # the GPU's current parameters (defaults without a calibration section)
    models: list[ModelTimings]
    attention: list[pd.DataFrame]
    label: str


@dataclass(frozen=True)
class GpuFit:
    folder: str
    gpu: GpuSpec
    params: CostParams
    models: list[ModelTimings]
    errors: dict[str, ErrorStats]
    lomo: dict[str, ErrorStats]  # by held-out model
    network: NetworkFit | None
    attention_measured: bool
    data_label: str
    folder_reason: str
    dataset: str  # the data set's name, for people (DataFolder.dataset)
    stats: dict[str, ParamStat]  # fitted parameter -> standard error / bound flag
    notes: list[str] = field(default_factory=list)
    shared_with: tuple[str, ...] = ()  # GPUs whose data fitted SHARED_PARAMS jointly (empty: held fixed)
    residuals: Residuals | None = None  # in-sample, per-layer op sum
    lomo_residuals: Residuals | None = None
    logo: Residuals | None = None  # this GPU predicted from the others' fit through its datasheet


def label(path: Path) -> str:
    """A path as the user would type it from the current directory (no absolute home paths)."""
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def load_folder(profiles: Path, name: str, target: GpuSpec | None = None) -> FolderData:
    """Steps: 1. resolve the folder to a catalogue GPU (KNOWN_FOLDERS, else the folder's own
    name); 2. read every model's mlp.csv (and attention.csv if present)."""
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
    return FolderData(folder, known, gpu, base, models, attn_frames, label(profiles / "compute" / folder))


def fit_gpus(profiles: str | Path, names: list[str], *, target: GpuSpec | None = None, lomo: bool = True,
             logo: bool = True) -> list[GpuFit]:
    """Fit GPU folders. Steps:
    1. read each folder (`load_folder`);
    2. GEMM and element-wise parameters: with two or more folders, every folder's GEMMs together
       (each GPU its own efficiencies and tile costs; the tile-choice exponent and the element-wise row rates,
       SHARED_PARAMS, fitted once for all); one folder alone keeps SHARED_PARAMS at its
       profile's values (a new GPU joins the kernels' costs fitted on the others);
    3. attention: fit if measured, else derive from the GEMM fit;
    4. all-reduce from the folder's network topology, if any (else keep the GPU's current values);
    5. score: in-sample per-op errors, leave-one-model-out of the per-layer op sum (refitting as
       in step 2 without the model), and with two or more folders leave-one-GPU-out."""
    profiles = Path(profiles)
    data = [load_folder(profiles, n, target) for n in names]
    names_seen = [d.gpu.name for d in data]
    if len(set(names_seen)) != len(names_seen):
        raise ConfigError(f"two data folders measure the same GPU: {', '.join(names_seen)}")
    folders = [(d.models, d.gpu, d.base) for d in data]
    joint = len(data) > 1
    start = None
    if joint:
        full = fit_compute_joint(folders)
        compute, start = full.by_gpu, full.solution
    else:
        compute = {data[0].gpu.name: fit_compute(data[0].models, data[0].gpu, data[0].base)}
    if not lomo:
        lomo_res: dict[str, Residuals] = {}
    elif joint:
        lomo_res = leave_one_model_out_joint(folders, start=start)
    else:
        single = leave_one_model_out(data[0].models, data[0].gpu, data[0].base)
        lomo_res = {data[0].gpu.name: single} if single is not None else {}
    logo_res = leave_one_gpu_out(folders, transfer_params, start=start) if joint and logo else {}
    out = []
    for d in data:
        fitted = compute[d.gpu.name]
        fitted = (fit_attention(d.attention, d.gpu, fitted) if d.attention
                  else derive_attention(fitted))
        params, stats = fitted.params, dict(fitted.stats)
        notes = []
        network = None
        if d.known.network and (profiles / "network" / d.known.network).is_dir():
            network = fit_network(profiles / "network" / d.known.network, d.gpu)  # least squares
            params = replace(params, allreduce_latency_s=network.latency_s,
                             allreduce_bus_eff=network.bus_eff)
            stats.update(network.stats)
            bus_gbps = network.bus_eff * link_bandwidth(d.gpu) / 1e9
            if bus_gbps < d.gpu.host_link_gbps:
                notes.append(f"measured {network.source} bus bandwidth {bus_gbps:.3g} GB/s is below the "
                             f"host link's {d.gpu.host_link_gbps:g} GB/s: the profiled machine's GPUs "
                             f"apparently had no fast peer-to-peer path; kept as measured")
        else:
            notes.append("no network measurements: all-reduce parameters kept from the current profile")
        if not joint:
            stats = {k: v for k, v in stats.items() if k not in SHARED_PARAMS}
        held = lomo_res.get(d.gpu.name)
        out.append(GpuFit(d.folder, d.gpu, params, d.models, op_errors(d.models, d.gpu, params),
                          held.by_model() if held is not None else {}, network, bool(d.attention),
                          d.label, d.known.reason, d.known.dataset, stats, notes,
                          tuple(names_seen) if joint else (), in_sample(d.models, d.gpu, params), held,
                          logo_res.get(d.gpu.name)))
    return out


def fit_gpu(profiles: str | Path, name: str, *, target: GpuSpec | None = None,
            lomo: bool = True) -> GpuFit:
    """One folder alone (`fit_gpus` with one name: the shared tile-choice exponent held at the profile's)."""
    return fit_gpus(profiles, [name], target=target, lomo=lomo)[0]


def run_holdout(profiles: str | Path, names: list[str], what: str) -> tuple[str, dict[str, Residuals]]:
    """One held-out check, as `kvsim calibrate --holdout` runs it. Steps:
    1. read the folders;
    2. `what` names a GPU (folder or catalogue name): fit every other folder together and
       predict it through its datasheet (`leave_one_gpu_out`, needs two or more folders);
    3. else `what` names a model (its directory "org/name" or just "name", any case): refit
       without it and predict it on every GPU that measured it;
    4. else a one-line error listing the GPUs and models there are.
    Returns (what was held out, residuals by GPU)."""
    profiles = Path(profiles)
    data = [load_folder(profiles, n) for n in names]
    folders = [(d.models, d.gpu, d.base) for d in data]
    by_gpu = {d.folder: d.gpu.name for d in data} | {d.gpu.name: d.gpu.name for d in data}
    try:
        gpu_name = by_gpu.get(what) or by_gpu.get(get_gpu(what).name)
    except ConfigError:
        gpu_name = None
    if gpu_name is not None:
        if len(data) < 2:
            raise ConfigError(f"--holdout {what}: leave-one-GPU-out needs measurements of two or more "
                              f"GPUs (drop --gpu)")
        others = ", ".join(sorted({g for g in by_gpu.values() if g != gpu_name}))
        return (f"leave-one-GPU-out ({gpu_name} predicted from {others} through its datasheet)",
                leave_one_gpu_out(folders, transfer_params, only=gpu_name))
    models = sorted({m.name for d in data for m in d.models})
    key = what.lower()
    match = [m for m in models if m.lower() == key or m.split("/")[-1].lower() == key]
    if not match:
        choices = sorted(set(by_gpu.values())) + models
        raise ConfigError(f"--holdout {what!r}: not a measured GPU or model{did_you_mean(what, choices)}; "
                          f"GPUs: {', '.join(sorted(set(by_gpu.values())))}; models: {', '.join(models)}")
    held = match[0]
    if len(data) > 1:
        res = leave_one_model_out_joint(folders, only=lambda g, m: m == held)
    else:
        d = data[0]
        rest = [m for m in d.models if m.name != held]
        if not rest:
            raise ConfigError(f"--holdout {what}: {d.gpu.name} has no other model to fit on")
        p = fit_compute(rest, d.gpu, d.base).params
        res = {d.gpu.name: Residuals.concat([Residuals.of(m, predict_layer_sum(m, d.gpu, p))
                                             for m in d.models if m.name == held])}
    return f"leave-one-model-out ({held} held out, refit on the rest)", res
