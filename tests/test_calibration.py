"""Calibration: bad input names the file, the fit recovers known parameters, leave-one-model-out
error on the measured kernels meets the issue-3 targets, YAML rewriting keeps the profile intact,
and `kvsim profile` round-trips through `kvsim calibrate` (when torch is importable)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator.calibration.data import model_dirs, read_mlp_csv
from simulator.calibration.fit import (
    GEMM_PER_GPU,
    GEMM_SHARED,
    GEMM_TILE_LOSS,
    SHARED_PARAMS,
    fit_compute,
    fit_elementwise_joint,
    fit_network,
)
from simulator.calibration.gpu_fit import fit_gpus
from simulator.calibration.pool import donors, pool_residuals, pool_terms
from simulator.calibration.report import params_table
from simulator.calibration.sections import measured_section, write_calibration
from simulator.calibration.solve import LEAST_SQUARES, Objective, Param, ParamStat, solve, t_interval
from simulator.calibration.transfer import nearest_donor
from simulator.cli.main import main as cli_main
from simulator.engine.costmodel import LAYER_OPS, Chip, CostParams, ShardDims, op_times
from simulator.errors import ConfigError
from simulator.hardware.gpus import get_gpu

OPS = ("emb", *LAYER_OPS)
REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def write_mlp(path: Path, *, drop: tuple[str, ...] = (), arch: bool = True, rows: int = 3,
              times: dict[str, float] | None = None) -> Path:
    """A small valid mlp.csv (Llama-2-7B shapes), optionally missing columns."""
    data: dict[str, list] = {}
    for op in OPS:
        for s in ("min", "max", "mean", "median", "std"):
            data[f"time_stats.{op}.{s}"] = [(times or {}).get(op, 0.05)] * rows
    if arch:
        data.update(n_head=[32] * rows, n_kv_head=[32] * rows, n_embd=[4096] * rows,
                    n_expanded_embd=[11008] * rows, vocab_size=[32768] * rows, use_gated_mlp=[True] * rows)
    data.update(num_tokens=[1, 8, 64][:rows], num_tensor_parallel_workers=[1] * rows)
    df = pd.DataFrame(data).drop(columns=list(drop))
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False)
    return path


# --- bad input -----------------------------------------------------------------------------

def test_missing_column_names_file_and_column(tmp_path):
    path = write_mlp(tmp_path / "compute/x/acme/m/mlp.csv", drop=("time_stats.mlp_up_proj.median",))
    with pytest.raises(ConfigError) as e:
        read_mlp_csv(path)
    assert str(path) in str(e.value) and "missing column 'time_stats.mlp_up_proj.median'" in str(e.value)


@pytest.mark.parametrize("content,expected", [("", "empty file (no header, no rows)"),
                                              ("num_tokens,num_tensor_parallel_workers\n",
                                               "empty file (a header but no rows)")])
def test_empty_file_names_file(tmp_path, content, expected):
    path = tmp_path / "compute/x/acme/m/mlp.csv"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        read_mlp_csv(path)
    assert str(path) in str(e.value) and expected in str(e.value)


def test_model_dir_with_no_matching_architecture_names_file(tmp_path):
    path = write_mlp(tmp_path / "compute/x/acme/mystery-9b/mlp.csv", arch=False)
    with pytest.raises(ConfigError) as e:
        read_mlp_csv(path)
    msg = str(e.value)
    assert str(path) in msg and "no matching architecture for model directory 'acme/mystery-9b'" in msg
    # the same file under a catalogue model's directory name takes the catalogue architecture
    known = write_mlp(tmp_path / "compute/x/meta-llama/Llama-2-7b-hf/mlp.csv", arch=False)
    m = read_mlp_csv(known)
    assert m.dims.hidden[0] == 4096 and m.dims.ffn[0] == 11008


def test_non_numeric_and_non_positive_values_name_column_and_value(tmp_path):
    path = write_mlp(tmp_path / "compute/x/acme/m/mlp.csv")
    df = pd.read_csv(path)
    df["time_stats.add.median"] = df["time_stats.add.median"].astype(object)
    df.loc[1, "time_stats.add.median"] = "fast"
    df.to_csv(path, index=False)
    with pytest.raises(ConfigError, match=r"column 'time_stats.add.median' row 3: not a number: 'fast'"):
        read_mlp_csv(path)
    write_mlp(path, times={"attn_pre_proj": -1.0})
    with pytest.raises(ConfigError, match=r"time_stats.attn_pre_proj.median' must hold times > 0 ms, got -1"):
        read_mlp_csv(path)


def test_model_directory_without_mlp_csv(tmp_path):
    write_mlp(tmp_path / "compute/x/acme/good/mlp.csv")
    (tmp_path / "compute/x/acme/empty-dir").mkdir(parents=True)
    with pytest.raises(ConfigError, match="empty-dir: model directory has no mlp.csv"):
        model_dirs(tmp_path / "compute/x")


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    path = write_mlp(tmp_path / "compute/a40/acme/m/mlp.csv", drop=("num_tokens",))
    code = cli_main(["calibrate", "--profiles", str(tmp_path), "--gpu", "a40", "--dry-run",
                     "--report-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("kvsim: error: ") and str(path) in err and "'num_tokens'" in err


# --- the fit -------------------------------------------------------------------------------

def test_solve_standard_errors_match_linear_regression():
    """On a linear model the Jacobian SEs are the textbook OLS ones: s^2 (X^T X)^-1."""
    x = np.linspace(0.0, 10.0, 41)
    noise = np.sin(7.3 * x) * 0.3  # deterministic "noise"
    y = 2.0 + 0.5 * x + noise
    sol = solve(lambda v: v[0] + v[1] * x - y,
                [Param("a", 1.0, -10.0, 10.0, log=False), Param("b", 1.0, -10.0, 10.0, log=False)])
    design = np.column_stack([np.ones_like(x), x])
    coef, res, *_ = np.linalg.lstsq(design, y, rcond=None)
    s2 = float(res[0]) / (x.size - 2)
    se = np.sqrt(np.diag(np.linalg.inv(design.T @ design)) * s2)
    assert [sol.values["a"], sol.values["b"]] == pytest.approx(coef, rel=1e-8)
    assert [sol.stats["a"].std_error, sol.stats["b"].std_error] == pytest.approx(se, rel=1e-5)
    assert sol.stats["a"].dof == 39 and sol.stats["a"].at_bound is None
    lo, hi = t_interval(sol.values["b"], sol.stats["b"])
    assert (hi - lo) / 2 == pytest.approx(2.0226909 * se[1], rel=1e-5)  # t_{0.975, 39}


def test_solve_log_parameter_standard_error_is_in_its_own_units():
    """A log-space parameter's SE is reported for the value itself (delta method)."""
    x = np.linspace(1.0, 5.0, 30)
    y = 3e-6 * x * (1.0 + 0.01 * np.cos(5.0 * x))
    sol = solve(lambda v: np.log(v[0] * x) - np.log(y), [Param("c", 1e-6, 1e-10, 1e-2)])
    r = np.log(sol.values["c"] * x) - np.log(y)
    expected = sol.values["c"] * np.sqrt(float(r @ r) / (x.size - 1) / x.size)  # d r / d c = 1 / c
    assert sol.values["c"] == pytest.approx(3e-6, rel=1e-3)
    assert sol.stats["c"].std_error == pytest.approx(expected, rel=1e-4)


