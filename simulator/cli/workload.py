"""`kvsim workload inspect FILE|YAML` and `kvsim workload formats`.

`inspect` builds the workload exactly as `kvsim run` would (same config, same seed stream)
and prints its shape: request count, duration, mean rate, inter-arrival CV, prompt/output
length percentiles, tenants, sessions, prefix reuse and loading counts; it also writes a PNG
(arrival rate over time, length histograms). Definitions (docs/workloads.md):
- duration_s = last arrival - first arrival; mean_rate_rps = (n - 1) / duration_s;
- interarrival_cv = std / mean of the n - 1 gaps (population std, ddof = 0);
- percentiles are numpy's linear interpolation.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.cli.common import check_out_file, display_path
from simulator.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from simulator.workload.generators import RequestArrays

PERCENTILES = (50, 90, 99)

INSPECT_DESCRIPTION = """Build a workload exactly as `kvsim run` would (same config, same seed) and
print its shape: request count, duration, mean rate, inter-arrival CV, prompt and output
length percentiles, tenants, sessions, prefix reuse; and draw a PNG (arrival rate over time,
length histograms). Definitions: duration = last arrival - first arrival; mean rate =
(n - 1) / duration; inter-arrival CV = std / mean of the gaps (docs/workloads.md)."""

INSPECT_EPILOG = """examples:
  kvsim workload inspect workloads/chat.yaml
  kvsim workload inspect ../traces/azure_conv.csv --set duration_s=600 --no-png
  kvsim workload inspect my.yaml --json > stats.json"""


def register(sub, help: str) -> None:
    p = sub.add_parser("workload", help=help,
                       description="Look at a workload before simulating it: `inspect` prints its rate, "
                                   "lengths, tenants, sessions and prefix reuse and draws a PNG; "
                                   "`formats` lists the trace formats kvsim reads.")
    wsub = p.add_subparsers(dest="workload_command", metavar="ACTION", title="actions")
    i = wsub.add_parser("inspect", help="statistics and a PNG of a trace file or workload YAML",
                        description=INSPECT_DESCRIPTION, epilog=INSPECT_EPILOG)
    i.add_argument("source", help="trace file (CSV/JSONL, format auto-detected) or YAML config "
                                  "(a full config with a workload: section, or just that section)")
    i.add_argument("--format", help="trace format (default: auto-detect)")
    i.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a workload field, e.g. --set window_start_s=600 "
                        "--set duration_s=600 --set target_rate=10")
    i.add_argument("--seed", type=int, help="random seed (default: the config's, else 0)")
    i.add_argument("--png", help="where to write the PNG (default runs/inspect/<name>.png)")
    i.add_argument("--no-png", action="store_true", help="skip the PNG")
    i.add_argument("--json", action="store_true", help="print the stats as JSON")
    i.set_defaults(func=inspect_main)
    f = wsub.add_parser("formats", help="list the trace formats, arrival processes and length laws",
                        description="List the trace formats kvsim reads (workload.format), the "
                                    "arrival processes and the length distributions.")
    f.set_defaults(func=formats_main)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def load_source(source: str, fmt: str | None = None, overrides: list[str] | None = None,
                seed: int | None = None):
    """(SimConfig, RequestArrays) for a trace file or a YAML config, as `kvsim run` builds it."""
    import numpy as np
    import yaml

    from simulator.config.schema import apply_override, from_dict, load_config
    from simulator.config.workload import WorkloadConfig
    from simulator.workload.load import generate

    path = Path(source)
    fields = set(WorkloadConfig.model_fields)
    if path.suffix in (".yaml", ".yml"):
        data = load_config(path)
        if "workload" not in data and data and set(data) <= fields:
            data = {"workload": data}  # a bare workload section
    else:
        data = {"workload": {"trace": source}}
    if fmt:
        if not (data.get("workload") or {}).get("trace"):
            raise ConfigError(f"--format {fmt}: {source} has no workload.trace (its requests are "
                              f"generated); --format names the format of a trace file")
        data["workload"]["format"] = fmt
    origins: dict = {}  # (a tagged mapping switched by --set keeps only what its member takes)
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = (x.strip() for x in item.split("=", 1))
        if key.split(".")[0] in fields:
            key = f"workload.{key}"
        apply_override(data, key, yaml.safe_load(value), origins)
    if seed is not None:
        data["seed"] = seed
    config = from_dict(data)
    seed_seq = np.random.SeedSequence(config.seed).spawn(2)[0]  # the runner's workload stream
    return config, generate(config.workload, seed_seq)


def _dist(values: np.ndarray) -> dict[str, float]:
    import numpy as np

    v = np.asarray(values, dtype=np.float64)
    out = {"mean": float(v.mean()), "min": float(v.min())}
    out.update({f"p{q}": float(np.percentile(v, q)) for q in PERCENTILES})
    out["max"] = float(v.max())
    return out


def describe(work: RequestArrays) -> dict[str, Any]:
    """Summary statistics of a workload (module docstring has the definitions)."""
    import numpy as np

    from simulator.workload.generators import ChunkIds

    n = len(work)
    t = work.arrival_s
    gaps = np.diff(t)
    duration = float(t[-1] - t[0]) if n else 0.0
    stats: dict[str, Any] = {
        "num_requests": n,
        "duration_s": duration,
        "mean_rate_rps": (n - 1) / duration if duration > 0 else None,
        "interarrival_cv": float(gaps.std() / gaps.mean()) if n > 2 and gaps.mean() > 0 else None,
        "prompt_tokens": _dist(work.prompt_tokens),
        "output_tokens": _dist(work.output_tokens),
        "total_prompt_tokens": int(work.prompt_tokens.sum()),
        "total_output_tokens": int(work.output_tokens.sum()),
    }
    if work.tenant is not None:
        names, counts = np.unique(work.tenant, return_counts=True)
        stats["tenants"] = {str(k): int(c) for k, c in zip(names, counts)}
    if work.session_id is not None:
        sid = work.session_id[work.session_id >= 0]
        stats["sessions"] = int(len(np.unique(sid)))
    if work.prefix is not None:
        flat = work.prefix.flat if isinstance(work.prefix, ChunkIds) else \
            np.concatenate([np.asarray(p, np.int64) for p in work.prefix])
        unique = len(np.unique(flat))
        stats["prefix"] = {"block_tokens": work.prefix_block_tokens, "chunks": int(len(flat)),
                           "unique_chunks": unique,
                           "repeated_chunk_share": (len(flat) - unique) / len(flat) if len(flat) else 0.0}
    stats["info"] = {k: v for k, v in work.info.items()}
    return stats


def _nice_bin(duration_s: float, target_bins: int = 120) -> float:
    import numpy as np

    for width in (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
                  14400, 21600, 43200, 86400):
        if duration_s / width <= target_bins:
            return float(width)
    return 86400.0 * np.ceil(duration_s / 86400 / target_bins)


def _fmt_bin(width: float) -> str:
    return f"{width:g} s" if width < 60 else f"{width / 60:g} min" if width < 3600 \
        else f"{width / 3600:g} h"


def plot(work: RequestArrays, stats: dict[str, Any], title: str, out: Path) -> Path:
    """PNG: arrival rate over time (per tenant when there are a few), length histograms."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = work.arrival_s
    duration = max(stats["duration_s"], 1e-9)
    width = _nice_bin(duration)
    scale, unit = (1.0, "s") if duration <= 600 else (60.0, "min") if duration <= 3 * 3600 \
        else (3600.0, "h")
    edges = np.arange(0.0, duration, width)
    edges = np.append(edges, duration) if len(edges) else np.array([0.0, width])
    widths = np.diff(edges)  # the last bin may be shorter: rate = count / its own width
    fig = plt.figure(figsize=(12, 7.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[1.1, 1])
    ax = fig.add_subplot(grid[0, :])
    series = [("all", t)]
    top = 0.0
    if work.tenant is not None and 1 < len(stats.get("tenants", {})) <= 8:
        series += [(name, t[work.tenant == name]) for name in stats["tenants"]]
    for i, (name, times) in enumerate(series):
        counts, _ = np.histogram(times, bins=edges)
        rate = np.append(counts / widths, counts[-1] / widths[-1])
        top = max(top, float(rate.max()))
        ax.step(edges / scale, rate, where="post", lw=1.6 if i == 0 else 1.0,
                color="black" if i == 0 else None, label=name if len(series) > 1 else None)
    if stats["mean_rate_rps"]:
        ax.axhline(stats["mean_rate_rps"], ls="--", color="tab:red", lw=1,
                   label=f"mean {stats['mean_rate_rps']:.2f} req/s")
    ax.set_xlabel(f"time since first request ({unit})")
    ax.set_ylabel(f"arrival rate (req/s, {_fmt_bin(width)} bins)")
    ax.set_xlim(0, edges[-1] / scale)
    ax.set_ylim(0, top * 1.2 + 1e-9)  # headroom for the legend
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=9, ncol=min(len(series) + 1, 5))
    cv = stats["interarrival_cv"]
    ax.set_title(f"{stats['num_requests']:,} requests over {duration / 60:.1f} min; "
                 f"inter-arrival CV {cv:.2f}" if cv is not None else
                 f"{stats['num_requests']:,} requests", fontsize=11)
    for col, (key, label) in enumerate((("prompt_tokens", "prompt length (tokens)"),
                                        ("output_tokens", "output length (tokens)"))):
        axh = fig.add_subplot(grid[1, col])
        values = getattr(work, key)
        lo, hi = max(int(values.min()), 1), int(values.max())
        log = hi / lo > 50
        bins = np.geomspace(lo, hi + 1, 60) if log else np.linspace(lo, hi + 1, min(60, hi - lo + 2))
        axh.hist(values, bins=bins, color="tab:blue" if col == 0 else "tab:green", alpha=0.8)
        if log:
            axh.set_xscale("log")
        s = stats[key]
        for q, ls in (("p50", "-"), ("p99", ":")):
            axh.axvline(s[q], color="black", ls=ls, lw=1, label=f"{q} {s[q]:,.0f}")
        axh.set_xlabel(label + (" [log scale]" if log else ""))
        axh.set_ylabel("requests")
        axh.set_title(f"mean {s['mean']:,.0f}, max {s['max']:,.0f}", fontsize=10)
        axh.legend(fontsize=9)
        axh.grid(alpha=0.3)
    fig.suptitle(title, fontsize=12)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _row(name: str, d: dict[str, float]) -> str:
    return f"  {name:<8}" + "".join(f"{d[k]:>11,.1f}" for k in ("mean", "min", "p50", "p90", "p99", "max"))


