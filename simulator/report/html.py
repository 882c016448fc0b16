"""One self-contained HTML page per run directory: what a user attaches to a capacity review.

Sections: run identity, alerts (which fired; each firing), the summary tables, the plots
(PNG embedded as base64, so the page is one file), and the resolved config. For a
`kvsim run --seeds N` directory the summary table shows mean and 95 % interval over seeds,
and the plots are the first seed's. The page holds no wall-clock time: same run, same bytes.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError
from simulator.metrics.alerts import alerts_document, evaluate, resolve_rules
from simulator.report.plots import first_seed_dir, load_run, plot_run, read_json

MAX_FIRINGS_LISTED = 30

CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; }
table { border-collapse: collapse; margin: .5em 0 1.2em; font-size: .92em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
.fired { color: #b00; font-weight: bold; } .ok { color: #070; }
pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: .85em; }
img { max-width: 100%; border: 1px solid #eee; margin: .5em 0; }
.note { color: #666; font-size: .9em; }
"""


def _fmt(v: Any, scale: float = 1.0, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        x = v * scale
        return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"  # no 1.2e+04
    return html.escape(str(v))


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary_rows(s: dict[str, Any]) -> list[tuple[str, list[list[str]]]]:
    """(title, rows of [metric, value]) per summary section, read from summary.json."""
    r, t, kv, fr, b, q, p, slo, pc = (s["requests"], s["throughput"], s["kv_cache"],
                                      s["fragmentation"], s["batch"], s["queue"],
                                      s["preemptions"], s["slo"], s["prefix_cache"])
    pct = lambda v: "–" if v is None else f"{v:.2%}"  # noqa: E731
    return [
        ("Requests and throughput", [
            ["arrived / finished / rejected", f"{r['arrived']:,} / {r['finished']:,} / {r['rejected']:,}"],
            ["makespan (s)", _fmt(s["makespan_s"])],
            ["throughput (req/s)", _fmt(t["requests_per_s"])],
            ["input tokens/s", _fmt(t["input_tokens_per_s"])],
            ["output tokens/s", _fmt(t["output_tokens_per_s"])],
        ]),
        ("SLO goodput", [
            ["targets", f"TTFT ≤ {_fmt(slo['ttft_s'])} s, TPOT ≤ {_fmt(slo['tpot_s'])} s"],
            ["requests meeting both", f"{slo['met']:,} ({pct(slo['share'])} of arrived)"],
            ["goodput (req/s)", _fmt(slo["goodput_requests_per_s"])],
        ]),
        ("KV cache", [
            ["pool (token slots)", _fmt(kv["total_slots"])],
            ["usage mean / p95 / max (time-weighted)",
             f"{pct(kv['usage_mean'])} / {pct(kv['usage_p95'])} / {pct(kv['usage_max'])}"],
            ["prefix-cache hit rate", pct(pc["hit_rate"])],
            ["token-state share of KV memory", pct(fr["token_state_share"])],
            ["internal fragmentation (mean slots; share of allocated)",
             f"{_fmt(fr['internal_slots_mean'])}; {pct(fr['internal_share_of_allocated'])}"],
            ["external fragmentation (mean slots)", _fmt(fr["external_slots_mean"])],
        ]),
        ("Batching and queue", [
            ["engine steps", _fmt(b["num_iterations"])],
            ["sequences per step mean / p50 / p99 / max",
             " / ".join(_fmt(b["num_seqs"][k]) for k in ("mean", "p50", "p99", "max"))],
            ["tokens per step mean / p50 / p99 / max",
             " / ".join(_fmt(b["num_tokens"][k]) for k in ("mean", "p50", "p99", "max"))],
            ["waiting requests mean / p95 / max (time-weighted)",
             " / ".join(_fmt(q[k]) for k in ("pending_mean", "pending_p95", "pending_max"))],
            ["running requests mean", _fmt(q["running_mean"])],
        ]),
        ("Preemptions", [
            ["total", _fmt(p["total"])],
            ["per second", _fmt(p["per_s"])],
            ["requests preempted at least once", pct(p["requests_share"])],
            ["preemptions / (preemptions + finishes)", pct(p["rate"])],
        ]),
    ]


def _latency_table(s: dict[str, Any]) -> str:
    keys = ("mean", "p50", "p90", "p99", "max")
    rows = [[name.upper(), *(_fmt(s["latency_s"][name][k], 1e3) for k in keys)]
            for name in ("ttft", "tpot", "itl", "e2e", "queue")]
    return _table(["latency (ms)", *keys], rows)


def _alerts_html(doc: dict[str, Any]) -> str:
    rows = []
    for rule in doc["rules"]:
        mine = [f for f in doc["firings"] if f["rule"] == rule["name"]]
        fired = ('<span class="fired">FIRED</span>' if mine else '<span class="ok">no</span>')
        rows.append([html.escape(rule["name"]), html.escape(rule["condition"]), fired,
                     _fmt(len(mine)), _fmt(sum(f["duration_s"] for f in mine)),
                     _fmt(max((f["peak"] for f in mine), default=None))])
    out = _table(["rule", "condition", "fired", "firings", "firing time (s)", "peak"], rows)
    firings = doc["firings"]
    if firings:
        listed = firings[:MAX_FIRINGS_LISTED]
        out += _table(["rule", "start (s)", "end (s)", "duration (s)", "peak", "at (s)"],
                      [[html.escape(f["rule"]), _fmt(f["start_s"]), _fmt(f["end_s"]),
                        _fmt(f["duration_s"]), _fmt(f["peak"]), _fmt(f["peak_s"])] for f in listed])
        if len(firings) > len(listed):
            out += (f'<p class="note">… and {len(firings) - len(listed)} more firings in '
                    f"alerts.json.</p>")
    return out


def _plots_html(run_dir: Path) -> str:
    parts = []
    for path in plot_run(run_dir):
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">')
    return "\n".join(parts)


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>{CSS}</style></head><body>\n<h1>{html.escape(title)}</h1>\n{body}\n"
            f"</body></html>\n")


