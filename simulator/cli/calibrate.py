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

DESCRIPTION = """Fit the cost model of one or more GPUs to measured kernel timings (Vidur's
profiling layout: compute/<gpu>/<org>/<model>/mlp.csv, attention.csv, network/...). Prints
the error per operator and a leave-one-model-out check, draws a parity plot, and writes
the `calibration:` section of gpu_profiles/<gpu>.yaml. Without --gpu every GPU folder is
fitted, and every catalogue GPU without measurements gets parameters transferred from its
nearest measured GPU (marked `status: extrapolated`)."""

EPILOG = """examples:
  kvsim calibrate --profiles ../shared/data/kernels --dry-run
  kvsim calibrate --profiles profiles --gpu h200 --fit-date 2025-01-31"""


def register(sub, help: str) -> None:
    p = sub.add_parser("calibrate", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--profiles", required=True, metavar="DIR",
                   help="profiling data in Vidur's layout, e.g. ../shared/data/kernels")
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
    p.add_argument("--no-lomo", action="store_true", help="skip the leave-one-model-out refits")
    p.add_argument("--dry-run", action="store_true", help="fit and report, write no YAML")
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


def print_lomo_table(console, fits: list[GpuFit]) -> None:
    from rich.table import Table

    for f in fits:
        if not f.lomo:
            console.print(f"{f.gpu.name}: one model only, no leave-one-model-out check", highlight=False)
            continue
        table = Table(title=f"{f.gpu.name}: leave-one-model-out error of the per-layer op sum "
                            f"(fit on the other {len(f.models) - 1} model(s))", title_justify="left")
        for col in ("held-out model", "rows", "MAPE %", "p95 %", "max %"):
            table.add_column(col, justify="left" if col == "held-out model" else "right")
        for name, e in f.lomo.items():
            table.add_row(name, str(e.rows), _pct(e.mape_pct), _pct(e.p95_pct), _pct(e.max_pct))
        console.print(table)


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
    from simulator.calibration.gpu_fit import fit_gpu
    from simulator.calibration.report import params_table, parity_plot
    from simulator.calibration.sections import (
        extrapolated_section,
        measured_section,
        profile_path,
        profiles_dir,
        write_calibration,
    )
    from simulator.calibration.transfer import catalogue_gpus, transfer_errors
    from simulator.hardware.gpus import get_gpu

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
    # 1. fit every GPU first: nothing is written unless all fits succeed
    fits = [fit_gpu(profiles, name, target=target, lomo=not args.no_lomo) for name in names]
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
