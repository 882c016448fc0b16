"""kvsim plan for a 2025-26 model end to end (issue 15, must-show 4): DeepSeek-V3 with expert
parallelism does not fit 8 x H100-80GB (a row with the reason), fits 8 x H200, and every
feasible row carries its replica's memory plan."""

from __future__ import annotations

from simulator.analysis.plan import MEMORY_COLUMNS, Candidate, Planner, PlanSettings, PlanSlo, confirm_ranking
from simulator.cli.main import main

BASE = {"model": "deepseek-v3",
        "engine": {"max_model_len": 4096, "tensor_parallel_size": 8, "enable_expert_parallel": True},
        "workload": {"arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_tokens": {"dist": "lognormal", "mean": 500, "cv": 1.0, "max": 2000},
                     "output_tokens": {"dist": "lognormal", "mean": 64, "cv": 1.0, "max": 512}}}


def test_deepseek_v3_ep_plan_runs_end_to_end(tmp_path):
    settings = PlanSettings(target_rate=4.0, slo=PlanSlo(), seeds=1, requests=40, cluster_requests=60)
    planner = Planner(BASE, settings, tmp_path)
    planner.candidates = [Candidate("h100-sxm", 8), Candidate("h200", 8)]
    table = planner.rank(planner.search(planner.candidates))
    table, checks = confirm_ranking(planner, table)
    rows = table.set_index("candidate")
    h100, h200 = rows.loc["h100-sxm x8"], rows.loc["h200 x8"]
    assert h100.status == "infeasible" and "does not fit even with expert parallelism" in h100.note
    assert all(h100[c] is None or h100[c] != h100[c] for c in MEMORY_COLUMNS)
    assert h200.status == "ok" and h200.replicas >= 1 and checks and checks[0]["confirmed"]
    # MLA: 61 layers x (512 + 64) x 2 bytes per token, the whole latent on every GPU
    per_token = h200.kv_cache_gib_per_gpu * 2**30 / h200.kv_tokens_per_replica
    assert abs(per_token - 61 * 576 * 2) / (61 * 576 * 2) < 0.01
    assert h200.max_concurrency * 4096 <= h200.kv_tokens_per_replica + 1
    assert 70 < h200.weights_gib_per_gpu < 80


def test_cli_plan_with_a_model_that_does_not_fit_says_why(tmp_path, capsys):
    code = main(["plan", "--rate", "1", "--candidate", "h100-sxm:8", "--set", "model=deepseek-v3",
                 "--set", "engine.enable_expert_parallel=true", "--seeds", "1", "--requests", "20",
                 "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0 and "every row is infeasible" in out
    assert "does not fit even with expert parallelism" in (tmp_path / "o" / "plan.csv").read_text()