def _alerts_doc(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "alerts.json"
    if path.is_file():
        return read_json(path)
    requests, iterations, config = load_run(run_dir)
    rules = resolve_rules(config.get("alerts"))
    return alerts_document(rules, evaluate(rules, requests, iterations))


def single_run_page(run_dir: Path) -> str:
    path = run_dir / "summary.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no summary.json); "
                          f"make one with `kvsim run --out {run_dir}`")
    s = read_json(path)
    c = s.get("config", {})
    title = f"kvsim run: {c.get('model', '?')} on {c.get('gpu', '?')}"
    ident = (f"<p>{_fmt(c.get('kv_allocator'))} KV ({_fmt(c.get('num_gpu_blocks'))} blocks of "
             f"{_fmt(c.get('block_size'))} tokens), {_fmt(c.get('scheduler'))} batching, "
             f"tp={_fmt(c.get('tensor_parallel_size'))}, seed {_fmt(c.get('seed'))}; "
             f"summary schema_version {s.get('schema_version')}"
             + ("" if c.get("cost_model_calibrated", True) else
                "; <b>cost model uses uncalibrated default efficiencies</b>") + "</p>")
    fired = s.get("alerts", {}).get("fired", [])
    verdict = (f'Fired: <span class="fired">{html.escape(", ".join(fired))}</span>' if fired
               else "No alert fired.")
    body = [ident, "<h2>Alerts</h2>", f"<p>{verdict}</p>", _alerts_html(_alerts_doc(run_dir)),
            "<h2>Summary</h2>", _latency_table(s)]
    for name, rows in _summary_rows(s):
        body += [f"<h3>{html.escape(name)}</h3>", _table(["metric", "value"], rows)]
    body += ["<h2>Plots</h2>", _plots_html(run_dir)]
    cfg = run_dir / "config.yaml"
    if cfg.is_file():
        body += ["<h2>Configuration (resolved)</h2>", f"<pre>{html.escape(cfg.read_text())}</pre>"]
    return _page(title, "\n".join(body))


def multi_seed_page(run_dir: Path) -> str:
    agg = read_json(run_dir / "seeds_summary.json")
    seeds = agg["seeds"]
    first = first_seed_dir(run_dir)
    c = {}
    if first is not None and (first / "summary.json").is_file():
        c = read_json(first / "summary.json").get("config", {})
    title = f"kvsim run over {len(seeds)} seeds: {c.get('model', '?')} on {c.get('gpu', '?')}"
    rows = []
    for path, m in agg["metrics"].items():
        rows.append([html.escape(path), _fmt(m["mean"]), f"{_fmt(m['ci95_low'])} .. {_fmt(m['ci95_high'])}",
                     f"{_fmt(m['pi95_low'])} .. {_fmt(m['pi95_high'])}", _fmt(m["n"]),
                     ", ".join(_fmt(v) for v in m["values"])])
    fired = [[html.escape(k), f"{v} of {len(seeds)}"] for k, v in agg["alerts_fired_in"].items()]
    body = [f"<p>seeds {', '.join(map(str, seeds))}. ci95: 95% interval of the mean, "
            f"mean ± t<sub>0.975, n−1</sub>·s/√n; pi95: 95% prediction interval for one more "
            f"seed, mean ± t<sub>0.975, n−1</sub>·s·√(1+1/n). Plots and config: seed {seeds[0]}.</p>",
            "<h2>Alerts</h2>", _table(["rule", "fired in"], fired),
            "<h2>Summary over seeds</h2>",
            _table(["metric", "mean", "ci95", "pi95", "n", "per seed"], rows)]
    if first is not None:
        body += [f"<h2>Plots (seed {seeds[0]})</h2>", _plots_html(first)]
        cfg = first / "config.yaml"
        if cfg.is_file():
            body += ["<h2>Configuration (resolved)</h2>", f"<pre>{html.escape(cfg.read_text())}</pre>"]
    return _page(title, "\n".join(body))


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} not found")
    page = (multi_seed_page(run_dir) if (run_dir / "seeds_summary.json").is_file()
            else single_run_page(run_dir))
    path = Path(out) if out is not None else run_dir / "report.html"
    path.write_text(page)
    return path