def test_solve_flags_a_parameter_on_its_bound():
    x = np.linspace(0.0, 1.0, 20)
    sol = solve(lambda v: v[0] * x - (-0.5 * x), [Param("slope", 1.0, 0.0, 5.0, log=False)])
    assert sol.values["slope"] == pytest.approx(0.0, abs=1e-9)
    assert sol.stats["slope"] == ParamStat(None, "lower", 0.0, 20)
    assert t_interval(sol.values["slope"], sol.stats["slope"]) is None


def test_robust_loss_discounts_an_outlier():
    x = np.arange(20.0)
    y = 1.0 + 0.0 * x
    y[3] = 30.0
    params = [Param("level", 2.0, -100.0, 100.0, log=False)]
    plain = solve(lambda v: v[0] - y, params)
    robust = solve(lambda v: v[0] - y, params, Objective("soft_l1", f_scale=0.1))
    assert plain.values["level"] == pytest.approx(y.mean())
    assert abs(robust.values["level"] - 1.0) < 0.1 < abs(plain.values["level"] - 1.0)


def test_unknown_loss_is_one_line():
    with pytest.raises(ConfigError, match=r"calibration loss must be one of linear, soft_l1, .* got 'l2'"):
        Objective("l2")


def synthetic_models(tmp_path: Path, gpu, truth: CostParams) -> list:
    """mlp.csv files generated by the cost model itself from known parameters."""
    archs = [(32, 32, 4096, 11008, True), (64, 8, 8192, 28672, True), (32, 32, 2560, 10240, False)]
    tokens = np.array([1, 2, 4, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096], dtype=float)
    out = []
    for i, (nh, nkv, h, ffn, gated) in enumerate(archs):
        rows = []
        for tp in (1, 2, 4, 8):
            hd = h / nh
            dims = ShardDims(h, nh * hd / tp, max(1.0, np.ceil(nkv / tp)) * hd, ffn / tp, float(gated))
            times = op_times(dims, tokens, Chip.of(gpu), truth)
            for j, t in enumerate(tokens):
                row = {f"time_stats.{op}.median": times[op][j] * 1e3 for op in OPS}
                row.update(n_head=nh, n_kv_head=nkv, n_embd=h, n_expanded_embd=ffn, use_gated_mlp=gated,
                           num_tokens=int(t), num_tensor_parallel_workers=tp)
                rows.append(row)
        path = tmp_path / f"compute/syn/org/m{i}/mlp.csv"
        path.parent.mkdir(parents=True)
        pd.DataFrame(rows).to_csv(path, index=False)
        out.append(read_mlp_csv(path))
    return out


