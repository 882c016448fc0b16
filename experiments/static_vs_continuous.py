"""Experiment: continuous (iteration-level) batching vs static batching throughput on ShareGPT-like traffic.

    kvsim experiment static_vs_continuous [--requests 600]

OPT-13B on one A100-40GB (experiments/configs/sharegpt_opt13b_a100_40gb.yaml), every request
waiting from the start (saturating Poisson arrivals), so throughput is the engine's capacity.
Arms: static batching (a batch is formed when the previous one drains; nobody joins) and
continuous batching, both on the paged KV cache with everything else equal; plus static batching
on contiguous max_model_len reservations (FasterTransformer's setting) for context.
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.analysis.experiments import config_path, md_table, results_dir, run_point, write_page  # noqa: E402

NAME = "static_vs_continuous"
CONFIG = config_path("sharegpt_opt13b_a100_40gb")
CLAIM = ("continuous batching gives about 2-3x the throughput of static batching (seed claim; "
         "Orca / vLLM report larger gains over FasterTransformer's static batches).")
ARMS = {
    "static, paged": ["engine.scheduler=static"],
    "continuous, paged": ["engine.scheduler=continuous"],
    "static, contiguous (max_model_len)": ["engine.scheduler=static", "engine.kv_allocator=contiguous",
                                           "engine.contiguous_reserve=max_model_len"],
}


def measure(requests: int, overrides=(), arms=tuple(ARMS)) -> dict:
    rows = {}
    for arm in arms:
        s = run_point(CONFIG, [*ARMS[arm], f"workload.num_requests={requests}"], overrides)
        rows[arm] = {"req_s": s["throughput"]["requests_per_s"],
                     "tok_s": s["throughput"]["output_tokens_per_s"],
                     "batch": s["batch"]["num_seqs"]["mean"], "running": s["queue"]["running_mean"],
                     "e2e_p50": s["latency_s"]["e2e"]["p50"], "makespan": s["makespan_s"]}
    return rows


def headline(requests: int = 150, overrides=()) -> dict:
    rows = measure(requests, overrides, arms=("static, paged", "continuous, paged"))
    st, co = rows["static, paged"], rows["continuous, paged"]
    return {"speedup_output_tokens": co["tok_s"] / st["tok_s"],
            "continuous_output_tokens_per_s": co["tok_s"], "static_output_tokens_per_s": st["tok_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"kvsim experiment {NAME}", description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    args = ap.parse_args(argv)
    rows = measure(args.requests)
    base = rows["static, paged"]
    speed = rows["continuous, paged"]["tok_s"] / base["tok_s"]
    vs_ft = rows["continuous, paged"]["tok_s"] / rows["static, contiguous (max_model_len)"]["tok_s"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    names = list(rows)
    labels = [n.replace(", ", ",\n") for n in names]
    axes[0].bar(labels, [rows[n]["tok_s"] for n in names], color=["#999", "#1f77b4", "#bbb"])
    axes[0].set_ylabel("throughput (output tokens / s)")
    for i, n in enumerate(names):
        axes[0].text(i, rows[n]["tok_s"], f"{rows[n]['tok_s'] / base['tok_s']:.2f}x", ha="center",
                     va="bottom")
    axes[1].bar(labels, [rows[n]["running"] for n in names], color=["#999", "#1f77b4", "#bbb"])
    axes[1].set_ylabel("running requests (time-weighted mean)")
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelsize=9)
    fig.suptitle(f"Static vs continuous batching, OPT-13B on A100-40GB, {args.requests} ShareGPT-like "
                 "requests")
    fig.tight_layout()
    fig.savefig(results_dir() / f"{NAME}.png", dpi=110)
    table = md_table(["arm", "output tok/s", "req/s", "x static (paged)", "mean running",
                      "mean batch (seqs/step)", "E2E p50 (s)", "makespan (s)"],
                     [[n, f"{r['tok_s']:.0f}", f"{r['req_s']:.2f}", f"{r['tok_s'] / base['tok_s']:.2f}",
                       f"{r['running']:.1f}", f"{r['batch']:.1f}", f"{r['e2e_p50']:.1f}",
                       f"{r['makespan']:.0f}"] for n, r in rows.items()])
    holds = 2.0 <= speed <= 3.0
    verdict = (f"holds ({speed:.2f}x)" if holds else
               f"{'above' if speed > 3 else 'below'} the claimed range ({speed:.2f}x)")
    why = (f"Continuous batching reaches {speed:.2f}x static batching's output-token throughput with "
           "the same KV cache and token budget. A static batch is admitted at its members' *final* "
           "sizes and keeps running until its longest member finishes; output lengths are "
           "lognormal (cv 1), so most members finish early and the batch decodes with ever fewer "
           "sequences (the mean running count shows it) while the queue waits. Continuous batching "
           "refills each slot at the next step. Against static batching on contiguous "
           f"max_model_len reservations (FasterTransformer-like) the gain is {vs_ft:.1f}x, because "
           "each request then also reserves 2048 slots, which caps the batch far below what the "
           "paged pool holds; that is the regime of vLLM's larger published gains (up to 22x over "
           "FasterTransformer), which also include FasterTransformer's lack of fine-grained "
           "scheduling at equal batch size. kvsim's cost model has no batching-specific overhead, "
           "so the gap is purely occupancy.")
    write_page(NAME, "Static vs continuous batching throughput", claim=CLAIM,
               reproduce=f"kvsim experiment {NAME} --requests {args.requests}",
               setup=(f"{args.requests} requests, all queued at the start (Poisson at 1000 req/s), "
                      "prompts lognormal mean 161.31 and outputs lognormal mean 337.99 (cv 1, each "
                      "clipped to 1024), OPT-13B on one A100-40GB, gpu_memory_utilization 0.9, "
                      "block_size 16, max_num_seqs 256, max_num_batched_tokens 2048, chunked prefill, "
                      "prefix caching off. Throughput = output tokens of finished requests / makespan."),
               figures=table, verdict=verdict, why=why)
    print(f"continuous / static = {speed:.2f}x; wrote {results_dir() / (NAME + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
