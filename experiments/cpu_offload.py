"""Experiment: a CPU offload tier of 0 / 32 / 128 / 512 GiB behind a GPU pool too small for the sessions.

    kvsim experiment cpu_offload [--duration-s 600] [--rate 1.0]

vLLM 0.33's native KV offloading (--kv-offloading-size GiB; kvsim's kvcache/offload.py) on
Mooncake's conversation trace (experiments/configs/cpu_offload.yaml: the first 600 s of the trace
replayed at 1 req/s, Llama-3.1-8B on one H100, the GPU KV pool forced to 8,000 blocks). Each
tier size is one run; a run with a GPU pool large enough to keep everything (600,000 blocks) is
the infinite-cache reference. Hit rate = prompt tokens found at first admission (GPU prefix
cache + CPU tier) / prompt tokens; the infinite-cache bound is also counted straight from the
trace's hash_ids (36.6 % of the trace's chunks repeat, 37.36 % of its prompt tokens could hit).
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.analysis.experiments import config_path, md_table, results_dir, run_result, write_page  # noqa: E402
from simulator.hardware.gpus import get_gpu  # noqa: E402

NAME = "cpu_offload"
CONFIG = config_path(NAME)
CLAIM = ("with the GPU pool too small to keep multi-turn sessions' prefixes, a CPU tier "
         "(vLLM's --kv-offloading-size) raises the prefix hit rate toward the infinite-cache bound "
         "and lowers TTFT, growing with its size (issue 17).")
SIZES = (0, 32, 128, 512)  # GiB
INFINITE_BLOCKS = 600_000  # 9.6M token slots: every prompt token of the window stays cached


def trace_path() -> str:
    from simulator.config.schema import build_config
    return str(build_config(CONFIG, []).workload.trace)


def trace_stats(duration_s: float | None) -> dict:
    """From the trace itself: `bound`, the prompt tokens an infinite cache could hit (a request
    hits its leading 512-token chunks whose chain of hash_ids an earlier request had,
    block-aligned, at most prompt - 1 tokens, as kvsim's block hashes chain them:
    kvcache/prefix.py); `gap_s`, the median trace time between two uses of a chain;
    `rate`, requests per trace second; `prompt`, the mean prompt tokens."""
    seen: dict[tuple, float] = {}
    gaps: list[float] = []
    hit = total = n = 0
    t = 0.0
    with open(trace_path()) as f:
        for line in f:
            r = json.loads(line)
            t = r["timestamp"] / 1000
            if duration_s is not None and t >= duration_s:
                break
            prompt, key, k = r["input_length"], (), 0
            found = True
            for h in r["hash_ids"]:
                key = (*key, h)
                if key in seen:
                    gaps.append(t - seen[key])
                found = found and key in seen
                k += found
                seen[key] = t
            hit += min(k * 512, prompt - 1) // 16 * 16
            total += prompt
            n += 1
    gaps.sort()
    return {"bound": hit / total, "gap_s": gaps[len(gaps) // 2] if gaps else float("nan"),
            "rate": n / (duration_s or t), "prompt": total / n}


def one(sets: list[str], overrides=()) -> dict:
    res = run_result(CONFIG, sets, overrides)
    s, req = res.summary, res.requests
    done = req[req.status == "finished"]
    ttft = done.first_token_s - done.arrival_s
    k = s.get("kv_offload") or {}
    by = k.get("hit_rate_by_tier") or {}
    return {
        "hit_rate": float(done.num_cached_tokens.clip(lower=0).sum() / done.prompt_tokens.sum()),
        "gpu_rate": s["prefix_cache"]["hit_rate"], "cpu_rate": by.get("cpu") or 0.0,
        "ttft_mean": float(ttft.mean()), "ttft_p50": float(ttft.quantile(0.5)),
        "ttft_p99": float(ttft.quantile(0.99)), "n": len(done),
        "preemptions": s["preemptions"]["total"], "loads": k.get("loads", 0),
        "stores": k.get("stores", 0), "evictions": k.get("evictions", 0),
        "gib_moved": k.get("bytes_moved", 0) / 2**30,
        "load_wait_ms": 1000 * (k.get("load_wait_s_mean") or 0.0),
        "num_cpu_blocks": k.get("num_cpu_blocks", 0), "wall_s": res.wall_s,
        "load_tokens": 16 * k.get("loaded_blocks", 0) / max(k.get("loads", 0), 1),
        "store_busy": k.get("store_seconds", 0.0) / s["makespan_s"],
    }


def measure(duration_s: float, rate: float, overrides=(), sizes=SIZES) -> dict:
    base = [f"workload.duration_s={duration_s}", f"workload.target_rate={rate}"]
    rows: dict = {size: one([*base, f"engine.kv_offloading_size={size}"], overrides) for size in sizes}
    rows["inf"] = one([*base, f"engine.num_gpu_blocks_override={INFINITE_BLOCKS}"], overrides)
    return rows


def headline(duration_s: float = 120, rate: float = 1.0, overrides=()) -> dict:
    rows = measure(duration_s, rate, overrides, sizes=(0, 128))
    return {"hit_rate_0": rows[0]["hit_rate"], "hit_rate_128": rows[128]["hit_rate"],
            "hit_rate_inf": rows["inf"]["hit_rate"], "ttft_mean_0_s": rows[0]["ttft_mean"],
            "ttft_mean_128_s": rows[128]["ttft_mean"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=f"kvsim experiment {NAME}", description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=600, help="trace window (trace seconds)")
    ap.add_argument("--rate", type=float, default=1.0, help="replay rate (req/s)")
    args = ap.parse_args(argv)
    from pathlib import Path
    if not Path(trace_path()).is_file():
        print(f"skipped: {trace_path()} not found (../shared/data)")
        return 0
    rows = measure(args.duration_s, args.rate)
    window = trace_stats(args.duration_s)
    bound, full_bound = window["bound"], trace_stats(None)["bound"]
    gap_replay = window["gap_s"] * window["rate"] / args.rate  # trace seconds -> replay seconds
    held_s = {size: rows[size]["num_cpu_blocks"] * 16 / (args.rate * window["prompt"]) for size in SIZES}
    for key, r in rows.items():
        print(f"{key!s:>4}: hit {100 * r['hit_rate']:.2f} % (cpu {100 * r['cpu_rate']:.2f} %) "
              f"TTFT mean {r['ttft_mean']:.2f} p50 {r['ttft_p50']:.2f} p99 {r['ttft_p99']:.2f} s "
              f"({r['wall_s']:.0f} s wall)", flush=True)
    inf = rows["inf"]
    xs = [str(size) for size in SIZES]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].bar(xs, [100 * rows[size]["gpu_rate"] for size in SIZES], label="GPU prefix cache")
    axes[0].bar(xs, [100 * rows[size]["cpu_rate"] for size in SIZES],
                bottom=[100 * rows[size]["gpu_rate"] for size in SIZES], label="CPU tier")
    axes[0].axhline(100 * inf["hit_rate"], color="k", ls="--", lw=1,
                    label=f"infinite GPU cache ({100 * inf['hit_rate']:.1f} %)")
    axes[0].set_ylabel("prompt tokens hit at first admission (%)")
    axes[0].legend(loc="upper left", fontsize=8)
    for key, label in (("ttft_mean", "mean"), ("ttft_p50", "p50"), ("ttft_p99", "p99")):
        line = axes[1].plot(xs, [rows[size][key] for size in SIZES], marker="o", label=f"TTFT {label}")
        axes[1].axhline(inf[key], color=line[0].get_color(), ls=":", lw=1)
    axes[1].set_ylabel("time to first token (s; dotted: infinite GPU cache)")
    axes[1].set_yscale("log")
    axes[1].legend(fontsize=8)
    for ax in axes:
        ax.set_xlabel("CPU tier, kv_offloading_size (GiB)")
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"CPU offload tier on Mooncake conversations ({args.duration_s:g} s at "
                 f"{args.rate:g} req/s), Llama-3.1-8B on H100, GPU pool 128k tokens")
    fig.tight_layout()
    fig.savefig(results_dir() / f"{NAME}.png", dpi=110)

    def cells(key, r):
        return [key, f"{100 * r['hit_rate']:.1f} %", f"{100 * r['gpu_rate']:.1f} %",
                f"{100 * r['cpu_rate']:.1f} %", f"{r['ttft_mean']:.2f}", f"{r['ttft_p50']:.2f}",
                f"{r['ttft_p99']:.2f}", f"{r['num_cpu_blocks']:,}", f"{r['loads']:,}", f"{r['stores']:,}",
                f"{r['evictions']:,}", f"{r['gib_moved']:,.0f}", f"{100 * r['store_busy']:.1f} %",
                f"{r['load_wait_ms']:.1f}", r["preemptions"]]
    table = md_table(["CPU tier (GiB)", "hit rate", "GPU", "CPU", "TTFT mean (s)", "TTFT p50 (s)",
                      "TTFT p99 (s)", "CPU blocks", "loads", "stores", "CPU evictions", "GiB moved",
                      "store link busy", "load wait mean (ms)", "preemptions"],
                     [cells(f"{size:g}", rows[size]) for size in SIZES]
                     + [cells("(infinite GPU pool)", inf)])
    lo, hi = rows[SIZES[0]], rows[SIZES[-1]]
    rising = all(rows[a]["hit_rate"] <= rows[b]["hit_rate"] for a, b in zip(SIZES, SIZES[1:]))
    falling = all(rows[a]["ttft_mean"] >= rows[b]["ttft_mean"] for a, b in zip(SIZES, SIZES[1:]))
    gap = (inf["hit_rate"] - hi["hit_rate"]) / max(inf["hit_rate"] - lo["hit_rate"], 1e-9)
    rates = " -> ".join(f"{100 * rows[size]['hit_rate']:.1f}" for size in SIZES)
    why = (
        f"The hit rate goes {rates} % "
        f"for {' / '.join(str(s) for s in SIZES)} GiB, against {100 * inf['hit_rate']:.1f} % with an "
        f"infinite GPU cache (the trace's own count for this window: {100 * bound:.1f} %; over the "
        f"whole trace the same count gives {100 * full_bound:.2f} %, the bound kvsim reproduces). "
        f"The GPU share stays at {100 * lo['gpu_rate']:.1f} %: everything gained comes from the CPU "
        f"tier, and {SIZES[-1]} GiB closes {100 * (1 - gap):.0f} % of the gap to the infinite "
        "cache. Small tiers help little: a chain of hash_ids comes back a median "
        f"{window['gap_s']:.0f} s of trace time later ({gap_replay:.0f} s at this replay rate), while "
        "a tier holds at most " + ", ".join(f"{held_s[size]:.0f} s" for size in SIZES[1:])
        + f" of this traffic's prompt tokens ({' / '.join(str(s) for s in SIZES[1:])} GiB; 2 MiB "
        "a block). TTFT mean falls "
        f"{lo['ttft_mean']:.2f} -> {hi['ttft_mean']:.2f} s and p99 {lo['ttft_p99']:.2f} -> "
        f"{hi['ttft_p99']:.2f} s (infinite GPU cache: {inf['ttft_mean']:.2f} / {inf['ttft_p99']:.2f} s): "
        "a hit skips prefill compute; a load (async, over PCIe at the GPU profile's host-link "
        f"bandwidth) brings a mean {hi['load_tokens']:,.0f} tokens at {SIZES[-1]} GiB for a mean "
        f"{hi['load_wait_ms']:.0f} ms of waiting. TTFT stays above the infinite GPU cache's "
        f"mostly because {100 * (inf['hit_rate'] - hi['hit_rate']):.1f} points of hits are still "
        "missed. Every prompt block crosses the link once to be stored whatever the tier size "
        f"(~{hi['gib_moved']:,.0f} GiB moved; the GPU->CPU link busy {100 * hi['store_busy']:.0f} % "
        "of the run); the stores cost no step time (vLLM copies on its own CUDA streams, and "
        "kvsim does not model their contention with the kernels).")
    verdict = ("holds" if rising and falling else "holds partly") + (
        f" (hit rate {100 * lo['hit_rate']:.1f} -> {100 * hi['hit_rate']:.1f} % of an infinite "
        f"cache's {100 * inf['hit_rate']:.1f} %; TTFT mean {lo['ttft_mean']:.2f} -> {hi['ttft_mean']:.2f} s)")
    gpu = get_gpu("h100")
    link = (gpu.host_link_gbps, gpu.host_link_latency_us)
    setup = (f"First {args.duration_s:g} s of `mooncake_conversation.jsonl` (a subsample of the "
             f"59-min trace, {lo['n']:,} requests) replayed at {args.rate:g} req/s, prompt + output "
             "clipped to 32,768 tokens; Llama-3.1-8B on one H100-SXM, block_size 16, chunked "
             "prefill, FCFS, synchronous scheduling in every row (engine.async_scheduling false: kvsim "
             "models the CPU tier on the synchronous engine only), GPU prefix caching (lru) with the "
             "pool forced to 8,000 blocks (128k "
             "tokens); CPU tier `engine.kv_offloading_size` 0 / 32 / 128 / 512 GiB, vLLM's `lru`, "
             "one CPU block per GPU block (vLLM's default blocks_per_chunk 1), prompt blocks only "
             f"(offload_prompt_only), host link {link[0]:g} GB/s + {link[1]:g} us a transfer "
             "(gpu_profiles/h100-sxm.yaml), one FIFO per direction. "
             "Hit rate = tokens found at first admission (GPU + CPU) / prompt tokens.")
    write_page(NAME, "CPU offload tier: hit rate and TTFT by tier size", claim=CLAIM,
               reproduce=f"kvsim experiment {NAME} --duration-s {args.duration_s:g} --rate {args.rate:g}",
               setup=setup, figures=table, verdict=verdict, why=why)
    print(f"wrote {results_dir() / (NAME + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