def test_fit_recovers_known_parameters(tmp_path):
    gpu = get_gpu("a100")
    truth = replace(CostParams(), gemm_bandwidth_eff=0.77, gemm_compute_eff=0.71, gemm_overlap_exp=1.8,
                    gemm_overhead_s=4e-6, norm_bandwidth_eff=0.45, rope_overhead_s=2.5e-6,
                    emb_bandwidth_eff=0.2)
    fitted = fit_compute(synthetic_models(tmp_path, gpu, truth), gpu, CostParams()).params
    for name in ("gemm_bandwidth_eff", "gemm_compute_eff", "gemm_overlap_exp", "gemm_overhead_s",
                 "norm_bandwidth_eff", "rope_overhead_s", "emb_bandwidth_eff", "add_bandwidth_eff"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.02), name


@pytest.fixture(scope="module")
def measured_fits():
    """The three measured GPUs fitted together, as `kvsim calibrate` does (no held-out refits)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    fits = fit_gpus(SHARED_DATA / "kernels", ["a100", "a40", "h100"], lomo=False, logo=False)
    return {f.folder: f for f in fits}


@pytest.fixture(scope="module")
def heldout_fits():
    """The same with the leave-one-model-out and leave-one-GPU-out refits (~2 minutes)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} is absent")
    fits = fit_gpus(SHARED_DATA / "kernels", ["a100", "a40", "h100"])
    return {f.folder: f for f in fits}


@pytest.mark.slow
@pytest.mark.parametrize("folder,gpu,num_models", [("a100", "a100-80gb", 8), ("a40", "a40", 6),
                                                   ("h100", "h100-sxm", 2)])
