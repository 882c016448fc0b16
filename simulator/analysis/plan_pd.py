"""Capacity planning for prefill/decode disaggregation: the cheapest P:D fleet of a GPU type
that serves the target rate within the SLO, beside the colocated plan (`kvsim plan
--disaggregated`; docs/planning.md, docs/disaggregation.md).

For each of the `top` cheapest colocated candidates (GPU x TP, N replicas as planned; the
infeasible ones after the feasible, with no N):
1. the prefill share f: one P/D simulation, 1P:1D at the rate 2 of its colocated replicas
   sustain (a quarter of the target when none does), f = prefill busy time / (prefill +
   decode busy time);
2. a total T of replicas is feasible when some split P + D = T (every split up to T = 4, else
   P near f x T: round down, round up, one fewer, one more), meets the SLO in a cluster
   simulation at the full target rate (`cluster_requests` requests, the plan's router in both
   pools, same GPU type and TP in both pools);
3. T = N first (equal GPU count), then up to N + 2 while not feasible (no colocated fleet:
   T = 2, doubled up to 32); from a feasible T, integer bisection down to the smallest feasible
   T (feasibility taken as monotone in T). It and its best split (highest SLO share, then lowest
   p99 TTFT) are the P/D plan;
4. cost $/h = T x TP x price, as the colocated rows. The rows join the ranking table
   (`layout` colocated | P:D, e.g. "2P:3D").
Every simulation is a sweep task (cached, parallel), like the colocated plan's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from simulator.analysis.plan import Candidate, Planner, _ms


def pd_data(planner: Planner, c: Candidate, p: int, d: int, rate: float) -> dict[str, Any]:
    """A P/D cluster run of candidate c at `rate`: the plan's cluster-check config with
    cluster.mode disaggregated."""
    data = planner.probe_data(c, rate, 0, requests=planner.s.cluster_requests)
    if planner.is_trace:  # the cluster checks replay the base window, as colocated ones do
        base_wl = planner.base.get("workload", {})
        data["workload"]["window_start_s"] = float(base_wl.get("window_start_s", 0.0))
    pool = {"router": planner.s.router}
    data["cluster"] = {"mode": "disaggregated", "prefill": {**pool, "replicas": p},
                       "decode": {**pool, "replicas": d},
                       **({"transfer": planner.base["cluster"]["transfer"]}
                          if "transfer" in (planner.base.get("cluster") or {}) else {})}
    return json.loads(json.dumps(data))


def _splits(total: int, f: float) -> list[tuple[int, int]]:
    """Step 2's splits of `total` replicas, prefill share f (every split up to 4 replicas)."""
    if total <= 4:
        return [(p, total - p) for p in range(1, total)]
    out = []
    for p in (math.floor(total * f), math.ceil(total * f), math.ceil(total * f) - 1,
              math.ceil(total * f) + 1):
        p = min(max(p, 1), total - 1)
        if (p, total - p) not in out:
            out.append((p, total - p))
    return out


