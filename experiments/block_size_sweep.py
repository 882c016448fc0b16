"""Experiment: block_size 16-256 on the paged KV cache: internal fragmentation vs throughput.

    kvsim experiment block_size_sweep [--requests 600]

OPT-13B on one A100-40GB (experiments/configs/sharegpt_opt13b_a100_40gb.yaml), every request
queued from the start, continuous batching, paged KV with block sizes 16, 32, 64, 128, 256.
NOTE: no block below 16: vLLM 0.33's CUDA and ROCm attention backends take only multiples of
16, and kvsim refuses the rest (simulator/hardware/vllm_limits.py).
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.analysis.experiments import config_path, md_table, results_dir, run_point, write_page  # noqa: E402

NAME = "block_size_sweep"
CONFIG = config_path("sharegpt_opt13b_a100_40gb")
CLAIM = ("vLLM's default block_size 16 balances fragmentation against kernel efficiency (seed "
         "claim; PagedAttention §7.2: 16-128 do best on ShareGPT, small blocks underuse the GPU "
         "in the attention kernel, large ones waste memory in the last block).")
BLOCK_SIZES = (16, 32, 64, 128, 256)


def measure(requests: int, overrides=(), sizes=BLOCK_SIZES) -> dict:
    rows = {}
    for b in sizes:
        s = run_point(CONFIG, [f"engine.block_size={b}", f"workload.num_requests={requests}"], overrides)
        rows[b] = {"tok_s": s["throughput"]["output_tokens_per_s"],
                   "internal": s["fragmentation"]["internal_share_of_allocated"],
                   "token_share": s["fragmentation"]["token_state_share"],
                   "running": s["queue"]["running_mean"], "preempt": s["preemptions"]["total"],
                   "blocks": s["config"]["num_gpu_blocks"], "ttft_p99": s["latency_s"]["ttft"]["p99"]}
    return rows


def headline(requests: int = 150, overrides=()) -> dict:
    rows = measure(requests, overrides, sizes=(16, 128))
    return {"internal_share.b16": rows[16]["internal"], "internal_share.b128": rows[128]["internal"],
            "throughput_ratio.b128_over_b16": rows[128]["tok_s"] / rows[16]["tok_s"],
            "output_tokens_per_s.b16": rows[16]["tok_s"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"kvsim experiment {NAME}", description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    args = ap.parse_args(argv)
    rows = measure(args.requests)
    bs = list(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(bs, [100 * rows[b]["internal"] for b in bs], marker="o", color="#d62728")
    axes[0].set_ylabel("allocated KV slots holding no token (%)")
    axes[1].plot(bs, [rows[b]["tok_s"] for b in bs], marker="o", label="output tokens / s")
    axes[1].set_ylabel("throughput (output tokens / s)")
    ax2 = axes[1].twinx()
    ax2.plot(bs, [rows[b]["running"] for b in bs], marker="s", color="#2ca02c", ls="--",
             label="mean running requests")
    ax2.set_ylabel("mean running requests", color="#2ca02c")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("block_size (tokens)")
        ax.grid(alpha=0.3)
    axes[1].legend(loc="lower left")
    fig.suptitle(f"Block size: fragmentation vs throughput, OPT-13B on A100-40GB, {args.requests} "
                 "ShareGPT-like requests")
    fig.tight_layout()
    fig.savefig(results_dir() / f"{NAME}.png", dpi=110)
    base = rows[16]["tok_s"]
    table = md_table(["block_size", "GPU blocks", "internal frag. (% of allocated)",
                      "token states %", "mean running", "output tok/s", "x block 16", "preemptions",
                      "TTFT p99 (s)"],
                     [[b, f"{r['blocks']:,}", f"{100 * r['internal']:.1f}", f"{100 * r['token_share']:.1f}",
                       f"{r['running']:.1f}", f"{r['tok_s']:.0f}", f"{r['tok_s'] / base:.3f}", r["preempt"],
                       f"{r['ttft_p99']:.1f}"] for b, r in rows.items()])
    best = max(rows, key=lambda b: rows[b]["tok_s"])
    lo, mid, hi = bs[0], 128, bs[-1]
    if all(rows[a]["tok_s"] >= rows[b]["tok_s"] for a, b in zip(bs, bs[1:])):
        trend = "falls at every step"
    else:
        trend = "falls overall" if rows[hi]["tok_s"] < base else "does not fall"
    why = (f"Internal fragmentation (the unfilled part of each request's last block) grows with the "
           f"block: {100 * rows[lo]['internal']:.1f} % of allocated slots at {lo}, "
           f"{100 * rows[mid]['internal']:.1f} % at {mid}, {100 * rows[hi]['internal']:.1f} % at {hi}. "
           f"With every request queued, fewer requests fit, so throughput {trend} as blocks grow "
           f"({rows[mid]['tok_s'] / base:.2f}x of block 16's at {mid}, {rows[hi]['tok_s'] / base:.2f}x "
           f"at {hi}). Block 8, which earlier versions of this page swept, is not in the sweep: vLLM "
           "0.33 has no attention backend for it (every CUDA and ROCm backend for an unquantized KV "
           "cache takes only multiples of 16; vllm/platforms/cuda.py get_attn_backend_cls), and kvsim "
           "refuses it the same way (simulator/hardware/vllm_limits.py). So 16 is the smallest block "
           "vLLM can run, and the sweep says nothing below it; nor could kvsim show a loss there: its cost "
           "model has no per-block term in the attention kernel, so it cannot show the GPU underuse "
           "that makes small blocks slow in PagedAttention's block-size ablation (§7.2). kvsim "
           "therefore supports the memory half of the claim (small blocks waste little, large blocks "
           "cost concurrency once memory binds) and is silent on the kernel half; with that caveat "
           f"16 is where fragmentation is smallest ({100 * rows[lo]['internal']:.1f} %) among the sizes "
           f"vLLM accepts. Best throughput here: block_size {best}.")
    favour = "the smallest block vLLM accepts (16)" if best == lo else f"block {best}"
    verdict = (f"partly reproduced: fragmentation and throughput favour {favour}; the kernel cost "
               "that penalises smaller blocks is not modelled, and vLLM 0.33 runs none below 16")
    write_page(NAME, "block_size sweep: fragmentation vs throughput", claim=CLAIM,
               reproduce=f"kvsim experiment {NAME} --requests {args.requests}",
               setup=(f"{args.requests} requests, all queued at the start, prompts lognormal mean "
                      "161.31 and outputs lognormal mean 337.99 (cv 1, clipped to 1024), OPT-13B on one "
                      "A100-40GB (gpu_memory_utilization 0.9), continuous batching, max_num_seqs 256, "
                      "max_num_batched_tokens 2048, prefix caching off. Internal fragmentation = "
                      "time-integral of (allocated − stored) / allocated slots "
                      "(`fragmentation.internal_share_of_allocated`)."),
               figures=table, verdict=verdict, why=why)
    print(f"block 128 / 16 throughput {rows[128]['tok_s'] / base:.3f}; "
          f"wrote {results_dir() / (NAME + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