def test_held_out_errors_within_target(heldout_fits, folder, gpu, num_models):
    """Issue 16: fit without model M (all GPUs' GEMMs together), predict M's per-layer op sum on
    every token/TP row; and fit without this GPU, predict it through its datasheet. Must-show 1 as
    the issue states it: LOMO pooled mean <= 4 % and p95 <= 12 % on every GPU (3.996 / 3.93 /
    3.78 % and 11.19 / 11.998 / 10.19 %, docs/costmodel.md: A100's mean and A40's p95 have no
    margin), every model <= 7 %, no token band off by more than 4 % on average on A100 / A40 and
    6 % on H100 (its T = 1 band, +5.4 %, was +11.0 % before the element-wise pooling; must-show
    2); LOGO mean <= 10 %. The committed profile holds the same LOMO figures."""
    fit = heldout_fits[folder]
    assert fit.gpu.name == gpu and len(fit.lomo) == num_models
    pooled = fit.lomo_residuals.stats()
    assert pooled.mape_pct <= 4.0 and pooled.p95_pct <= 12.0, (gpu, pooled)
    for name, err in fit.lomo.items():
        assert err.mape_pct <= 7.0 and err.rows >= 261, (gpu, name, err)
    for band, err in fit.lomo_residuals.by_band().items():
        assert abs(err.bias_pct) <= (6.0 if gpu == "h100-sxm" else 4.0), (gpu, band, err)
    assert fit.logo.stats().mape_pct <= 10.0, (gpu, fit.logo.stats())
    committed = get_gpu(gpu).calibration["error"]
    assert committed["leave_one_model_out_mape_pct"] == \
        pytest.approx({k: round(v.mape_pct, 2) for k, v in fit.lomo.items()}, abs=0.02)
    assert committed["leave_one_gpu_out_pct"]["mean"] == pytest.approx(fit.logo.stats().mape_pct, abs=0.02)


def test_committed_profiles_hold_the_fit(measured_fits):
    """The YAMLs in gpu_profiles/ are what `kvsim calibrate` fits from the data today: parameters
    (the shared tile-choice exponent and row rates the same on every GPU), standard errors and
    bound flags, and the rest of the provenance."""
    shared = {name: getattr(measured_fits["a100"].params, name) for name in SHARED_PARAMS}
    for fit in measured_fits.values():
        committed = get_gpu(fit.gpu.name).calibration
        assert committed["status"] == "measured"
        for name, value in fit.params.as_dict().items():
            assert committed["params"][name] == pytest.approx(value, rel=2e-3), (fit.gpu.name, name)
        assert {name: getattr(fit.params, name) for name in SHARED_PARAMS} == shared
        fresh = measured_section(fit, committed["provenance"]["fit_date"])["provenance"]
        old = dict(committed["provenance"])
        for key in ("data", "network"):  # paths, relative to the current directory
            fresh.pop(key, None)
            old.pop(key, None)
        new_se, old_se = fresh.pop("standard_errors"), old.pop("standard_errors")
        assert fresh == old, fit.gpu.name
        assert new_se["params"] == pytest.approx(old_se["params"], rel=0.05), fit.gpu.name
        assert new_se.get("at_bound") == old_se.get("at_bound"), fit.gpu.name


def test_standard_errors_and_no_parameter_on_a_bound(measured_fits):
    """Every fitted parameter has a standard error, none sits on a bound of its physical range
    (issue 16; the soft roofline had H100's overlap exponent on 1), and the data pin each one
    down to a few per cent, or (a per-kernel overhead next to 0) to within 0.1 us, negligible
    against the microseconds of any kernel (A40's norm was 0.05 +- 0.03 us before the element-wise
    pooling, 0.55 +- 0.03 us with it, docs/costmodel.md). The shared tile-choice exponent carries
    one joint standard error."""
    for fit in measured_fits.values():
        assert set(fit.stats) == {n for n in fit.params.as_dict() if not n.startswith("attn_")}, fit.gpu.name
        for name, stat in fit.stats.items():
            value = getattr(fit.params, name)
            assert stat.at_bound is None, (fit.gpu.name, name, stat)
            # the SM tile costs are the loosest (A40's feed +-31 %, A100's setup +-14 %: the data see
            # little of them, docs/costmodel.md "Standard errors"); everything else within 10 %
            loose = 0.35 if name in ("gemm_feed_flop_per_byte", "gemm_tile_setup_k") else 0.1
            near_zero = name.endswith("_overhead_s") and stat.std_error < 1e-7
            pinned = stat.std_error < loose * value or near_zero
            assert 0 < stat.std_error and pinned and stat.dof >= 78, (fit.gpu.name, name, stat)
    a100, h100 = measured_fits["a100"].stats, measured_fits["h100"].stats
    assert a100["gemm_select_exp"] == h100["gemm_select_exp"]
    assert 1.0 < measured_fits["h100"].params.gemm_overlap_exp < 20.0


