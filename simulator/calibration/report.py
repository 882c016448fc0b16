"""What a calibration shows a person: the parity plot (predicted vs measured, one panel per GPU),
the residual-by-token-count plot of the held-out predictions, and the table of fitted
parameters with their standard errors and t-intervals.

matplotlib is imported inside the plot function, so importing this module stays cheap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.table import Table

from simulator.calibration.data import ALL_OPS
from simulator.calibration.gpu_fit import GpuFit
from simulator.calibration.score import TOKEN_BANDS, Residuals, predict_layer_sum, predict_ops
from simulator.calibration.solve import Objective, t_interval


def parity_plot(fits: list[GpuFit], path: Path) -> Path:
    """Predicted vs measured per-op and per-layer times, one panel per GPU, log-log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fits), figsize=(5.2 * len(fits), 5), squeeze=False)
    for ax, fit in zip(axes[0], fits):
        for op in (*ALL_OPS, "layer"):
            meas, pred = [], []
            for m in fit.models:
                p = predict_ops(m, fit.gpu, fit.params)
                if op == "layer":
                    meas.append(m.layer_sum())
                    pred.append(predict_layer_sum(m, fit.gpu, fit.params))
                elif op in m.ops:
                    meas.append(m.ops[op])
                    pred.append(p[op])
            if not meas:
                continue
            x, y = np.concatenate(meas) * 1e3, np.concatenate(pred) * 1e3
            keep = ~np.isnan(x)
            style = {"s": 4, "alpha": 0.35} if op != "layer" else {"s": 5, "alpha": 0.6, "c": "k"}
            ax.scatter(x[keep], y[keep], label=op, **style)
        lo, hi = 5e-4, 2e2
        grid = np.array([lo, hi])
        ax.plot(grid, grid, "k-", lw=0.8)
        for f in (0.9, 1.1):
            ax.plot(grid, grid * f, "k:", lw=0.6)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured (ms)",
               ylabel="predicted (ms)",
               title=f"{fit.gpu.name}: layer-sum MAPE {fit.errors['layer'].mape_pct:.1f}%")
        ax.legend(fontsize=6, markerscale=2, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _loss_label(loss: Objective) -> str:
    return loss.loss if loss.loss == "linear" else f"{loss.loss} {loss.f_scale:g}"


def params_table(fit: GpuFit, level: float = 0.95) -> Table:
    """One GPU's parameters: value, the loss its fit step used (`ParamStat.loss`: soft-l1 on the
    GEMM tile step, linear elsewhere), standard error and Student t interval (scipy.stats.t, the
    fit's residual degrees of freedom) for each fitted one; the rest say why they have none.
    Seconds are shown in microseconds, so the table stays narrow."""
    losses = {_loss_label(s.loss): "least squares" if s.loss.loss == "linear" else s.loss.describe()
              for s in fit.stats.values()}
    legend = "; ".join(f"{short} = {long}" for short, long in sorted(losses.items()))
    title = (f"{fit.gpu.name}: fitted parameters, standard error from the Jacobian, {level:.0%} "
             f"t-interval; loss per row ({legend})")
    table = Table(title=title, title_justify="left")
    for col in ("parameter", "value", "loss", "std error", f"{level:.0%} interval"):
        table.add_column(col, justify="left" if col in ("parameter", "loss") else "right")
    for name, value in fit.params.as_dict().items():
        scale, shown = (1e6, f"{name} (us)") if name.endswith("_s") else (1.0, name)
        stat = fit.stats.get(name)
        if stat is None:
            cells = ("-", "-", "not fitted")
        elif stat.at_bound:
            cells = (_loss_label(stat.loss), "-", f"on {stat.at_bound} bound {stat.bound * scale:g}")
        elif stat.std_error is None:
            cells = (_loss_label(stat.loss), "-", "not determined")
        else:
            lo, hi = t_interval(value, stat, level)
            cells = (_loss_label(stat.loss), f"{stat.std_error * scale:.2g}",
                     f"{lo * scale:.4g} .. {hi * scale:.4g}")
        table.add_row(shown, f"{value * scale:.4g}", *cells)
    return table


def residual_plot(panels: list[tuple[str, Residuals]], path: Path, title: str) -> Path:
    """Relative error of the per-layer op sum against token count, one panel per (label,
    residuals): every row as a dot, each TOKEN_BANDS band's mean as a step line, +-10 % dotted.
    Structure left in the errors (a band off on average, steps the form misses) shows here."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False, sharex=True)
    for ax, (name, res) in zip(axes[:, 0], panels):
        tps = sorted(set(res.tp.tolist()))
        for tp in tps:
            sel = res.tp == tp
            ax.scatter(res.tokens[sel], 100 * res.ratio[sel], s=2, alpha=0.3, label=f"tp {int(tp)}")
        for band in TOKEN_BANDS:
            lo, hi = band
            sel = (res.tokens >= lo) & (res.tokens <= (hi if hi is not None else np.inf))
            if sel.any():
                right = hi if hi is not None else res.tokens.max()
                mean = 100 * res.ratio[sel].mean()
                ax.plot([lo, max(right, lo * 1.2)], [mean, mean], "k-", lw=1.6)
        for y in (-10, 10):
            ax.axhline(y, color="k", ls=":", lw=0.7)
        ax.axhline(0, color="k", lw=0.5)
        stats = res.stats()
        ax.set(xscale="log", ylim=(-40, 40), ylabel="pred/meas - 1 (%)",
               title=f"{name}: mean |err| {stats.mape_pct:.1f}%, p95 {stats.p95_pct:.1f}%, rows {stats.rows}")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=6, markerscale=3, loc="lower left", ncol=len(tps))
    axes[-1, 0].set_xlabel("tokens in the step (T)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path
