"""Sweeps: the cartesian product of config values, run in parallel, resumable, fault-isolated.

A sweep is a base config (YAML or the defaults) plus a grid `{key: [values]}` over any key
`--set` accepts (dotted, or a bare field name of one section) and N seeds. Each (point, seed)
is one *task*, identified by a stable hash of its complete raw config (seed included).

Invariants:
- a task's result is one JSON file OUT/points/<id>.json, written atomically (temp file +
  rename) by the parent as soon as the task returns, so the directory is consistent whenever
  the sweep stops (finished, crashed, Ctrl-C); a rerun skips every id that has a file;
- a task that raises is recorded with status "error" and its message; the others go on;
- a result holds no wall-clock value: the same task gives the same file on any backend and
  with any number of workers (tasks are independent, each seeded from its own config);
- the table (OUT/sweep.parquet, OUT/sweep.csv) has one row per point, built from the point
  files alone: the grid columns, then every summary metric (metrics.flatten names); with
  seeds > 1 the mean over seeds and `<metric>.ci95` (the half-width of the 95 % t-interval,
  metrics.aggregate_seeds).
Backends: `local` (a process pool; 1 worker runs in-process) and `ray` (optional extra).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
import signal
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simulator import __version__
from simulator.config.paths import PACKAGE_ROOT
from simulator.config.schema import (
    _SECTIONS,
    SimConfig,
    _field_names,
    apply_override,
    apply_overrides,
    from_dict,
    load_config,
    parse_value,
)
from simulator.errors import ConfigError, did_you_mean
from simulator.metrics.summary import aggregate_seeds, clean_floats, flatten

POINTS_DIR = "points"


@functools.cache
def code_fingerprint() -> str:
    """sha256 (16 hex) of the simulator's source and GPU profiles: a record made by other code
    is reused on resume (ids hash the config only) but flagged (Outcome.stale)."""
    from simulator.hardware.gpus import _profiles_dir
    root = PACKAGE_ROOT
    h = hashlib.sha256()
    for path in sorted([*root.rglob("*.py"), *Path(str(_profiles_dir())).glob("*.yaml")]):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


# --- the grid --------------------------------------------------------------------------------
def check_key(key: str) -> str:
    """The dotted form of a grid key, or a ConfigError with a suggestion. Checks the top
    level and the section field; deeper parts (workload.arrival.rate) are checked when each
    point's config is built."""
    probe: dict[str, Any] = {}
    apply_override(probe, key, None)  # unknown bare names raise here, with a suggestion
    parts = key.split(".") if "." in key or key in _field_names(SimConfig) else \
        [next(iter(probe)), key]
    top = _field_names(SimConfig)
    if parts[0] not in top:
        raise ConfigError(f"--grid: unknown key {key!r}{did_you_mean(parts[0], top)}; "
                          f"top-level keys: {', '.join(top)}")
    if parts[0] in _SECTIONS and len(parts) > 1:
        names = _field_names(_SECTIONS[parts[0]])
        if parts[1] not in names:
            every = [f"{parts[0]}.{n}" for n in names]
            raise ConfigError(f"--grid: unknown key {key!r}"
                              f"{did_you_mean(f'{parts[0]}.{parts[1]}', every)}; "
                              f"valid {parts[0]} keys: {', '.join(names)}")
    return ".".join(parts)


