"""kvsim plan --disaggregated (analysis/plan_pd.py): the splits it tries, and a prefill-heavy
workload whose TPOT target no colocated fleet meets but a P:D fleet does, the smallest such
fleet checked against one replica fewer."""

from __future__ import annotations

import json

from simulator.analysis.plan import Candidate, Planner, PlanSettings, PlanSlo
from simulator.analysis.plan_pd import _splits, plan_disaggregated
from simulator.cli.main import main

# long prompts, short answers (the Azure code trace's shape), so colocated prefill chunks stall
# decodes
HEAVY = {"engine": {"max_model_len": 8192},
         "workload": {"arrival": {"process": "poisson", "rate": 1.0},
                      "prompt_tokens": {"dist": "lognormal", "mean": 2500, "cv": 0.5, "max": 6000},
                      "output_tokens": {"dist": "lognormal", "mean": 10, "cv": 0.5, "min": 4, "max": 60}}}


def test_splits_cover_small_fleets_and_follow_the_prefill_share():
    assert _splits(2, 0.9) == [(1, 1)]
    assert _splits(4, 0.1) == [(1, 3), (2, 2), (3, 1)]
    for total, f in ((10, 0.3), (7, 0.95), (9, 0.01)):
        splits = _splits(total, f)
        assert all(p >= 1 and d >= 1 and p + d == total for p, d in splits)
        assert len(set(splits)) == len(splits)
    assert (3, 7) in _splits(10, 0.3) and (4, 6) in _splits(10, 0.3)


def test_pd_plan_finds_a_fleet_where_colocated_cannot(tmp_path):
    slo = PlanSlo(ttft_p99_s=3.0, tpot_p99_s=0.011)
    settings = PlanSettings(target_rate=4.0, slo=slo, seeds=1, requests=60, cluster_requests=120)
    p = Planner(HEAVY, settings, tmp_path)
    p.candidates = [Candidate("h100-sxm", 1)]
    table = p.rank(p.search(p.candidates))
    assert (table.status == "infeasible").all()  # TPOT: prefill chunks in every colocated step
    table, plans = plan_disaggregated(p, table, lambda s: None)
    (plan,) = plans
    assert plan["found"], plan
    row = table[table.layout != "colocated"].iloc[0]
    assert row.status == "ok" and row["rank"] == 1
    assert row.layout == f"{plan['prefill']}P:{plan['decode']}D"
    assert row.gpus == plan["total"] == plan["prefill"] + plan["decode"]
    assert plan["tpot_p99_s"] <= 0.011 and plan["ttft_p99_s"] <= 3.0
    # the smallest: every split of one replica fewer (when checked) misses the SLO
    fewer = [c for c in plan["checks"] if c["prefill"] + c["decode"] == plan["total"] - 1]
    assert plan["total"] == 2 or (fewer and not any(c["meets_slo"] for c in fewer))


def test_cli_disaggregated_flag_writes_pd_rows(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(HEAVY))
    out = tmp_path / "plan"
    assert main(["plan", str(cfg), "--rate", "2", "--gpus", "h100-sxm", "--seeds", "1",
                 "--requests", "40", "--cluster-requests", "80", "--no-confirm", "--disaggregated",
                 "--out", str(out)]) == 0
    doc = json.loads((out / "plan.json").read_text())
    assert doc["disaggregated"] and "layout" in doc["ranking"][0]
    assert any(r["layout"] != "colocated" for r in doc["ranking"])
    assert "P:" in capsys.readouterr().out or "P:1D" in (out / "plan.csv").read_text()
