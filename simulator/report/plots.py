"""Plots of one run directory (matplotlib, PNG), rebuilt from its files alone.

- gauges.png       KV usage, pending and running requests, preemption rate over time, with
                   each alert threshold drawn as a dashed line and its firings shaded
- batch.png        batch size per engine step, in sequences and in tokens
- latency_cdf.png  TTFT, TPOT and E2E CDFs, SLO targets drawn
- tiers.png        TTFT and E2E CDFs per tier, priority or tenant (the first column of
                   requests.parquet with more than one value), only when there is one
Figures are built on matplotlib's object API (no pyplot global state), so plotting is
thread-safe and leaves no open figures; PNGs carry no timestamp, so they are reproducible.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from simulator.config.schema import read_yaml
from simulator.errors import ConfigError
from simulator.metrics.alerts import evaluate, preemption_rate, resolve_rules
from simulator.metrics.summary import resolve_slo
from simulator.metrics.timeseries import StepFunction, gauge, run_window

MAX_STEPS_DRAWN = 20_000  # beyond this, gauges are drawn as per-bin maxima (spikes stay visible)
FIRING_COLOR = "#d62728"
DPI = 110


def read_json(path: Path) -> dict[str, Any]:
    """A run directory's JSON file as an object; ConfigError naming it when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a kvsim output (invalid JSON: {e}); rerun `kvsim run`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a kvsim output (a JSON {type(data).__name__}, expected an "
                          f"object); rerun `kvsim run`")
    return data


def _read_table(path: Path) -> pd.DataFrame:
    import pyarrow as pa

    try:
        return pd.read_parquet(path)
    except (pa.ArrowException, OSError) as e:
        raise ConfigError(f"{path}: not a parquet table ({e}); rerun `kvsim run`") from None


