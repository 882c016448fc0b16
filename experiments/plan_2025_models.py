"""Experiment: kvsim plan for DeepSeek-V3, Qwen3-235B-A22B and gpt-oss-120b on H100 / H200 / B200 / MI300X.

    kvsim experiment plan_2025_models [--rate 30] [--requests 800] [--workers 2]

Chat traffic (experiments/configs/plan_2025_models.yaml), the default chat SLO (p99 TTFT <= 2 s,
p99 TPOT <= 100 ms) at a target rate; for each model the GPU x TP candidates a deployment would
consider: DeepSeek-V3 (fp8 checkpoint) at TP 8 with expert parallelism, Qwen3-235B-A22B (bf16)
at TP 4 and 8, gpt-oss-120b (mxfp4 experts) at TP 1 and 2. The plan is `kvsim plan`'s own search
(simulator/analysis/plan.py), one seed per probe and small request counts to stay fast; the
winner of each model is confirmed by a cluster simulation.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.analysis.experiments import config_path, md_table, results_dir, write_page  # noqa: E402

NAME = "plan_2025_models"
CONFIG = config_path(NAME)
CLAIM = ("`kvsim plan` answers the capacity question for the 2025-26 models (MLA, MoE with expert "
         "parallelism, sliding-window layers, fp8 / mxfp4 weights) on H100, H200, B200 and MI300X: "
         "which GPU x TP is cheapest at a chat SLO, and which do not fit (issue 15, must-show 4).")
GPUS = ("h100-sxm", "h200", "b200", "mi300x")
# model -> (TP degrees, expert parallelism)
MODELS: dict[str, tuple[tuple[int, ...], bool]] = {
    "deepseek-v3": ((8,), True),
    "qwen3-235b-a22b": ((4, 8), False),
    "gpt-oss-120b": ((1, 2), False),
}


def plan_model(model: str, rate: float, requests: int, workers: int, out: Path, *, gpus=GPUS,
               tps: tuple[int, ...] | None = None, confirm: bool = True, overrides=()) -> dict[str, Any]:
    """`kvsim plan` for one model: the ranked table (plan.py's columns) and the confirmation."""
    from simulator.analysis.plan import Planner, PlanSettings, PlanSlo, confirm_ranking, parse_candidates
    from simulator.config.schema import apply_override, load_config, parse_value

    model_tps, ep = MODELS[model]
    data = load_config(CONFIG)
    for item in [f"model={model}", f"engine.enable_expert_parallel={str(ep).lower()}", *overrides]:
        key, value = item.split("=", 1)
        apply_override(data, key, parse_value(value))
    settings = PlanSettings(target_rate=rate, slo=PlanSlo(ttft_p99_s=2.0, tpot_p99_s=0.1), seeds=1,
                            requests=requests, cluster_requests=3 * requests, workers=workers)
    planner = Planner(data, settings, out / model)
    planner.candidates = parse_candidates(list(gpus), list(tps or model_tps))
    table = planner.rank(planner.search(planner.candidates))
    checks: list[dict[str, Any]] = []
    if confirm and (table.status == "ok").any():
        table, checks = confirm_ranking(planner, table)
    return {"table": table, "checks": checks, "probes": planner.probes_frame(), "ep": ep}


def model_facts(model: str) -> dict[str, Any]:
    """The numbers that drive a plan, from the model spec and its KV cache layout."""
    from simulator.hardware.kv_spec import kv_cache_layout
    from simulator.hardware.models import get_model

    m = get_model(model)
    layout = kv_cache_layout(m, tp=1, block_size=16)
    return {"spec": m, "weights_gb": m.weights_bytes / 1e9, "params_b": m.num_params / 1e9,
            "active_b": m.num_active_params / 1e9, "kv_kib_per_token": m.kv_bytes_per_token / 1024,
            "layout": layout.describe()}


def headline(rate: float = 40.0, requests: int = 300, overrides=()) -> dict[str, float]:
    """Small and fast: gpt-oss-120b on one H100 (KV-bound: 8.7 GiB of KV) and one H200, no cluster
    check."""
    with tempfile.TemporaryDirectory() as tmp:
        res = plan_model("gpt-oss-120b", rate, requests, 1, Path(tmp), gpus=("h100-sxm", "h200"), tps=(1,),
                         confirm=False, overrides=overrides)
    t = res["table"].set_index("candidate")
    key = lambda c: c.replace(" ", "").replace("-", "_")  # noqa: E731
    return {f"{key(c)}.max_rate_per_replica": float(t.loc[c].max_rate_per_replica or 0) for c in t.index}


def _num(x: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None or x != x else fmt.format(x)


def _rows(model: str, res: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for _, r in res["table"].iterrows():
        ok = r.status == "ok"
        confirmed = r.get("confirmed_replicas")
        rows.append([r.candidate, r.tp, _num(r.weights_gib_per_gpu, "{:.1f}"),
                     _num(r.kv_cache_gib_per_gpu, "{:.1f}"), _num(r.kv_tokens_per_replica),
                     _num(r.max_concurrency, "{:.1f}"), _num(r.max_rate_per_replica, "{:.3g}") if ok else "-",
                     (str(int(r.replicas)) + (f" ({int(confirmed)} confirmed)" if confirmed == confirmed
                                              and confirmed is not None else "")) if ok else "-",
                     _num(r.gpus) if ok else "-", _num(r.cost_per_hour, "{:.2f}") if ok else "-",
                     ("ok" if not r.note else r.note) if ok else f"infeasible: {_short(r.note)}"])
    return rows


def _short(note: str) -> str:
    """The reason of an infeasible row, cut before the advice that follows it."""
    return note.split("; raise")[0].replace("|", "/")


def _kv_line(r) -> str:
    per_token = r.kv_cache_gib_per_gpu * 2**20 / r.kv_tokens_per_replica
    return (f"{r.candidate} {r.kv_cache_gib_per_gpu:.1f} GiB/GPU -> {r.kv_tokens_per_replica:,.0f} tokens "
            f"({per_token:.1f} KiB/token/GPU)")


def _paragraph(model: str, res: dict[str, Any], rate: float) -> str:
    f = model_facts(model)
    m, t = f["spec"], res["table"]
    ok = t[t.status == "ok"]
    fits = t[t.kv_tokens_per_replica.notna()]
    lines = [f"**{m.name}** ({f['params_b']:.0f}B parameters, {f['active_b']:.0f}B active per token; "
             f"{f['weights_gb']:.0f} GB of {m.quantization or 'bf16'} weights; KV cache: {f['layout']}; "
             f"{f['kv_kib_per_token']:.1f} KiB per token over all layers).",
             "Weights per GPU: " + ", ".join(f"{w:.1f} GiB at TP {tp}" for tp, w in
                                              fits.groupby("tp").weights_gib_per_gpu.first().items())
             + "; what 0.9 of each GPU's memory leaves after them and the activations is the KV cache: "
             + ", ".join(_kv_line(r) for _, r in fits.iterrows()) + "."]
    if m.is_mla:
        lines.append(f"MLA stores one latent of kv_lora_rank {m.kv_lora_rank} + qk_rope_head_dim "
                     f"{m.qk_rope_head_dim} per token and layer instead of {m.num_kv_heads} heads' K and V "
                     f"({2 * m.num_kv_heads * m.head_dim / (m.kv_lora_rank + m.qk_rope_head_dim):.0f}x "
                     "less), and every TP rank keeps the whole latent: the tokens per replica follow the "
                     "GPU's free memory, not the TP degree.")
    elif m.num_kv_heads < max(fits.tp, default=1):
        lines.append(f"With {m.num_kv_heads} KV heads, TP above {m.num_kv_heads} replicates them (vLLM's "
                     "rule): a GPU holds one KV head at every TP degree here, so TP 8 gains KV tokens only "
                     "through the weights it takes off each GPU.")
    if m.is_moe:
        lines.append(f"Each token runs {m.experts_per_token} of {m.num_experts} routed experts"
                     + (f" plus {m.num_shared_experts} shared" if m.num_shared_experts else "")
                     + "; a decode batch of 64 touches "
                     f"{m.num_experts * (1 - (1 - m.experts_per_token / m.num_experts) ** 64):.0f} "
                     "experts, so a decode step streams most expert weights: its time follows HBM bandwidth "
                     "and the weights per GPU, and more concurrent requests come almost free.")
    if m.is_hybrid:
        lines.append(f"{sum(k != 'full_attention' for k in m.attention_types)} of {m.num_layers} layers "
                     f"slide over {m.sliding_window} tokens: they keep at most window/block_size + 1 blocks "
                     "per request and read at most the window, so the full-attention layers set the KV "
                     "capacity and most of the decode read.")
    for _, r in t[t.status != "ok"].iterrows():
        lines.append(f"{r.candidate} cannot serve it: {_short(r.note)}.")
    if len(ok):
        best = ok.iloc[0]
        # a row the search capped at the target rate sustains at least that: its $/h per req/s is a bound
        per_rate = ", ".join(f"{r.candidate} {'<= ' if 'capped' in r.note else ''}"
                             f"{r.cost_per_hour / r.max_rate_per_replica / r.replicas:.2f}"
                             for _, r in ok.iterrows())
        lines.append(f"Cheapest at {rate:g} req/s: **{best.candidate}**, {int(best.replicas)} replica(s), "
                     f"{int(best.gpus)} GPUs, {best.cost_per_hour:.2f} $/h. $/h per req/s one replica "
                     f"sustains: {per_rate} - the price per GPU-hour (profile defaults) weighs as much "
                     "as the speed.")
        if res["ep"] and (ok.replicas.astype(float) > 1).any():
            lines.append("With expert parallelism kvsim's replicas form one data-parallel group (vLLM's "
                         "--data-parallel-size N --enable-expert-parallel): the experts spread over all "
                         "N x TP GPUs and every MoE layer all-gathers the N ranks' tokens, so a cluster of N "
                         "is not N copies of the probed replica; the confirmed count is the one to read.")
    return " ".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"kvsim experiment {NAME}", description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=30.0, help="target request rate per model (req/s)")
    ap.add_argument("--requests", type=int, default=800, help="requests per probe simulation")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None, help="keep the plan simulations here (default: a temp dir)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        results = {m: plan_model(m, args.rate, args.requests, args.workers, out) for m in MODELS}
    header = ["candidate", "GPUs / replica", "weights GiB / GPU", "KV GiB / GPU", "KV tokens / replica",
              "max concurrency",
              "max req/s / replica", "replicas", "GPUs", "$/h", "status"]
    figures: list[str] = []
    for model, res in results.items():
        ep = " + expert parallel" if res["ep"] else ""
        figures += [f"*{model_facts(model)['spec'].name}{ep}*", "", *md_table(header, _rows(model, res)), ""]
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4))
    for ax, (model, res) in zip(axes, results.items()):
        t = res["table"]
        cost = t.cost_per_hour.where(t.status == "ok", 0.0).astype(float)
        ax.barh(t.candidate, cost, color="tab:blue")
        for y, (_, r) in enumerate(t.iterrows()):
            label = f" {int(r.gpus)} GPUs" if r.status == "ok" else " infeasible (weights do not fit)" \
                if "does not fit" in r.note else " infeasible"
            ax.text(cost.iloc[y], y, label, va="center", fontsize=8)
        ax.set_xlabel(f"$/h at {args.rate:g} req/s")
        ax.set_title(model_facts(model)["spec"].name, fontsize=10)
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
    fig.suptitle(f"kvsim plan, chat SLO (p99 TTFT <= 2 s, TPOT <= 100 ms), {args.rate:g} req/s per model")
    fig.tight_layout()
    fig.savefig(results_dir() / f"{NAME}.png", dpi=110, metadata={"Software": None})
    why = " ".join(["\n\n" + _paragraph(m, r, args.rate) for m, r in results.items()]) + (
        "\n\nThe MoE, MLA, sliding-window and fp8 / mxfp4 GEMM terms of the cost model have no "
        "measured kernels (the run output flags them as extrapolated), and H200, B200 and MI300X carry "
        "parameters extrapolated from the H100 fit: read the per-replica rates as first-principles "
        "estimates; the memory figures (weights, KV tokens, max concurrency) are vLLM 0.33's own math "
        "(tests/test_kv_layout.py compares them with vLLM's functions).")
    feasible = all((r["table"].status == "ok").any() for r in results.values())
    write_page(NAME, "Capacity plans for DeepSeek-V3, Qwen3-235B-A22B and gpt-oss-120b", claim=CLAIM,
               reproduce=f"kvsim experiment {NAME} --rate {args.rate:g} --requests {args.requests}",
               setup=(f"experiments/configs/{NAME}.yaml: chat traffic, Poisson arrivals, prompts lognormal "
                      "mean 1,000 tokens (max 6,000), outputs lognormal mean 300 (max 2,000), max_model_len "
                      f"8,192, vLLM 0.33's defaults otherwise (gpu_memory_utilization 0.9, block_size 16, "
                      f"chunked prefill). `kvsim plan` per model at {args.rate:g} req/s, SLO p99 TTFT <= 2 s "
                      f"and p99 TPOT <= 100 ms, one seed of {args.requests} requests per probe, the winner "
                      f"confirmed by a cluster of {3 * args.requests} requests (least_outstanding router). "
                      "Prices: each GPU profile's default $/GPU-hour. KV tokens / replica and max "
                      "concurrency are vLLM's start-up figures (`GPU KV cache size`, `Maximum concurrency` "
                      "at max_model_len)."),
               figures=figures, verdict="holds" if feasible else "does not hold",
               why=("Every model has a feasible, confirmed plan, and the candidates that cannot hold the "
                    "weights are rows with the reason, not errors." if feasible else
                    "a model has no feasible candidate.") + why)
    for model, res in results.items():
        ok = res["table"][res["table"].status == "ok"]
        print(f"{model}: " + (f"{ok.iloc[0].candidate} x {int(ok.iloc[0].replicas)}" if len(ok) else "none"))
    print(f"wrote {results_dir() / (NAME + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