def test_per_gpu_tile_costs_follow_the_chips(measured_fits):
    """The SM tile costs are per GPU because they are the chip's (fit.py, GEMM_PER_GPU): the
    operand feed r costs the SM's tensor rate over its shared-memory rate, 1,024 / 2,048 / 4,096
    dense fp16 flops per clock on A40 / A100 / H100 against 128 B per clock on each, and the tile
    setup k0 (the epilogue's store at memory speed) grows with peak / bandwidth (215 / 153 / 295
    flop/B). The fit orders both the same way, and the largest tile's main loop stays within the
    datasheet peak's neighbourhood (not > 1.1, which no clock boost reaches)."""
    from simulator.engine.costmodel import main_loop_eff

    p = {k: f.params for k, f in measured_fits.items()}
    feed = [p[g].gemm_feed_flop_per_byte for g in ("a40", "a100", "h100")]
    assert feed == sorted(feed), feed
    assert p["a100"].gemm_tile_setup_k < p["a40"].gemm_tile_setup_k < p["h100"].gemm_tile_setup_k
    for fit in measured_fits.values():
        assert 0.6 < main_loop_eff(fit.params) < 1.1, (fit.gpu.name, main_loop_eff(fit.params))
        assert fit.params.attn_compute_eff < main_loop_eff(fit.params)


def test_each_parameter_records_its_loss_and_the_table_names_it(measured_fits):
    """Only the GEMM tile step (GEMM_PER_GPU and the shared tile-choice exponent) is fitted under
    soft-l1; weight streaming, element-wise kernels and the all-reduce are least squares. The
    parameter table says so per row, not once for the whole table."""
    from rich.console import Console

    fit = measured_fits["a100"]
    tile = set(GEMM_PER_GPU + GEMM_SHARED)
    assert tile <= set(fit.stats) and "gemm_bandwidth_eff" in fit.stats and "norm_overhead_s" in fit.stats
    for name, stat in fit.stats.items():
        assert stat.loss == (GEMM_TILE_LOSS if name in tile else LEAST_SQUARES), (name, stat)
    console = Console(width=200, record=True, color_system=None)
    console.print(params_table(fit))
    text = console.export_text()
    assert "soft_l1 0.05 = soft_l1 loss, f_scale 0.05" in text and "linear = least squares" in text
    rows = {line.split()[1]: line for line in text.splitlines() if line.startswith("│")}
    for name in fit.stats:
        shown = f"{name} (us)".split()[0] if name.endswith("_s") else name
        assert ("soft_l1 0.05" if name in tile else "linear") in rows[shown], rows[shown]
    assert "not fitted" in rows["attn_compute_eff"]  # derived from the GEMM fit (no attention data)


def test_network_fit(shared_data):
    a100 = fit_network(shared_data / "kernels/network/a100_dgx", get_gpu("a100-80gb"))
    assert a100.source == "all_reduce" and set(a100.mape_pct) == {2, 4, 8}
    assert max(a100.mape_pct.values()) < 20
    assert 5e-6 < a100.latency_s < 1e-4 and 0.1 < a100.bus_eff < 1.0
    a40 = fit_network(shared_data / "kernels/network/a40_pairwise_nvlink", get_gpu("a40"))
    assert a40.source == "send_recv (ring model)" and not a40.mape_pct


@pytest.mark.parametrize("target,donor", [("l4", "a40"), ("a10g", "a40"), ("a100-40gb", "a100-80gb"),
                                          ("h200", "h100-sxm"), ("b200", "h100-sxm"),
                                          ("h100-pcie", "h100-sxm"), ("mi300x", "h100-sxm")])
def test_nearest_donor_and_committed_extrapolations(target, donor):
    measured = [get_gpu(n) for n in ("a100-80gb", "a40", "h100-sxm")]
    assert nearest_donor(get_gpu(target), measured).name == donor
    cal = get_gpu(target).calibration
    assert cal["status"] == "extrapolated" and cal["donor"] == donor


