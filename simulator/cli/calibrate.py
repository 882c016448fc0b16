"""`kvsim calibrate --profiles DIR [--gpu NAME]`: fit cost-model parameters to measured kernels.

Reads DIR in Vidur's profiling layout (compute/<gpu>/<org>/<model>/mlp.csv, network/...),
fits each GPU folder (or only --gpu), prints per-op and leave-one-model-out error tables,
writes a parity plot, and writes the `calibration:` section of gpu_profiles/<gpu>.yaml.
Without --gpu, every catalogue GPU with no measurements gets parameters transferred from its
nearest measured GPU, marked `status: extrapolated`.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.cli.common import check_in_dir, check_out_dir, make_console
from simulator.errors import ConfigError

if TYPE_CHECKING:
    from simulator.calibration.gpu_fit import GpuFit
    from simulator.calibration.score import ErrorStats, Residuals

DESCRIPTION = """Fit the cost model of one or more GPUs to measured kernel timings (Vidur's
profiling layout: compute/<gpu>/<org>/<model>/mlp.csv, attention.csv, network/...). Prints
the error per operator, the leave-one-model-out and leave-one-GPU-out checks (per model and
per token range), draws a parity plot and a residual-by-token-count plot, and writes the
`calibration:` section of gpu_profiles/<gpu>.yaml. Without --gpu every GPU folder is fitted
together (the GEMM tile-choice exponent is shared by all GPUs), and every catalogue GPU without
measurements gets parameters transferred from its nearest measured GPU (marked `status:
extrapolated`). --holdout MODEL|GPU reruns one held-out check and prints its table."""

EPILOG = """examples:
  kvsim calibrate --profiles ../shared/data/kernels --dry-run
  kvsim calibrate --profiles ../shared/data/kernels --holdout h100-sxm
  kvsim calibrate --profiles ../shared/data/kernels --holdout Llama-2-7b-hf
  kvsim calibrate --e2e
  kvsim calibrate --profiles profiles --gpu h200 --fit-date 2025-01-31"""


def register(sub, help: str) -> None:
    p = sub.add_parser("calibrate", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--profiles", metavar="DIR",
                   help="profiling data in Vidur's layout, e.g. ../shared/data/kernels (required "
                        "unless --e2e)")
    p.add_argument("--gpu", metavar="NAME",
                   help="calibrate only this GPU (data folder, e.g. a100, or catalogue name, e.g. "
                        "a100-80gb); default: every folder, then extrapolate the rest of the catalogue")
    p.add_argument("--target", metavar="PROFILE",
                   help="with --gpu: the GPU profile (name or YAML path) the fit is for "
                        "(default: the folder's catalogue GPU)")
    p.add_argument("--fit-date", metavar="YYYY-MM-DD",
                   help="date recorded in the provenance (default: today); pass it for byte-identical YAML")
    p.add_argument("--out-profiles", metavar="DIR",
                   help="directory of the GPU profile YAMLs to update (default: the package's gpu_profiles/)")
    p.add_argument("--report-dir", default="runs/calibrate", metavar="DIR",
                   help="where the parity plot goes (default runs/calibrate)")
    p.add_argument("--no-lomo", action="store_true",
                   help="skip the leave-one-model-out and leave-one-GPU-out refits")
    p.add_argument("--holdout", metavar="MODEL|GPU",
                   help="only validate: fit without this model (on every GPU that has it) or without "
                        "this GPU (predicted from the others through its datasheet), print the held-out "
                        "table per model and token range, write the residual plot; writes no profile")
    p.add_argument("--dry-run", action="store_true", help="fit and report, write no YAML")
    p.add_argument("--e2e", action="store_true",
                   help="only the end-to-end check: run experiments/configs/e2e/*.yaml with the "
                        "committed profiles and print them against the published figures "
                        "(docs/costmodel.md); fits nothing, needs no --profiles")
    p.set_defaults(func=main)


def _pct(x: float) -> str:
    return f"{x:.1f}"


def print_op_table(console, fits: list[GpuFit]) -> None:
    from rich.table import Table

    table = Table(title="in-sample error per operator: MAPE % (p95 %)", title_justify="left")
    table.add_column("op")
    for f in fits:
        table.add_column(f.gpu.name, justify="right")
    ops: list[str] = []
    for f in fits:
        ops += [op for op in f.errors if op not in ops]
    for op in ops:
        cells = [f"{_pct(f.errors[op].mape_pct)} ({_pct(f.errors[op].p95_pct)})" if op in f.errors else "-"
                 for f in fits]
        table.add_row("layer sum" if op == "layer" else op, *cells)
    console.print(table)


def _error_table(title: str, rows: dict[str, ErrorStats], first: str, bias: bool = False):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    cols = [first, "rows", *(["bias %"] if bias else []), "mean %", "p95 %", "max %"]
    for col in cols:
        table.add_column(col, justify="left" if col == first else "right")
    for name, e in rows.items():
        table.add_row(name, str(e.rows), *([f"{e.bias_pct:+.1f}"] if bias else []), _pct(e.mape_pct),
                      _pct(e.p95_pct), _pct(e.max_pct))
    return table


def print_heldout(console, what: str, gpu: str, res: Residuals) -> None:
    """One held-out check: per model (with the pooled row) and per token range."""
    by_model = {**res.by_model(), "all rows": res.stats()}
    console.print(_error_table(f"{gpu}: {what}, per-layer op sum, per held-out model", by_model, "model"))
    console.print(_error_table(f"{gpu}: {what}, by tokens in the step", res.by_band(), "tokens", bias=True))


def print_lomo_table(console, fits: list[GpuFit]) -> None:
    for f in fits:
        if f.lomo_residuals is None:
            console.print(f"{f.gpu.name}: one model only, no leave-one-model-out check", highlight=False)
            continue
        what = (f"leave-one-model-out (fit on the other {len(f.models) - 1} model(s)"
                + (" and the other GPUs' GEMMs)" if f.shared_with else ")"))
        print_heldout(console, what, f.gpu.name, f.lomo_residuals)
    for f in fits:
        if f.logo is not None:
            others = ", ".join(g for g in f.shared_with if g != f.gpu.name)
            print_heldout(console, f"leave-one-GPU-out (fit on {others}, transferred through the datasheet)",
                          f.gpu.name, f.logo)


def print_network(console, fits: list[GpuFit]) -> None:
    for f in fits:
        n = f.network
        if n is None:
            continue
        by = ", ".join(f"{w} GPUs {_pct(v)}%" for w, v in n.mape_pct.items()) or "no all_reduce rows to score"
        console.print(f"{f.gpu.name} all-reduce from {n.source}: latency {n.latency_s * 1e6:.1f} us, "
                      f"bus bandwidth {n.bus_eff:.3g} x link; MAPE {by}", highlight=False)


def main(args: argparse.Namespace) -> int:
    import datetime as dt

    from rich.table import Table

    from simulator.calibration.data import gpu_folders
    from simulator.calibration.gpu_fit import fit_gpus, run_holdout
    from simulator.calibration.report import params_table, parity_plot, residual_plot
    from simulator.calibration.sections import (
        extrapolated_section,
        measured_section,
        profile_path,
        profiles_dir,
        write_calibration,
    )
    from simulator.calibration.transfer import catalogue_gpus, transfer_errors
    from simulator.hardware.gpus import get_gpu

    if args.e2e:
        from simulator.calibration.e2e import compare, markdown_table

        print(markdown_table(compare()))
        return 0
    if not args.profiles:
        raise ConfigError("--profiles DIR is required (the kernel timings to fit), unless --e2e")
    profiles = check_in_dir(args.profiles, "--profiles")
    fit_date = args.fit_date or dt.date.today().isoformat()
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", fit_date):
        raise ConfigError(f"--fit-date must be YYYY-MM-DD, got {fit_date!r}")
    try:
        dt.date.fromisoformat(fit_date)
    except ValueError:
        raise ConfigError(f"--fit-date {fit_date}: not a calendar date") from None
    if args.target and not args.gpu:
        raise ConfigError("--target needs --gpu (which data folder the target's fit comes from)")
    check_out_dir(args.report_dir, "--report-dir")
    if not args.dry_run:
        check_out_dir(args.out_profiles, "--out-profiles")
    out_dir = Path(args.out_profiles) if args.out_profiles else profiles_dir()
    console = make_console()
    names = [args.gpu] if args.gpu else gpu_folders(profiles)
    target = get_gpu(args.target) if args.target else None
    if args.holdout:
        if args.target:
            raise ConfigError("--holdout validates the catalogue GPUs' fit; it takes no --target")
        what, held = run_holdout(profiles, names, args.holdout)
        for gpu, res in held.items():
            print_heldout(console, what, gpu, res)
        plot = residual_plot(list(held.items()), Path(args.report_dir) / "holdout_residuals.png", what)
        console.print(f"residual plot: {plot}; no profile written", highlight=False)
        return 0
    # 1. fit every GPU first (together: the shared tile choice): nothing is written unless all fits succeed
    fits = fit_gpus(profiles, names, target=target, lomo=not args.no_lomo, logo=not args.no_lomo)
    print_op_table(console, fits)
    print_lomo_table(console, fits)
    print_network(console, fits)
    for f in fits:
        console.print(params_table(f))
    transfers = transfer_errors(fits) if len(fits) > 1 else {}
    if transfers:
        table = Table(title="transfer check: donor's parameters on another measured GPU's specs, "
                            "layer-sum MAPE %", title_justify="left")
        for col in ("donor", "applied to", "MAPE %", "p95 %"):
            table.add_column(col, justify="right" if "%" in col else "left")
        for (d, o), e in transfers.items():
            table.add_row(d, o, _pct(e.mape_pct), _pct(e.p95_pct))
        console.print(table)
    plot = parity_plot(fits, Path(args.report_dir) / "parity.png")
    console.print(f"parity plot: {plot}", highlight=False)
    panels = [(f"{f.gpu.name} leave-one-model-out", f.lomo_residuals) for f in fits if f.lomo_residuals]
    panels += [(f"{f.gpu.name} leave-one-GPU-out", f.logo) for f in fits if f.logo is not None]
    if panels:
        plot = residual_plot(panels, Path(args.report_dir) / "residuals.png",
                             "held-out error of the per-layer op sum by token count")
        console.print(f"residual plot: {plot}", highlight=False)
    # 2. sections: measured GPUs, then (full runs only) the rest of the catalogue, extrapolated
    sections = [(f.gpu, measured_section(f, fit_date)) for f in fits]
    if not args.gpu:
        measured = {f.gpu.name for f in fits}
        for gpu in catalogue_gpus():
            if gpu.name not in measured:
                sections.append((gpu, extrapolated_section(gpu, fits, fit_date, transfers)))
    if args.dry_run:
        console.print("dry run: no profile written", highlight=False)
        return 0
    for gpu, section in sections:
        path = Path(gpu.source_file) if args.target and Path(gpu.source_file).is_file() \
            else profile_path(gpu, out_dir)
        write_calibration(path, section)
        extra = f" (from {section['donor']})" if section["status"] == "extrapolated" else ""
        console.print(f"wrote {path}: calibration {section['status']}{extra}", highlight=False)
    return 0