def format_stats(stats: dict[str, Any], title: str) -> str:
    lines = [f"workload  {title}",
             f"  requests          {stats['num_requests']:,}",
             f"  duration          {stats['duration_s']:,.1f} s ({stats['duration_s'] / 60:.1f} min)"]
    if stats["mean_rate_rps"] is not None:
        lines.append(f"  mean rate         {stats['mean_rate_rps']:.3f} req/s")
    if stats["interarrival_cv"] is not None:
        lines.append(f"  inter-arrival CV  {stats['interarrival_cv']:.3f}")
    lines.append("  tokens   " + "".join(f"{k:>11}" for k in ("mean", "min", "p50", "p90", "p99", "max")))
    lines.append(_row("prompt", stats["prompt_tokens"]))
    lines.append(_row("output", stats["output_tokens"]))
    if "tenants" in stats:
        lines.append("  tenants           " + ", ".join(f"{k} {v:,}" for k, v in stats["tenants"].items()))
    if "sessions" in stats:
        lines.append(f"  sessions          {stats['sessions']:,}")
    if "prefix" in stats:
        p = stats["prefix"]
        lines.append(f"  prefix chunks     {p['chunks']:,} of {p['block_tokens']} tokens, "
                     f"{p['unique_chunks']:,} unique, {p['repeated_chunk_share']:.1%} repeat an "
                     f"earlier chunk")
    info = {k: v for k, v in stats["info"].items() if k != "source"}
    if info:
        lines.append("  loading           " + ", ".join(f"{k}={v}" for k, v in info.items()))
    return "\n".join(lines)