def test_write_calibration_keeps_the_rest_of_the_profile(tmp_path):
    path = tmp_path / "g.yaml"
    text = "# header comment\nname: g\nmemory_gib: 8\ncalibration:\n  status: old\n  params: {}\n" \
           "sources:\n  memory_gib: datasheet  # kept\n"
    path.write_text(text)
    section = {"status": "measured", "params": {"gemm_compute_eff": 0.7}}
    write_calibration(path, section)
    new = path.read_text()
    assert new.startswith("# header comment\nname: g\nmemory_gib: 8\n"
                          "sources:\n  memory_gib: datasheet  # kept\n")
    assert yaml.safe_load(new) == {"name": "g", "memory_gib": 8, "sources": {"memory_gib": "datasheet"},
                                   "calibration": section}
    write_calibration(path, section)  # idempotent
    assert path.read_text() == new


def test_calibrate_cli_writes_profile_and_plot(shared_data, tmp_path, capsys):
    code = cli_main(["calibrate", "--profiles", str(shared_data / "kernels"), "--gpu", "h100-sxm",
                     "--fit-date", "2026-01-02", "--out-profiles", str(tmp_path / "p"),
                     "--report-dir", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 0 and "leave-one-model-out" in out and "layer sum" in out
    assert "by tokens in the step" in out
    assert "h100-sxm: fitted parameters" in out and "95% interval" in out
    cal = yaml.safe_load((tmp_path / "p/h100-sxm.yaml").read_text())["calibration"]
    assert cal["status"] == "measured" and cal["provenance"]["fit_date"] == "2026-01-02"
    assert cal["provenance"]["data"].endswith("kernels/compute/h100")
    assert cal["provenance"]["dataset"] == "Vidur's H100 kernel timings"
    se = cal["provenance"]["standard_errors"]
    ce = cal["params"]["gemm_compute_eff"]
    assert "at_bound" not in se and 0 < se["params"]["gemm_compute_eff"] < 0.05 * ce
    assert "gemm_tile_setup_k" in se["params"]  # the SM tile costs are per GPU: fitted on its data
    assert "gemm_select_exp" not in se["params"]  # one GPU alone: the shared tile choice is held
    committed = get_gpu("h100-sxm").calibration["params"]
    assert cal["params"]["gemm_select_exp"] == committed["gemm_select_exp"]
    assert "held at the profile's values" in cal["provenance"]["shared"]
    assert (tmp_path / "r/parity.png").stat().st_size > 10_000
    assert (tmp_path / "r/residuals.png").stat().st_size > 10_000


def test_holdout_prints_the_held_out_table(shared_data, tmp_path, capsys):
    """`kvsim calibrate --holdout MODEL|GPU` reruns one held-out check, prints the table per model
    and token range and the residual plot, writes no profile; a name that is neither is one line."""
    args = ["calibrate", "--profiles", str(shared_data / "kernels"), "--report-dir", str(tmp_path / "r")]
    assert cli_main([*args, "--gpu", "h100", "--holdout", "phi-2"]) == 0
    out = capsys.readouterr().out
    assert "leave-one-model-out (microsoft/phi-2 held out" in out and "by tokens in the step" in out
    assert "no profile written" in out and (tmp_path / "r/holdout_residuals.png").is_file()
    assert cli_main([*args, "--holdout", "h100-sxm"]) == 0
    out = capsys.readouterr().out
    assert "leave-one-GPU-out (h100-sxm predicted from a100-80gb, a40 through its datasheet)" in out
    assert "meta-llama/Llama-2-7b-hf" in out and "all rows" in out
    assert cli_main([*args, "--holdout", "llama-9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--holdout 'llama-9': not a measured GPU or model" in err
    assert "GPUs: a100-80gb, a40, h100-sxm" in err


# --- kvsim profile -------------------------------------------------------------------------

def test_profile_round_trips_through_calibrate(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason="torch not installed: kvsim profile needs the "
                                                "optional extra, pip install 'kvsim[profile]'")
    from simulator.calibration.profile import ProfileConfig, run_profile
    from simulator.hardware.models import ModelSpec

    del torch
    tiny = ModelSpec("tiny-org/tiny-llama", 2, 64, 4, 2, 16, 128, 256, 512)
    cfg = ProfileConfig(model=tiny, gpu="cpu-test", out_dir=tmp_path / "prof", tp_sizes=(1, 2, 3),
                        num_tokens=(1, 2, 8, 32), repeats=2, warmup=1, device="cpu", dtype="float32",
                        prefill_tokens=(16,), decode_batch_sizes=(2,), decode_contexts=(32,))
    written = run_profile(cfg)
    assert [p.name for p in written] == ["mlp.csv", "attention.csv"]
    assert any("tp=3 skipped" in n for n in cfg.notes)
    m = read_mlp_csv(written[0])
    assert m.name == "tiny-org/tiny-llama" and set(m.ops) == set(OPS) and len(m.tokens) == 8
    target = tmp_path / "cpu-test.yaml"
    shutil.copy(REPO / "gpu_profiles/a10g.yaml", target)
    code = cli_main(["calibrate", "--profiles", str(tmp_path / "prof"), "--gpu", "cpu-test", "--target",
                     str(target), "--fit-date", "2026-01-02", "--report-dir", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err
    cal = yaml.safe_load(target.read_text())["calibration"]
    assert cal["status"] == "measured" and "attn_compute_eff" in cal["params"]
    assert cal["provenance"]["models"] == ["tiny-org/tiny-llama"]
    assert cal["provenance"]["dataset"] == "kernel timings measured on cpu-test"



def test_pooling_donors_and_weights():
    """Each GPU pools toward its nearest other GPU of the fit in spec space; one GPU alone has no
    donor; the prior's weight grows with the rows per model (calibration/pool.py)."""
    gpus = [get_gpu(n) for n in ("a100-80gb", "a40", "h100-sxm")]
    assert donors(gpus) == {"a100-80gb": "h100-sxm", "a40": "a100-80gb", "h100-sxm": "a100-80gb"}
    assert donors(gpus[:1]) == {}
    free = ["a100-80gb:norm_overhead_s", "h100-sxm:norm_overhead_s", "norm_row_gbps"]
    terms = pool_terms(free, {"a100-80gb": (800, 8), "h100-sxm": (200, 2)}, donors(gpus))
    assert [(i, j) for i, j, _ in terms] == [(0, 1), (1, 0)]
    assert terms[0][2] == pytest.approx(terms[1][2])  # 100 rows per model on both
    values = np.array([2e-6, 4e-6, 5.0])
    w = terms[0][2]
    assert pool_residuals(values, terms) == pytest.approx([w * np.log(0.5), w * np.log(2.0)])


def test_pooling_pulls_a_thinly_measured_gpu_toward_its_neighbour(tmp_path):
    """H100 measured on one model whose norm kernel is twice as slow to launch as A100's (three
    models): the joint fit pulls the two toward each other, H100's stays nearer its own data;
    where the two GPUs agree pooling adds no bias."""
    a100, h100 = get_gpu("a100-80gb"), get_gpu("h100-sxm")
    truth = replace(CostParams(), norm_overhead_s=2e-6, norm_bandwidth_eff=0.45)
    on_a100 = synthetic_models(tmp_path / "a", a100, truth)
    same = fit_elementwise_joint([(on_a100, a100, truth), (synthetic_models(tmp_path / "b", h100, truth)[:1],
                                                           h100, truth)])
    assert same["h100-sxm"].params.norm_overhead_s == pytest.approx(2e-6, rel=0.01)
    slow = replace(truth, norm_overhead_s=4e-6)
    fits = fit_elementwise_joint([(on_a100, a100, truth), (synthetic_models(tmp_path / "c", h100, slow)[:1],
                                                           h100, truth)])
    h, a = fits["h100-sxm"].params.norm_overhead_s, fits["a100-80gb"].params.norm_overhead_s
    assert 2e-6 < a < 2.5e-6 < 3.5e-6 < h < 3.95e-6, (h, a)