def load_run(run_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(requests, iterations, config dict) of a run directory; ConfigError if it is not one
    (or a file in it is not what kvsim wrote)."""
    d = Path(run_dir)
    missing = [f for f in ("requests.parquet", "iterations.parquet") if not (d / f).is_file()]
    if missing == ["iterations.parquet"] and (d / "summary.json").is_file():
        raise ConfigError(f"{d} has no iterations.parquet (a `kvsim run --no-iterations` run?); "
                          f"plots need it: rerun without --no-iterations")
    if missing:
        raise ConfigError(f"{d} is not a run directory (missing {', '.join(missing)}); "
                          f"make one with `kvsim run --out {d}`")
    config = {}
    if (d / "config.yaml").is_file():
        config = read_yaml(d / "config.yaml", str(d / "config.yaml")) or {}
        if not isinstance(config, dict):
            raise ConfigError(f"{d / 'config.yaml'}: not a kvsim output (expected a mapping)")
    return _read_table(d / "requests.parquet"), _read_table(d / "iterations.parquet"), config


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=DPI, metadata={"Software": None})
    return path


def _step_xy(fn: StepFunction, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
    """Points for a `where="post"` step plot over [t0, t1]; long series are reduced to the
    maximum per bin so that short spikes above a threshold remain visible."""
    starts, lengths, values = fn.segments(t0, t1)
    keep = lengths > 0
    starts, values = starts[keep], values[keep]
    if len(starts) > MAX_STEPS_DRAWN and t1 > t0:
        edges = np.linspace(t0, t1, MAX_STEPS_DRAWN + 1)
        b = np.clip(np.searchsorted(edges, starts, side="right") - 1, 0, MAX_STEPS_DRAWN - 1)
        binned = np.full(MAX_STEPS_DRAWN, -np.inf)
        np.maximum.at(binned, b, values)
        # a bin with no change point holds the value carried in from the left
        carried = fn.at(edges[:-1])
        starts, values = edges[:-1], np.maximum(binned, carried)
    return np.append(starts, t1), np.append(values, values[-1] if len(values) else 0.0)


def plot_gauges(requests: pd.DataFrame, iterations: pd.DataFrame, config: dict, out: Path) -> Path:
    rules = resolve_rules(config.get("alerts"))
    firings = evaluate(rules, requests, iterations)
    t0, t1 = run_window(requests, iterations)
    rate_rule = next((r for r in rules if r.signal == "preemption_rate"), None)
    window_s = rate_rule.window_s if rate_rule else 10.0
    panels = [
        ("kv_usage", gauge(iterations, "kv_usage"), 100.0, "KV cache usage (%)"),
        ("pending", gauge(iterations, "num_waiting"), 1.0, "waiting requests"),
        ("running", gauge(iterations, "num_running"), 1.0, "running requests"),
        ("preemption_rate", preemption_rate(requests, iterations, window_s), 100.0,
         f"preemptions (% of exits,\ntrailing {window_s:g} s)"),
    ]
    fig = Figure(figsize=(10, 9.5))
    # fixed margins: a layout engine would draw every figure twice (half of the plotting time)
    fig.subplots_adjust(left=0.1, right=0.98, top=0.95, bottom=0.06, hspace=0.12)
    axes = fig.subplots(len(panels), 1, sharex=True)
    for ax, (sig, fn, scale, label) in zip(axes, panels):
        x, y = _step_xy(fn, t0, t1)
        ax.step(x, y * scale, where="post", lw=0.9, color="#1f77b4", label=label.replace("\n", " "))
        for rule in (r for r in rules if r.signal == sig):
            ax.axhline(rule.threshold * scale, color=FIRING_COLOR, ls="--", lw=1.2,
                       label=f"alert {rule.name}: {rule.describe()}")
            spans = [f for f in firings if f.rule == rule.name]
            for k, f in enumerate(spans):
                ax.axvspan(f.start_s, f.end_s, color=FIRING_COLOR, alpha=0.15, lw=0,
                           label=f"{rule.name} firing ({len(spans)}x)" if k == 0 else None)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        if sig in ("kv_usage", "preemption_rate"):
            ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right", fontsize=8, framealpha=0.85)
    axes[-1].set_xlabel("simulated time (s)")
    axes[-1].set_xlim(t0, t1 if t1 > t0 else t0 + 1)
    fig.suptitle("Gauges over time (value after each engine step; red: alert thresholds, firings)")
    return _save(fig, out / "gauges.png")


def _int_hist(ax, x: np.ndarray, color: str) -> None:
    """Integer-aligned bins; a skewed distribution (decode steps of a few tokens beside
    prefill steps of thousands) gets log-spaced bins and a log count axis so the tail shows."""
    top = int(x.max()) if len(x) else 1
    if len(x) and top / max(float(np.median(x)), 1.0) > 20:
        bins = np.unique(np.round(np.geomspace(1, top + 1, 50)) - 0.5)
        ax.hist(x, bins=bins, color=color, edgecolor="white", lw=0.3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        return
    width = max(1, int(np.ceil(top / 60)))
    bins = np.arange(0.5, top + width + 0.5, width)
    ax.hist(x, bins=bins, color=color, edgecolor="white", lw=0.3)


def plot_batch(iterations: pd.DataFrame, out: Path) -> Path:
    fig = Figure(figsize=(10, 4))
    fig.subplots_adjust(left=0.08, right=0.98, top=0.89, bottom=0.13, wspace=0.22)
    a, b = fig.subplots(1, 2)
    for ax, col, xlabel, color in ((a, "num_seqs", "sequences per step", "#2ca02c"),
                                   (b, "num_tokens", "tokens per step", "#9467bd")):
        x = iterations[col].to_numpy()
        _int_hist(ax, x, color)
        if len(x):
            for q, ls in ((50, "-"), (99, ":")):
                v = float(np.percentile(x, q))
                ax.axvline(v, color="black", ls=ls, lw=1, label=f"p{q} = {v:g}")
            ax.legend(fontsize=8)
        ax.set_xlabel(xlabel + (" (log scale)" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel("engine steps" + (" (log scale)" if ax.get_yscale() == "log" else ""))
        ax.grid(alpha=0.3)
    fig.suptitle(f"Batch size distribution ({len(iterations)} engine steps)")
    return _save(fig, out / "batch.png")


def _latencies(requests: pd.DataFrame) -> dict[str, np.ndarray]:
    done = requests[requests.status == "finished"]
    multi = done[done.output_tokens > 1]
    return {
        "TTFT": (done.first_token_s - done.arrival_s).to_numpy(np.float64),
        "TPOT": ((multi.finish_s - multi.first_token_s) / (multi.output_tokens - 1)).to_numpy(np.float64),
        "E2E": (done.finish_s - done.arrival_s).to_numpy(np.float64),
    }


def _cdf(ax, x: np.ndarray, **kw) -> None:
    x = np.sort(x[np.isfinite(x)])
    if len(x):
        ax.step(x, np.arange(1, len(x) + 1) / len(x), where="post", **kw)


def _set_xscale(ax, x: np.ndarray) -> None:
    """Log x when the values (and any target drawn with them) span more than 8x."""
    x = x[np.isfinite(x) & (x > 0)]
    if len(x) and x.max() / x.min() > 8:
        ax.set_xscale("log")
        # 1-2-5 ticks as plain numbers: minor log labels overlap on spans of one decade
        decades = np.log10(x.max() / x.min())
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0,) if decades > 2.5 else (1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def plot_latency_cdfs(requests: pd.DataFrame, config: dict, out: Path) -> Path:
    slo = resolve_slo(config.get("slo"))
    targets = {"TTFT": slo.ttft_s, "TPOT": slo.tpot_s}
    fig = Figure(figsize=(12, 4))
    fig.subplots_adjust(left=0.06, right=0.98, top=0.89, bottom=0.13, wspace=0.25)
    axes = fig.subplots(1, 3)
    for ax, (name, x) in zip(axes, _latencies(requests).items()):
        _cdf(ax, x, color="#1f77b4", lw=1.3, label=f"{name} ({np.isfinite(x).sum()} requests)")
        if targets.get(name) is not None:
            ax.axvline(targets[name], color=FIRING_COLOR, ls="--", lw=1.2,
                       label=f"SLO {targets[name]:g} s")
        ax.axhline(0.99, color="grey", ls=":", lw=0.8, label="p99")
        _set_xscale(ax, np.append(x, targets.get(name) or np.nan))
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("share of requests ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle("Latency CDFs (finished requests)")
    return _save(fig, out / "latency_cdf.png")


def tier_column(requests: pd.DataFrame) -> str | None:
    """The first of tier, priority, tenant with more than one value, else None."""
    for col in ("tier", "priority", "tenant"):
        if col in requests and requests[col].nunique() > 1:
            return col
    return None


def plot_tiers(requests: pd.DataFrame, out: Path) -> Path | None:
    """TTFT and E2E CDFs per tier (or priority, or tenant); None when there is only one."""
    col = tier_column(requests)
    if col is None:
        return None
    tiers = sorted(requests[col].unique().tolist())
    fig = Figure(figsize=(10, 4))
    fig.subplots_adjust(left=0.08, right=0.98, top=0.89, bottom=0.13, wspace=0.22)
    axes = fig.subplots(1, 2)
    for ax, name in zip(axes, ("TTFT", "E2E")):
        allx = _latencies(requests)[name]
        for tier in tiers[:12]:  # beyond a dozen lines a CDF plot is unreadable
            x = _latencies(requests[requests[col] == tier])[name]
            _cdf(ax, x, lw=1.3, label=f"{col} {tier} ({np.isfinite(x).sum()} req)")
        _set_xscale(ax, allx)
        ax.set_xlabel(f"{name} (s)")
        ax.set_ylabel("share of requests ≤ x")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    note = " (lower priority value = more urgent)" if col == "priority" else ""
    more = f"; first 12 of {len(tiers)}" if len(tiers) > 12 else ""
    fig.suptitle(f"Latency per {col}{note}{more}")
    return _save(fig, out / "tiers.png")


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Every plot of a run directory into out_dir (default RUN_DIR/plots); returns the paths."""
    requests, iterations, config = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    paths = [plot_gauges(requests, iterations, config, out), plot_batch(iterations, out),
             plot_latency_cdfs(requests, config, out)]
    tiers = plot_tiers(requests, out)
    if tiers is not None:
        paths.append(tiers)
    return paths


def first_seed_dir(run_dir: str | Path) -> Path | None:
    """The first per-seed run of a `kvsim run --seeds N` directory, else None."""
    d = Path(run_dir)
    agg = d / "seeds_summary.json"
    if not agg.is_file():
        return None
    seeds = read_json(agg).get("seeds", [])
    return d / f"seed_{seeds[0]}" if seeds else None