def _shown_source(source: str) -> str:
    """A trace's `info["source"]` ("<resolved path> (<format>)") with the path as the user knows it."""
    path, sep, fmt = source.rpartition(" (")
    return f"{display_path(path)}{sep}{fmt}" if sep else display_path(source)


def inspect_main(args: argparse.Namespace) -> int:
    import json

    png = None
    if not args.no_png:
        png = Path(args.png) if args.png else Path("runs/inspect") / f"{Path(args.source).stem}.png"
        check_out_file(png, "--png")
    config, work = load_source(args.source, args.format, args.overrides, args.seed)
    if len(work) == 0:
        raise ConfigError(f"workload {args.source}: no requests")
    stats = describe(work)
    if "source" in stats["info"]:
        stats["info"]["source"] = _shown_source(stats["info"]["source"])
    trace = stats["info"].get("source")
    if Path(args.source).suffix in (".yaml", ".yml"):
        title = f"{display_path(args.source)}" + (f": trace {trace}" if trace else
                                                  f" (synthetic, seed {config.seed})")
    else:
        title = trace or display_path(args.source)
    if png is not None:
        stats["png"] = str(plot(work, stats, title, png))
    if args.json:
        print(json.dumps(stats, indent=2, sort_keys=True))
    else:
        print(format_stats(stats, title))
        if "png" in stats:
            print(f"wrote {stats['png']}")
    return 0


def formats_main(args: argparse.Namespace) -> int:
    from simulator.workload.generators import ARRIVALS, LENGTHS
    from simulator.workload.traces import _DETECT_ORDER, TRACE_FORMATS

    print("trace formats (workload.format; auto-detected in this order):")
    for name in _DETECT_ORDER:
        print(f"  {name:<10} {TRACE_FORMATS.get(name).about}")
    print("  generic    any CSV/JSONL: workload.columns maps timestamp, prompt_tokens, "
          "output_tokens[, hash_ids, tenant, priority, session_id]")
    print(f"arrival processes (workload.arrival.process): {', '.join(ARRIVALS.names())}")
    print(f"length distributions (dist): {', '.join(LENGTHS.names())}")
    return 0

