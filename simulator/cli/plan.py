"""`kvsim plan [CONFIG.yaml] --rate R [--slo ttft_p99_s=2 --slo tpot_p99_s=0.1]
[--gpus l4,a100-80gb,h100-sxm,h200 --tp 1,2 | --candidate gpu:tp ...] [--price gpu=$/h ...]
[--seeds N] [--requests N] [--max-requests N] [--workers K] [--backend local|ray] [--out DIR]`

For each GPU x TP candidate: the highest request rate one replica sustains within the SLO
(every seed), the replicas needed for R req/s, $/hour and $ per million output tokens; a
ranked table (OUT/plan.csv, plan.parquet), the probes (OUT/probes.csv) and p99 latency vs
rate per candidate (OUT/plan_latency.png); the winner is confirmed by a cluster simulation
at R (OUT/plan.json). The config gives the model and the workload (a trace or generators)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.cli.common import add_worker_args, check_out_dir, make_console
from simulator.errors import ConfigError, did_you_mean

# for --help only: analysis.plan.SLO_FIELDS validates (tests/test_cli_help.py keeps the two in step)
SLO_KEYS = ("ttft_p99_s", "tpot_p99_s", "min_goodput_share")

DESCRIPTION = """Find the cheapest way to serve R req/s within an SLO. For each GPU type x
tensor-parallel candidate: the highest request rate one replica sustains within the SLO (every
seed), the replicas needed for R req/s, $/hour and $ per million output tokens; then the
winner is confirmed by simulating the whole cluster at R. The config gives the model and the
workload (a trace or generators). Writes OUT/plan.csv, plan.parquet, plan.json, probes.csv and
OUT/plan_latency.png (p99 latency vs rate per candidate)."""

EPILOG = """examples:
  kvsim plan workloads/chat.yaml --rate 50
  kvsim plan my.yaml --rate 20 --gpus a100-80gb,h100-sxm --tp 1,2 --slo ttft_p99_s=1 --workers 2
  kvsim plan my.yaml --rate 20 --candidate h100-sxm:2 --price h100-sxm=2.5"""


def register(sub, help: str) -> None:
    p = sub.add_parser("plan", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("config", nargs="?", help="YAML config: model and workload (trace or generators)")
    p.add_argument("--rate", type=float, required=True, help="target request rate (req/s)")
    p.add_argument("--slo", action="append", default=[], metavar="KEY=VALUE",
                   help=f"SLO: {', '.join(SLO_KEYS)} (default ttft_p99_s=2, tpot_p99_s=0.1)")
    p.add_argument("--gpus", default="l4,a100-80gb,h100-sxm,h200",
                   help="comma-separated GPU names (default l4,a100-80gb,h100-sxm,h200)")
    p.add_argument("--tp", default="1", help="comma-separated TP degrees (default 1)")
    p.add_argument("--candidate", action="append", default=[], metavar="GPU:TP",
                   help="explicit candidates instead of --gpus x --tp")
    p.add_argument("--price", action="append", default=[], metavar="GPU=USD",
                   help="$/GPU-hour for a GPU (default: price_per_hour in its profile)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field")
    p.add_argument("--seeds", type=int, default=2, metavar="N",
                   help="probe simulations per rate (default 2)")
    p.add_argument("--requests", type=int, default=400, metavar="N",
                   help="requests per probe (default 400)")
    p.add_argument("--cluster-requests", type=int, default=1500, metavar="N",
                   help="requests in the confirming cluster simulation (default 1500)")
    p.add_argument("--max-requests", type=int, default=20_000, metavar="N",
                   help="at most this many requests when a probe or cluster run is raised so that "
                        "its arrivals span 3 mean latencies (a steady state; default 20000)")
    p.add_argument("--router", default="least_outstanding",
                   help="router of the cluster check (default least_outstanding)")
    add_worker_args(p)
    p.add_argument("--no-confirm", action="store_true", help="skip the cluster simulation")
    p.add_argument("--disaggregated", action="store_true",
                   help="also plan prefill/decode fleets (P:D) for the two cheapest candidates "
                        "(docs/disaggregation.md)")
    p.add_argument("--out", default="runs/plan", metavar="DIR", help="output directory (default runs/plan)")
    p.add_argument("--quiet", action="store_true", help="print only the output directory")
    p.set_defaults(func=main)


def _pairs(items: list[str], what: str) -> dict[str, object]:
    from simulator.config.schema import parse_value

    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--{what} expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = parse_value(v.strip())
    return out


def build_planner(args: argparse.Namespace, log):
    from simulator.analysis.plan import SLO_FIELDS, Planner, PlanSettings, PlanSlo, parse_candidates
    from simulator.config.schema import apply_override, from_dict, load_config

    data = load_config(args.config)
    data.pop("sweep", None)
    origins: dict = {}  # (a tagged mapping switched by --set keeps only what its member takes)
    for k, v in _pairs(args.overrides, "set").items():
        apply_override(data, k, v, origins)
    from_dict(data)
    slo_items = _pairs(args.slo, "slo")
    for k in slo_items:
        if k not in SLO_FIELDS:
            raise ConfigError(f"--slo: unknown key {k!r}{did_you_mean(k, SLO_FIELDS)}; "
                              f"valid: {', '.join(SLO_FIELDS)}")
    slo = PlanSlo(**{**{"ttft_p99_s": 2.0, "tpot_p99_s": 0.1}, **slo_items})
    prices = {}
    for k, v in _pairs(args.price, "price").items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ConfigError(f"--price {k}: expected $/GPU-hour >= 0, got {v!r}")
        from simulator.hardware.gpus import get_gpu
        prices[get_gpu(k).name] = float(v)
    tps = []
    for t in str(args.tp).split(","):
        if not t.strip().isdigit() or int(t) < 1:
            raise ConfigError(f"--tp expects comma-separated integers >= 1, got {args.tp!r}")
        tps.append(int(t))
    cands = parse_candidates([g.strip() for g in args.gpus.split(",") if g.strip()], tps, args.candidate)
    if not args.rate > 0:
        raise ConfigError(f"--rate must be > 0 req/s, got {args.rate:g}")
    for name, n, lo in (("--seeds", args.seeds, 1), ("--requests", args.requests, 10),
                        ("--cluster-requests", args.cluster_requests, 10), ("--workers", args.workers, 1),
                        ("--max-requests", args.max_requests, 10)):
        if n < lo:
            raise ConfigError(f"{name} must be >= {lo}, got {n}")
    settings = PlanSettings(target_rate=args.rate, slo=slo, seeds=args.seeds, requests=args.requests,
                            cluster_requests=args.cluster_requests, max_requests=args.max_requests,
                            prices=prices,
                            workers=args.workers, backend=args.backend, address=args.address,
                            router=args.router)
    planner = Planner(data, settings, Path(args.out), log=log)
    planner.candidates = cands
    return planner


def main(args: argparse.Namespace) -> int:
    import json

    from simulator.analysis.plan import confirm_ranking, plot_plan
    from simulator.metrics.summary import clean_floats

    err = make_console(stderr=True)
    log = (lambda s: None) if args.quiet else (lambda s: err.print(s, highlight=False))
    check_out_dir(args.out, "--out")
    planner = build_planner(args, log)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    state = planner.search(planner.candidates)
    table = planner.rank(state)
    probes = planner.probes_frame()
    confirmation, checks = None, []
    if not args.no_confirm and (table.status == "ok").any():
        table, checks = confirm_ranking(planner, table)
        win = table.iloc[0].candidate
        confirmation = next((c for c in checks if c["candidate"] == win), None)
    pd_plans = None
    if args.disaggregated:  # P:D rows beside the colocated ones
        from simulator.analysis.plan_pd import plan_disaggregated
        table, pd_plans = plan_disaggregated(planner, table, log)
    table.to_csv(out / "plan.csv", index=False)
    table.to_parquet(out / "plan.parquet", index=False)
    probes.to_csv(out / "probes.csv", index=False)
    png = plot_plan(probes, planner.s.slo, out / "plan_latency.png") if len(probes) else None
    doc = {"target_rate": args.rate, "slo": planner.s.slo.__dict__,
           "mean_output_tokens": planner.mean_output_tokens,
           "ranking": table.to_dict(orient="records"), "confirmation": confirmation,
           "cluster_checks": checks, **({"disaggregated": pd_plans} if pd_plans is not None else {})}
    (out / "plan.json").write_text(json.dumps(clean_floats(doc), indent=1, default=str) + "\n")
    if args.quiet:
        print(out)
        return 0
    con = make_console()
    print_plan(con, table, args.rate, planner.s.slo, confirmation)
    con.print(f"wrote {out}/plan.csv, plan.parquet, plan.json, probes.csv"
              + (f", {png}" if png else ""), highlight=False)
    return 0


def print_plan(console, table, rate: float, slo, confirmation) -> None:
    from rich.table import Table

    parts = [f"p99 TTFT <= {slo.ttft_p99_s:g} s" if slo.ttft_p99_s else "",
             f"p99 TPOT <= {slo.tpot_p99_s * 1e3:g} ms" if slo.tpot_p99_s else "",
             f"goodput share >= {slo.min_goodput_share:g}" if slo.min_goodput_share else ""]
    t = Table(title=f"plan for {rate:g} req/s, SLO {', '.join(p for p in parts if p)}",
              title_justify="left")
    for col in ("rank", "candidate", "max req/s per replica", "replicas (est.)", "confirmed", "GPUs",
                "$/GPU-h", "$/h", "$/M out tok", "status / note"):
        t.add_column(col, justify="left" if col in ("candidate", "status / note") else "right")
    for _, r in table.iterrows():
        ok = r.status == "ok"
        t.add_row("-" if r["rank"] is None or r["rank"] != r["rank"] else str(int(r["rank"])),
                  r.candidate + (f" {r.layout}" if r.get("layout", "colocated") != "colocated" else ""),
                  f"{r.max_rate_per_replica:.3g}" if ok and r.max_rate_per_replica == r.max_rate_per_replica
                  else "-",
                  str(int(r.replicas)) if ok else "-",
                  str(int(r.confirmed_replicas)) if ok and r.get("confirmed_replicas") is not None
                  and r.confirmed_replicas == r.confirmed_replicas else "-",
                  str(int(r.gpus)) if ok else "-",
                  f"{r.price_per_gpu_hour:.2f}", f"{r.cost_per_hour:.2f}" if ok else "-",
                  f"{r.usd_per_million_output_tokens:.3f}" if ok else "-",
                  (r.note or "ok") if ok else f"infeasible: {r.note}")
    console.print(t)
    if not (table.status == "ok").any():
        console.print("no candidate can meet the SLO (every row is infeasible); relax the SLO or "
                      "add GPUs / TP degrees", style="red", highlight=False)
    if confirmation:
        if confirmation["confirmed"]:
            a, b = confirmation["at_n"], confirmation["at_n_minus_1"]
            console.print(
                f"cluster check of {confirmation['candidate']} at {rate:g} req/s: {a['replicas']} "
                f"replicas meet the SLO (p99 TTFT {a['ttft_p99_s'] * 1e3:.0f} ms, p99 TPOT "
                f"{a['tpot_p99_s'] * 1e3:.1f} ms)"
                + (f"; {b['replicas']} do not ({b['reason']})" if b else "")
                + (f" [estimate was {confirmation['estimated_replicas']}]"
                   if confirmation["estimated_replicas"] != a["replicas"] else ""), highlight=False)
        else:
            console.print(f"cluster check of {confirmation['candidate']}: not confirmed "
                          f"({confirmation['reason']})", style="red", highlight=False)
