"""Experiment: recompute vs swap preemption across block sizes and PCIe generations.

    python experiments/swap_vs_recompute.py [--requests 600] [--rate 4]

Llama-2-13B on one A100-40GB (little KV room: preemption is frequent) serving long outputs
(Poisson arrivals, prompts lognormal mean 600, outputs lognormal mean 900), block sizes
16..128, preemption by recompute or swap (4 GiB CPU space) over PCIe Gen4 (25 GB/s) or Gen5
(50 GB/s), 10 us per transfer, one transfer per block per K/V tensor per layer as vLLM v0
swaps. Writes
experiments/results/swap_vs_recompute.md and .png.
NOTE: no block below 16: vLLM 0.33's CUDA and ROCm attention backends take only multiples of
16, and kvsim refuses the rest (simulator/hardware/vllm_limits.py).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simulator.config.paths import data_dir  # noqa: E402
from simulator.config.schema import build_config  # noqa: E402
from simulator.engine.run import run  # noqa: E402

ROOT = Path(__file__).resolve().parent
BLOCK_SIZES = (16, 32, 64, 128)
LINKS = {"gen4": 25.0, "gen5": 50.0}


def gpu_variants(tmp: Path) -> dict[str, Path]:
    """The A100-40GB profile with its host link set to PCIe Gen4 and Gen5 figures."""
    base = yaml.safe_load((data_dir("gpu_profiles") / "a100-40gb.yaml").read_text())
    out = {}
    for name, gbps in LINKS.items():
        prof = dict(base, name=f"a100-40gb-{name}", aliases=[])
        prof["host_link"] = dict(base["host_link"], name=f"PCIe {name}", bandwidth_gbps=gbps)
        path = tmp / f"a100-40gb-{name}.yaml"
        path.write_text(yaml.safe_dump(prof))
        out[name] = path
    return out


def one(gpu: Path, block: int, mode: str, args) -> dict:
    cfg = build_config(None, [
        "model=llama-2-13b", f"gpu={gpu}", f"engine.block_size={block}", "engine.max_model_len=4096",
        f"engine.preemption_mode={mode}", "engine.enable_prefix_caching=false",
        f"workload.num_requests={args.requests}", f"workload.arrival.rate={args.rate}",
        "workload.prompt_tokens.mean=600", "workload.prompt_tokens.max=2048",
        "workload.output_tokens.mean=900", "workload.output_tokens.max=2000"])
    res = run(cfg)
    s = res.summary
    busy = s["busy_s"]
    swap = res.scheduler.swap
    return {"block": block, "mode": mode, "tput": s["throughput"]["output_tokens_per_s"],
            "e2e_p99": s["latency_s"]["e2e"]["p99"], "preemptions": s["preemptions"]["total"],
            "swap_share": (swap.seconds / busy) if swap else 0.0,
            "swapped_gib": (swap.bytes_moved / 2**30) if swap else 0.0,
            "swap_outs": swap.num_swap_outs if swap else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rate", type=float, default=4.0)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        gpus = gpu_variants(Path(tmp))
        for block in BLOCK_SIZES:
            r = one(gpus["gen4"], block, "recompute", args)
            r["link"] = "-"
            rows.append(r)
            for link, path in gpus.items():
                r = one(path, block, "swap", args)
                r["link"] = link
                rows.append(r)
            for r in rows[-3:]:
                print(block, r["mode"], r["link"], round(r["tput"]), round(r["swap_share"], 4),
                      r["preemptions"], flush=True)
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, sel in (("recompute", lambda r: r["mode"] == "recompute"),
                       ("swap, PCIe Gen4", lambda r: r["link"] == "gen4"),
                       ("swap, PCIe Gen5", lambda r: r["link"] == "gen5")):
        rs = [r for r in rows if sel(r)]
        axes[0].plot([r["block"] for r in rs], [r["tput"] for r in rs], marker="o", label=label)
        axes[1].plot([r["block"] for r in rs], [100 * r["swap_share"] for r in rs], marker="o",
                     label=label)
    axes[0].set_ylabel("output tokens / s")
    axes[1].set_ylabel("swap time, % of busy time")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xticks(BLOCK_SIZES, [str(b) for b in BLOCK_SIZES])
        ax.set_xlabel("block size (tokens)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("Recompute vs swap preemption, Llama-2-13B on A100-40GB")
    fig.tight_layout()
    fig.savefig(out / "swap_vs_recompute.png", dpi=110)
    lines = [
        "# Recompute vs swap preemption across block sizes and PCIe generations",
        "",
        f"Reproduce: `python experiments/swap_vs_recompute.py --requests {args.requests} "
        f"--rate {args.rate:g}`.",
        "",
        f"**Setup.** {args.requests} requests, Poisson at {args.rate:g} req/s, prompts lognormal "
        "(mean 600, max 2048), outputs lognormal (mean 900, max 2000); Llama-2-13B on one "
        "A100-40GB (gpu_memory_utilization 0.9), chunked prefill, FCFS, prefix caching off. Swap: "
        "4 GiB CPU space; one cudaMemcpyAsync per block per K/V tensor per layer (2 x 40 for "
        "Llama-2-13B), 10 us each, plus bytes / link bandwidth "
        "(Gen4 25 GB/s, Gen5 50 GB/s), charged to the step that swaps.",
        "",
        "| block | mode | link | output tok/s | E2E p99 (s) | preemptions | swap-outs | "
        "swapped GiB | swap time share |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['block']} | {r['mode']} | {r['link']} | {r['tput']:.0f} | {r['e2e_p99']:.1f} "
                     f"| {r['preemptions']} | {r['swap_outs']} | {r['swapped_gib']:.1f} | "
                     f"{100 * r['swap_share']:.2f} % |")
    lines += ["", "![throughput and swap share](swap_vs_recompute.png)", "",
              "## What the numbers show", "", *conclusions(rows), ""]
    (out / "swap_vs_recompute.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'swap_vs_recompute.md'}")


def conclusions(rows: list[dict]) -> list[str]:
    def get(block, mode, link):
        return next(r for r in rows if r["block"] == block and r["mode"] == mode and r["link"] == link)
    lo, hi = BLOCK_SIZES[0], BLOCK_SIZES[-1]
    rec = [get(b, "recompute", "-")["tput"] for b in BLOCK_SIZES]
    spread = (max(rec) - min(rec)) / max(rec)
    share_lo, share_hi = get(lo, "swap", "gen4")["swap_share"], get(hi, "swap", "gen4")["swap_share"]
    def wins(link):
        return [str(b) for b in BLOCK_SIZES
                if get(b, "swap", link)["tput"] > get(b, "recompute", "-")["tput"]]
    rec_lo, g4_lo, g5_lo = (get(lo, "recompute", "-")["tput"], get(lo, "swap", "gen4")["tput"],
                            get(lo, "swap", "gen5")["tput"])
    gap = max(abs(r["tput"] / get(r["block"], "recompute", "-")["tput"] - 1) for r in rows)
    at_lo = ("recompute wins" if rec_lo >= max(g4_lo, g5_lo) else
             "swap wins over Gen5 only" if g5_lo > rec_lo >= g4_lo else "swap wins")
    return [
        f"- **Recompute is {'flat' if spread <= 0.05 else 'not flat'} across block sizes** "
        f"({min(rec):.0f}-{max(rec):.0f} output tok/s, {100 * spread:.1f} % apart)"
        + (", as PagedAttention reports: its cost is prefill compute, which block size does not change."
           if spread <= 0.05 else "."),
        f"- **Swap {'suffers' if share_lo > share_hi else 'does not suffer'} at small blocks**: its "
        f"time share {'falls' if share_lo > share_hi else 'goes'} from {100 * share_lo:.1f} % (block {lo}) "
        f"to {100 * share_hi:.1f} % (block {hi}) on Gen4, because each "
        "block is one copy per K/V tensor per layer and pays the per-copy latency.",
        f"- **Where each wins**: swap beats recompute at block sizes {', '.join(wins('gen4')) or 'none'} "
        f"over PCIe Gen4 and {', '.join(wins('gen5')) or 'none'} over Gen5 (half the bandwidth "
        f"time per byte); at block {lo} {at_lo} ({rec_lo:.0f} vs {g4_lo:.0f} (Gen4) / {g5_lo:.0f} "
        "(Gen5) tok/s)"
        + (": there the per-copy latency dominates the swap time." if at_lo == "recompute wins" else "."),
        f"- The differences are at most {100 * gap:.1f} % of throughput: preemption is frequent here but "
        "its cost, either way, is small next to decoding. The per-copy latency (10 us) is an "
        "assumption of the GPU profiles (gpu_profiles/*.yaml, host_link.latency_us).",
        "- Block 8, which earlier versions of this page swept, is not in the sweep: vLLM 0.33 has no "
        "attention backend for it (every CUDA and ROCm backend for an unquantized KV cache takes only "
        "multiples of 16; vllm/platforms/cuda.py get_attn_backend_cls), and kvsim refuses it the same "
        f"way (simulator/hardware/vllm_limits.py). Block {lo}, the smallest vLLM runs, is where swap "
        "pays the most copies per byte.",
    ]


if __name__ == "__main__":
    main()