def parse_grid(items: Iterable[str]) -> dict[str, list[Any]]:
    """`key=v1,v2,...` strings -> {dotted key: [values]} (YAML-typed values)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid expects key=v1,v2,..., got {item!r}")
        key, text = (s.strip() for s in item.split("=", 1))
        values = [parse_value(v.strip()) for v in text.split(",") if v.strip()]
        if not values:
            raise ConfigError(f"--grid {key}: no values (write {key}=v1,v2,...)")
        grid[key] = values
    return grid


def check_grid(grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
    if not grid:
        raise ConfigError("empty grid: give at least one --grid key=v1,v2,... "
                          "(or a sweep: {grid: {key: [values]}} section in the config file)")
    out: dict[str, list[Any]] = {}
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ConfigError(f"grid {key}: expected a non-empty list of values, got {values!r}")
        dotted = check_key(key)
        if dotted in out:
            raise ConfigError(f"grid: key {key!r} given twice")
        out[dotted] = values
    return out


# --- tasks -----------------------------------------------------------------------------------
def task_id(data: dict[str, Any]) -> str:
    """Stable across processes and machines: sha256 of the canonical JSON of the raw config."""
    blob = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(f"kvsim-{__version__}:{blob}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Task:
    id: str
    params: dict[str, Any]  # grid key -> value (the table's config columns)
    seed: int
    data: dict[str, Any]  # raw config (built in the worker, so a bad value is the point's error)


def make_tasks(base: dict[str, Any], grid: dict[str, list[Any]], seeds: list[int]) -> list[Task]:
    keys = list(grid)
    tasks = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        for seed in seeds:
            data = json.loads(json.dumps(base))  # deep copy of plain YAML data
            origins: dict = {}  # (a grid key that switches a tagged mapping: apply_override)
            for k, v in zip(keys, combo):
                apply_override(data, k, v, origins)
            data["seed"] = seed
            params = dict(zip(keys, combo))
            tasks.append(Task(task_id(data), params, seed, data))
    return tasks


def run_task(task: Task, summarize_fn: Callable[[dict], dict] | None = None) -> dict[str, Any]:
    """One task -> its record (never raises: an error is the record's status)."""
    record: dict[str, Any] = {"id": task.id, "params": task.params, "seed": task.seed,
                              "config": task.data, "code": code_fingerprint()}
    try:
        from simulator.engine.run import run
        config = from_dict(task.data)
        result = run(config)
        summary = result.summary
        record.update(status="ok", error=None, metrics=flatten(summary),
                      fired=summary["alerts"]["fired"],
                      num_gpu_blocks=summary["config"]["num_gpu_blocks"])
        if summarize_fn is not None:
            record["extra"] = summarize_fn(result)
    except Exception as e:  # noqa: BLE001 - fault isolation: the sweep records and goes on
        record.update(status="error", error=f"{type(e).__name__}: {e}", metrics={})
    return clean_floats(record)


def _ignore_sigint() -> None:
    # Workers leave Ctrl-C to the parent, which stops the pool and keeps what is written.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def write_record(points_dir: Path, record: dict[str, Any]) -> Path:
    path = points_dir / f"{record['id']}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)  # atomic: a reader sees the old file or the whole new one
    return path


def read_records(points_dir: Path, ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    out = {}
    paths = sorted(points_dir.glob("*.json")) if ids is None else \
        [points_dir / f"{i}.json" for i in ids]
    for p in paths:
        if p.is_file():
            try:
                out[p.stem] = json.loads(p.read_text())
            except json.JSONDecodeError:
                continue  # cannot happen with atomic writes; a hand-edited file is rerun
    return out


# --- execution -------------------------------------------------------------------------------
@dataclass
class Outcome:
    done: int = 0  # tasks run now
    skipped: int = 0  # tasks found finished on disk
    failed: int = 0  # tasks run now that raised
    interrupted: bool = False
    stale: int = 0  # records reused from disk that other code made (code_fingerprint)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)


def check_ray_address(address: str | None) -> None:
    """A reachable host:port or a clear ConfigError (before Ray's own long retries)."""
    if address in (None, "", "local", "auto"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address!r}: expected host:port (or ray://host:port)")
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as e:
        raise ConfigError(f"cannot reach the Ray cluster at {address} ({e.strerror or e}); "
                          f"start one with `ray start --head` or omit --address for a local "
                          f"Ray instance") from None


def execute(tasks: list[Task], out_dir: Path, *, workers: int = 1, backend: str = "local",
            address: str | None = None, retry_failed: bool = False, progress: bool = True,
            summarize_fn: Callable | None = None, console=None) -> Outcome:
    """Steps: 1. read finished records; 2. run the rest on the backend, writing each record
    as it arrives; 3. on Ctrl-C stop the workers (records written so far stay)."""
    points = out_dir / POINTS_DIR
    points.mkdir(parents=True, exist_ok=True)
    have = read_records(points, [t.id for t in tasks])
    if retry_failed:
        have = {k: v for k, v in have.items() if v.get("status") == "ok"}
    todo = [t for t in tasks if t.id not in have]
    todo = list({t.id: t for t in todo}.values())  # a repeated grid value is run once
    outcome = Outcome(skipped=len(tasks) - len(todo), records=dict(have))
    code = code_fingerprint()
    outcome.stale = sum(r.get("code") != code for r in have.values())
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be an integer >= 1, got {workers!r}")
    if backend not in ("local", "ray"):
        raise ConfigError(f"--backend must be local or ray{did_you_mean(str(backend), ['local', 'ray'])}, "
                          f"got {backend!r}")
    if backend == "ray":
        check_ray_address(address)

    bar = None
    if progress and todo:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=console, transient=False)
        bar_task = bar.add_task(f"{len(todo)} runs ({outcome.skipped} done before)", total=len(todo))

    def finished(record: dict[str, Any]) -> None:
        write_record(points, record)
        outcome.records[record["id"]] = record
        outcome.done += 1
        outcome.failed += record["status"] != "ok"
        if bar is not None:
            bar.advance(bar_task)

    if not todo:
        return outcome
    try:
        if backend == "ray":
            _run_ray(todo, finished, address, workers, summarize_fn, bar)
        elif workers == 1:
            if bar is not None:
                bar.start()
            for t in todo:
                finished(run_task(t, summarize_fn))
        else:
            _run_pool(todo, finished, workers, summarize_fn, bar)
    except KeyboardInterrupt:
        outcome.interrupted = True
    finally:
        if bar is not None:
            bar.stop()
    return outcome


def _run_pool(todo: list[Task], finished, workers: int, summarize_fn, bar) -> None:
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # fork: workers start in milliseconds and inherit the imported simulator; every task is
    # submitted (and the workers started) before the progress bar's thread exists.
    pool = ProcessPoolExecutor(max_workers=min(workers, len(todo)),
                               mp_context=mp.get_context("fork"), initializer=_ignore_sigint)
    try:
        pending = {pool.submit(run_task, t, summarize_fn) for t in todo}
        if bar is not None:
            bar.start()
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: f.result()["id"]):
                finished(f.result())
    except BaseException:
        for p in list(getattr(pool, "_processes", {}).values()):
            p.terminate()  # stop runs in flight; nothing of theirs was written
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _run_ray(todo: list[Task], finished, address: str | None, workers: int, summarize_fn,
             bar) -> None:
    try:
        import ray
    except ImportError:
        raise ConfigError("--backend ray needs Ray: pip install 'kvsim[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address not in (None, "", "local"):
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = workers
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError) as e:
            raise ConfigError(f"cannot connect to the Ray cluster at {address}: {e}") from None
    try:
        remote = ray.remote(num_cpus=1)(run_task)
        pending = [remote.remote(t, summarize_fn) for t in todo]
        if bar is not None:
            bar.start()
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                finished(ray.get(ref))
    except BaseException:
        for ref in locals().get("pending", []):
            ray.cancel(ref, force=True)
        raise
    finally:
        if started_here:
            ray.shutdown()


# --- the table -------------------------------------------------------------------------------
def build_table(tasks: list[Task], records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """One row per grid point, in grid order: grid columns, seeds (how many have a record),
    status ('ok', 'error', 'partial' or 'missing'), error, num_gpu_blocks, then the metrics
    (mean over seeds, `.ci95` half-widths when > 1 seed)."""
    points: dict[str, list[Task]] = {}
    for t in tasks:
        points.setdefault(json.dumps(t.params, sort_keys=True, default=str), []).append(t)
    rows = []
    for group in points.values():
        row: dict[str, Any] = dict(group[0].params)
        recs = [records.get(t.id) for t in group]
        ok = [r for r in recs if r is not None and r["status"] == "ok"]
        errors = [r["error"] for r in recs if r is not None and r["status"] == "error"]
        row["seeds"] = len(ok)
        row["status"] = ("ok" if len(ok) == len(group) else "error" if errors and not ok
                         else "missing" if not ok and not errors else "partial")
        row["error"] = errors[0] if errors else None
        row["num_gpu_blocks"] = ok[0]["num_gpu_blocks"] if ok else None
        grid_keys = set(row)  # a metric never overwrites a grid column (cluster.replicas is both)
        if len(ok) == 1:
            row.update({k: v for k, v in ok[0]["metrics"].items() if k not in grid_keys})
        elif len(ok) > 1:
            agg = aggregate_seeds([r["seed"] for r in ok], [_unflatten(r["metrics"]) for r in ok])
            for path, m in agg["metrics"].items():
                if path not in grid_keys:
                    row[path] = m["mean"]
                    row[f"{path}.ci95"] = m["ci95_half_width"]
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in list(tasks[0].params) if tasks else []:
        if df[col].map(type).nunique() > 1:  # parquet needs one type per column
            df[col] = df[col].astype(str)
    return df


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, v in flat.items():
        node = out
        *head, last = path.split(".")
        for p in head:
            node = node.setdefault(p, {})
        node[last] = v
    return out


def write_table(df: pd.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    pq, csv = out_dir / "sweep.parquet", out_dir / "sweep.csv"
    tmp = out_dir / ".sweep.parquet.tmp"
    df.to_parquet(tmp, index=False)
    os.replace(tmp, pq)
    tmp = out_dir / ".sweep.csv.tmp"
    df.to_csv(tmp, index=False)
    os.replace(tmp, csv)
    return pq, csv


# --- plots -----------------------------------------------------------------------------------
# metric path -> (scale, label with unit)
METRIC_UNITS = {
    "latency_s": (1e3, "ms"), "throughput.requests_per_s": (1.0, "req/s"),
    "throughput.output_tokens_per_s": (1.0, "tok/s"), "throughput.input_tokens_per_s": (1.0, "tok/s"),
    "slo.goodput_requests_per_s": (1.0, "req/s"), "makespan_s": (1.0, "s"), "busy_s": (1.0, "s"),
    "preemptions.per_s": (1.0, "1/s"),
}
KEY_UNITS = {"block_size": "tokens", "max_num_seqs": "sequences", "max_num_batched_tokens": "tokens",
             "prefill_chunk_size": "tokens", "max_model_len": "tokens", "rate": "req/s",
             "target_rate": "req/s", "gpu_memory_utilization": "share of GPU memory",
             "tensor_parallel_size": "GPUs", "replicas": "replicas", "swap_space_gib": "GiB",
             "eviction_ttl_s": "s", "num_requests": "requests"}


def metric_label(metric: str) -> tuple[float, str]:
    for prefix, (scale, unit) in METRIC_UNITS.items():
        if metric == prefix or metric.startswith(prefix + "."):
            return scale, f"{metric} ({unit})"
    if "share" in metric or "usage" in metric or "hit_rate" in metric or metric.endswith(".rate"):
        return 1.0, f"{metric} (fraction)"
    return 1.0, f"{metric} (count)"


def key_label(key: str) -> str:
    unit = KEY_UNITS.get(key.rsplit(".", 1)[-1])
    return f"{key} ({unit})" if unit else key


def plot_sweep(df: pd.DataFrame, metric: str, x: str, y: str | None, out: Path,
               kind: str = "auto") -> Path:
    """Heatmap of `metric` over (x, y), or a line plot (x on the axis, one line per y);
    points that failed are drawn as 'error' cells / gaps."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if metric not in df:
        raise ConfigError(f"--metric {metric!r} is not a column of the sweep table"
                          f"{did_you_mean(metric, [c for c in df.columns])}")
    for k in (x, y):
        if k is not None and k not in df:
            raise ConfigError(f"plot axis {k!r} is not a grid key; grid keys: "
                              f"{', '.join(c for c in df.columns if c not in ('seeds', 'status'))}")
    scale, mlabel = metric_label(metric)
    kind = ("heatmap" if y is not None else "line") if kind == "auto" else kind
    fig = Figure(figsize=(7.5, 5.0))
    ax = fig.add_subplot()
    xs = list(dict.fromkeys(df[x]))
    if kind == "heatmap" and y is not None:
        ys = list(dict.fromkeys(df[y]))
        z = np.full((len(ys), len(xs)), np.nan)
        for _, r in df.iterrows():
            v = r.get(metric)
            if r["status"] in ("ok", "partial") and v is not None and np.isfinite(v):
                z[ys.index(r[y]), xs.index(r[x])] = v * scale
        im = ax.imshow(z, origin="lower", aspect="auto", cmap="viridis")
        fig.colorbar(im, ax=ax, label=mlabel)
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
        ax.set_yticks(range(len(ys)), [str(v) for v in ys])
        ax.set_ylabel(key_label(y))
        finite = z[np.isfinite(z)]
        mid = (finite.min() + finite.max()) / 2 if len(finite) else 0
        for i in range(len(ys)):
            for j in range(len(xs)):
                v = z[i, j]
                txt = "error" if not np.isfinite(v) else f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
                ax.text(j, i, txt, ha="center", va="center", fontsize=8,
                        color="white" if not np.isfinite(z[i, j]) or z[i, j] < mid else "black")
    else:
        groups = [(None, df)] if y is None else list(df.groupby(y, sort=False))
        for name, g in groups:
            g = g[g.status.isin(["ok", "partial"])]
            label = None if name is None else f"{y.rsplit('.', 1)[-1]}={name}"
            vals = g[metric].astype(float) * scale
            ci = f"{metric}.ci95"
            if ci in g and g[ci].notna().any():
                ax.errorbar(g[x], vals, yerr=g[ci].astype(float) * scale, marker="o", capsize=3,
                            label=label)
            else:
                ax.plot(g[x], vals, marker="o", label=label)
        ax.set_ylabel(mlabel)
        if y is not None:
            ax.legend(title=key_label(y), fontsize=8)
        ax.grid(alpha=0.3)
    ax.set_xlabel(key_label(x))
    ax.set_title(f"{metric} over {x}" + (f" x {y}" if y else ""), fontsize=10)
    fig.tight_layout()
    FigureCanvasAgg(fig)
    fig.savefig(out, dpi=110, metadata={"Software": None})
    return out


# --- the whole sweep -------------------------------------------------------------------------
@dataclass
class SweepSpec:
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    seeds: list[int]


def load_sweep(config_path: str | None, grid_items: list[str], num_seeds: int | None = None,
               overrides: list[str] | None = None) -> SweepSpec:
    """Base config (the file without its `sweep:` section, plus --set overrides), the grid
    (the file's sweep.grid, then --grid, which wins per key) and the seeds."""
    data = load_config(config_path)
    section = data.pop("sweep", None) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"sweep: expected a mapping with grid, seeds; got {section!r}")
    for key in section:
        if key not in ("grid", "seeds"):
            raise ConfigError(f"sweep: unknown key {key!r}{did_you_mean(key, ['grid', 'seeds'])}; "
                              f"valid: grid, seeds")
    grid = section.get("grid") or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"sweep.grid: expected a mapping key -> [values], got {grid!r}")
    grid = {k: (v if isinstance(v, list) else [v]) for k, v in grid.items()}
    grid.update(parse_grid(grid_items))
    grid = check_grid(grid)
    apply_overrides(data, overrides)
    n = num_seeds if num_seeds is not None else section.get("seeds", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"--seeds must be an integer >= 1, got {n!r}")
    first = data.get("seed", 0)
    from_dict(data)  # the base itself must be valid (grid values are checked per point)
    return SweepSpec(data, grid, [first + i for i in range(n)])
