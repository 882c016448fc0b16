"""The `calibration:` block of a GPU profile YAML: build it (measured or extrapolated, with
parameters, provenance and error figures) and rewrite it in place.

Invariants: `write_calibration` keeps every other line of the profile (comments included) and
refuses to write a file that would not parse back to the intended mapping.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from simulator import __version__
from simulator.calibration.data import STAT
from simulator.calibration.fit import GEMM_TILE_LOSS, SHARED_PARAMS, round_sig
from simulator.calibration.gpu_fit import GpuFit, label
from simulator.calibration.pool import nearest_donor, spec_distance
from simulator.calibration.score import ErrorStats
from simulator.config.paths import data_dir
from simulator.engine.costmodel import ATTN_TO_GEMM_COMPUTE
from simulator.errors import ConfigError
from simulator.hardware.gpus import GpuSpec


def _r(x: float) -> float:
    return round(x, 2)


ASSUMED = ("per-step host overhead, kernel launches, CUDA graphs and the sampler: costmodel.StepOverhead, "
           "not in the kernel data (constants and their sources in its docstring and docs/costmodel.md)",)


def standard_errors(fit: GpuFit) -> dict[str, Any]:
    """Each fitted parameter's standard error (2 significant digits) and, separately, those that sit
    on a bound of their physical range (no standard error). Shared parameters carry the joint
    fit's standard error (the same on every GPU that shared them)."""
    order = list(fit.params.as_dict())
    stats = sorted(fit.stats.items(), key=lambda kv: order.index(kv[0]))
    out: dict[str, Any] = {
        "method": "1 sigma from the Jacobian at the optimum, cov = inv(J^T J) * residual variance; rows of "
                  "one model are correlated, so these understate the uncertainty (the leave-one-model-out "
                  "error is the honest figure)",
        "params": {name: round_sig(s.std_error, 2) for name, s in stats if s.std_error is not None},
    }
    at_bound = {name: f"{s.at_bound} bound {s.bound:g}" for name, s in stats if s.at_bound}
    if at_bound:
        out["at_bound"] = at_bound
    return out


def measured_section(fit: GpuFit, fit_date: str) -> dict[str, Any]:
    """The `calibration:` mapping written into gpu_profiles/<gpu>.yaml for a measured GPU."""
    not_fitted = list(ASSUMED)
    if not fit.attention_measured:
        not_fitted.insert(0, f"attn_compute_eff = {ATTN_TO_GEMM_COMPUTE} x the 128x256 GEMM tile's main-loop "
                             "efficiency, attn_bandwidth_eff = gemm_bandwidth_eff, attn_overhead_s assumed "
                             "(no attention kernels in the data; costmodel.py docstring item 3)")
    provenance: dict[str, Any] = {
        "dataset": fit.dataset,
        "data": fit.data_label,
        "models": [m.name for m in fit.models],
        "rows": int(sum(len(m.tokens) for m in fit.models)),
        "data_folder_to_gpu": fit.folder_reason,
        "statistic": f"{STAT} of repeated timings (ms -> s), fp16",
        "fit": f"scipy.optimize.least_squares (trf) on log(predicted/measured), {GEMM_TILE_LOSS.describe()} "
               "on the GEMM tile step, linear loss on the weight-streaming (T <= 8), element-wise and "
               "all-reduce rows, parameters bounded by their physical ranges, all models together"
               + ("; each element-wise kind's per-GPU overhead and bandwidth efficiency partially pooled "
                  "toward the nearest other measured GPU's (calibration/pool.py)" if fit.shared_with else ""),
        "shared": (f"{', '.join(SHARED_PARAMS)} fitted jointly on the kernels of {', '.join(fit.shared_with)}"
                   if fit.shared_with else f"{', '.join(SHARED_PARAMS)} held at the profile's values "
                                           f"(fitted jointly on every measured GPU by a full run)"),
        "standard_errors": standard_errors(fit),
        "fit_date": fit_date,
        "fitted_by": f"kvsim calibrate (kvsim {__version__})",
        "not_fitted": not_fitted,
    }
    if fit.network:
        provenance["network"] = f"{label(fit.network.path)} ({fit.network.source}, intra-node rows)"
    if fit.notes:
        provenance["notes"] = list(fit.notes)
    error: dict[str, Any] = {
        "per_op_mape_pct": {op: _r(e.mape_pct) for op, e in fit.errors.items() if op != "layer"},
        "layer_sum_mape_pct": _r(fit.errors["layer"].mape_pct),
        "layer_sum_p95_pct": _r(fit.errors["layer"].p95_pct),
    }
    if fit.lomo:
        error["leave_one_model_out_mape_pct"] = {k: _r(v.mape_pct) for k, v in fit.lomo.items()}
    if fit.lomo_residuals is not None:
        pooled = fit.lomo_residuals.stats()
        error["leave_one_model_out_pooled_pct"] = {"mean": _r(pooled.mape_pct), "p95": _r(pooled.p95_pct),
                                                   "max": _r(pooled.max_pct)}
        error["leave_one_model_out_bias_by_tokens_pct"] = {
            k: _r(v.bias_pct) for k, v in fit.lomo_residuals.by_band().items()}
    if fit.logo is not None:
        logo = fit.logo.stats()
        error["leave_one_gpu_out_pct"] = {"mean": _r(logo.mape_pct), "p95": _r(logo.p95_pct),
                                          "max": _r(logo.max_pct)}
    if fit.network and fit.network.mape_pct:
        error["allreduce_mape_pct_by_workers"] = {k: _r(v) for k, v in fit.network.mape_pct.items()}
    return {"status": "measured", "params": fit.params.as_dict(), "provenance": provenance, "error": error}