def plan_candidate(planner: Planner, c: Candidate, n_colocated: int | None,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Steps 1-3 for one candidate (`n_colocated` None: no colocated fleet meets the SLO): the
    P/D plan (or why none was found) and every check."""
    s = planner.s
    probe_rate = s.target_rate * 2 / n_colocated if n_colocated else s.target_rate / 4
    rec = planner._run([pd_data(planner, c, 1, 1, probe_rate)])[0]
    if rec["status"] != "ok":
        return {"candidate": c.name, "found": False, "reason": rec["error"], "checks": []}
    m = rec["metrics"]
    busy_p, busy_d = m["disaggregation.prefill.busy_s"], m["disaggregation.decode.busy_s"]
    f = busy_p / (busy_p + busy_d) if busy_p + busy_d > 0 else 0.5
    checks: list[dict[str, Any]] = []
    results: dict[int, dict[str, Any] | None] = {}

    def best_at(total: int) -> dict[str, Any] | None:
        if total in results:
            return results[total]
        splits = _splits(total, f)
        recs = planner._run([pd_data(planner, c, p, d, s.target_rate) for p, d in splits])
        ok = []
        for (p, d), r in zip(splits, recs):
            why = r["error"] if r["status"] != "ok" else s.slo.check(r["metrics"])
            mm = r.get("metrics") or {}
            row = {"candidate": c.name, "prefill": p, "decode": d, "meets_slo": not why, "reason": why,
                   "ttft_p99_s": mm.get("latency_s.ttft.p99"), "tpot_p99_s": mm.get("latency_s.tpot.p99"),
                   "slo_share": mm.get("slo.share"),
                   "transfer_share_of_ttft": mm.get("disaggregation.transfer_share_of_ttft")}
            checks.append(row)
            log(f"P/D {c.name} {p}P:{d}D at {s.target_rate:g} req/s: "
                + ("meets the SLO" if not why else f"misses ({why})"))
            if not why:
                ok.append(row)
        ok.sort(key=lambda r: (-(r["slo_share"] or 0.0), r["ttft_p99_s"] or math.inf))
        results[total] = ok[0] if ok else None
        return results[total]

    # 3. bracket [lo infeasible, hi feasible], then integer bisection (feasibility taken as
    # monotone in T); one replica is no P/D fleet
    if n_colocated is not None:
        lo, hi, cap = 1, max(n_colocated, 2), max(n_colocated, 2) + 2
    else:
        lo, hi, cap = 1, 2, 32
    while best_at(hi) is None:
        if hi >= cap:
            break
        lo, hi = hi, (min(hi + 1, cap) if n_colocated is not None else min(hi * 2, cap))
    if best_at(hi) is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if best_at(mid) is not None:
                hi = mid
            else:
                lo = mid
    total = hi
    found = results.get(total)
    if found is None:
        return {"candidate": c.name, "found": False, "prefill_share": f, "checks": checks,
                "reason": f"no P:D split of up to {total} replicas meets the SLO at {s.target_rate:g} req/s"}
    return {"candidate": c.name, "found": True, "prefill_share": f, "total": total, **found,
            "checks": checks}


def plan_disaggregated(planner: Planner, table: pd.DataFrame, log: Callable[[str], None],
                       top: int = 2) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Step 4: the ranking table with a `layout` column and one P/D row per planned candidate,
    re-ranked by cost (ties: fewer GPUs, then colocated first); and each candidate's plan."""
    by_name = {c.name: c for c in planner.candidates}
    table = table.copy()
    table.insert(2, "layout", "colocated")
    rows, plans = [], []
    order = pd.concat([table[table.status == "ok"], table[table.status != "ok"]])
    for _, row in order.head(top).iterrows():
        c = by_name[row.candidate]
        n = row.get("confirmed_replicas")
        n = (int(n) if n is not None and n == n else int(row.replicas)) if row.status == "ok" else None
        plan = plan_candidate(planner, c, n, log)
        plans.append({k: v for k, v in plan.items() if k != "checks"} | {"checks": plan["checks"]})
        base = {"candidate": c.name, "gpu": row.gpu, "tp": c.tp, "price_per_gpu_hour": row.price_per_gpu_hour}
        if not plan["found"]:
            rows.append({**base, "layout": "P:D", "status": "infeasible", "note": plan["reason"]})
            continue
        cost = plan["total"] * c.tp * row.price_per_gpu_hour
        rows.append({**base, "layout": f"{plan['prefill']}P:{plan['decode']}D", "status": "ok",
                     "replicas": plan["total"], "gpus": plan["total"] * c.tp, "cost_per_hour": cost,
                     "usd_per_million_output_tokens": cost / (
                         planner.s.target_rate * planner.mean_output_tokens * 3600) * 1e6,
                     "note": (f"P/D, confirmed at {planner.s.target_rate:g} req/s: p99 TTFT "
                              f"{_ms(plan['ttft_p99_s'])}, p99 TPOT {_ms(plan['tpot_p99_s'])}, "
                              f"transfer {100 * (plan['transfer_share_of_ttft'] or 0):.1f} % of TTFT")})
    if rows:
        table = pd.concat([table, pd.DataFrame(rows)], ignore_index=True)
    ok = table.status == "ok"
    table["_k"] = table.cost_per_hour.where(ok).astype(float).fillna(math.inf)
    table["_pd"] = table.layout != "colocated"
    table = table.sort_values(["_k", "gpus", "_pd"], kind="stable", na_position="last") \
        .drop(columns=["_k", "_pd"]).reset_index(drop=True)
    table["rank"] = None
    table.loc[table.status == "ok", "rank"] = range(1, int((table.status == "ok").sum()) + 1)
    return table, plans