def extrapolated_section(target: GpuSpec, fits: list[GpuFit], fit_date: str,
                         transfers: dict[tuple[str, str], ErrorStats]) -> dict[str, Any]:
    """The `calibration:` mapping for a GPU without measurements. Steps:
    1. compute parameters (GEMM, element-wise, attention) from the nearest measured GPU in spec
       space (`transfer_params`), unchanged: they are fractions of the datasheet figures, so
       they scale with this GPU's peak FLOP/s, bandwidth and SM count (the tile-choice exponent is
       shared by every measured GPU anyway);
    2. all-reduce parameters from the nearest measured GPU whose all-reduce was *measured*
       (not derived from send_recv), applied to this GPU's link (its host link when it has no
       GPU link: no PCIe-only all-reduce was measured, so that case is the least certain);
    3. provenance, and as error estimates the leave-one-GPU-out figures (each measured GPU
       predicted from the others' fit by this same transfer) and the donor's in-sample check."""
    donor = next(f for f in fits if f.gpu.name == nearest_donor(target, [f.gpu for f in fits]).name)
    params = donor.params
    measured_net = [f for f in fits if f.network and f.network.source == "all_reduce"]
    net_donor = donor
    if measured_net and donor not in measured_net:
        net_donor = next(f for f in measured_net
                         if f.gpu.name == nearest_donor(target, [g.gpu for g in measured_net]).name)
        params = replace(params, allreduce_latency_s=net_donor.params.allreduce_latency_s,
                         allreduce_bus_eff=net_donor.params.allreduce_bus_eff)
    link = "GPU link" if target.gpu_link_gbps else "host link (no GPU link: PCIe all-reduce not measured)"
    checks = {f"{d} -> {o}": _r(e.mape_pct) for (d, o), e in transfers.items() if d == donor.gpu.name}
    section: dict[str, Any] = {
        "status": "extrapolated",
        "donor": donor.gpu.name,
        "params": params.as_dict(),
        "provenance": {
            "method": "no kernel measurements for this GPU: the donor's fitted efficiencies (fractions of "
                      "datasheet peak FLOP/s, memory and link bandwidth) and overheads applied to this "
                      "GPU's datasheet figures and SM count; donor = nearest measured GPU in (log peak "
                      "bf16 FLOP/s, "
                      f"log memory bandwidth), distance {spec_distance(target, donor.gpu):.2f}",
            "dataset": donor.dataset,
            "data": donor.data_label,
            "allreduce": f"from {net_donor.gpu.name}'s measured all-reduce, applied to this GPU's {link}",
            "fit_date": fit_date,
            "fitted_by": f"kvsim calibrate (kvsim {__version__})",
        },
    }
    logo = {f.gpu.name: _r(f.logo.stats().mape_pct) for f in fits if f.logo is not None}
    error: dict[str, Any] = {}
    if logo:
        error["leave_one_gpu_out_mape_pct"] = logo
    if checks:
        error["transfer_check_layer_sum_mape_pct"] = checks
    if error:
        error["note"] = ("leave_one_gpu_out: each measured GPU predicted by this transfer from a fit on the "
                         "others (held out); transfer_check: this donor's parameters on the other measured "
                         "GPUs' specs (in sample through the shared tile-choice exponent and row rates)")
        section["error"] = error
    return section


def write_calibration(path: Path, section: dict[str, Any]) -> None:
    """Replace (or append) the top-level `calibration:` block of a profile YAML, keeping every
    other line (comments included) as it is."""
    text = path.read_text()
    before = yaml.safe_load(text) or {}
    kept, skipping = [], False
    for line in text.splitlines(keepends=True):
        top_level = bool(line.strip()) and not line[0].isspace() and not line.startswith("#")
        if top_level:
            skipping = line.startswith("calibration:")
        if not skipping:
            kept.append(line)
    block = yaml.safe_dump({"calibration": section}, sort_keys=False, width=100, allow_unicode=True)
    new_text = "".join(kept).rstrip("\n") + "\n" + block
    after = yaml.safe_load(new_text)
    expected = {**{k: v for k, v in before.items() if k != "calibration"}, "calibration": section}
    if after != expected:  # never corrupt a profile
        raise ConfigError(f"{path}: could not rewrite the calibration section safely")
    path.write_text(new_text)


def profiles_dir() -> Path:
    """The packaged gpu_profiles/ folder (the repo's top-level one in a source checkout)."""
    return data_dir("gpu_profiles")


def profile_path(gpu: GpuSpec, out_dir: Path) -> Path:
    """The YAML to update in out_dir; copied from the packaged profile when absent there."""
    file_name = Path(gpu.source_file).name if gpu.source_file else f"{gpu.name}.yaml"
    dest = out_dir / file_name
    if not dest.is_file():
        src = Path(gpu.source_file)
        if not src.is_file():
            src = profiles_dir() / file_name
        out_dir.mkdir(parents=True, exist_ok=True)
        dest.write_text(src.read_text())
    return dest
