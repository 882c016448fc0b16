"""End-to-end check: kvsim runs of committed configs (experiments/configs/e2e/) against published
measurements of vLLM serving a 7-8B model, each row with its source. `kvsim calibrate --e2e`
prints the table; docs/costmodel.md holds it (tests/test_calibration_e2e.py checks the two
agree, so the docs cannot drift from the code).

A row is one published figure: where it was read (URL and the page's or file's own words), the
hardware, vLLM version, model and workload as the source states them, the config that
reproduces that workload in kvsim, which metric of the run summary it is compared with, and
what is known to differ between the source's setup and kvsim's (`note`). The model was not
fitted to these rows.

Steps of `compare`: 1. load each row's config (build_config); 2. run it twice, with
engine.async_scheduling false (the synchronous engine) and true (vLLM 0.33's default: step n+1
is scheduled and its host work done while step n runs); 3. read the row's metric from each
summary. Invariant: nothing here changes a parameter; both runs use the committed profiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_DIR = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "e2e"
LAMBDA = ("https://github.com/LambdaLabsML/vllm-benchmark, results/prompt_10/{gpu}/"
          "Meta-Llama-3-8B-Instruct_tp1_len2048.json")
MUSGRAVE = "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on"
INFERENCEBENCH = "https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/"
LAMBDA_NOTE = ("vLLM 0.6.0 (V0 engine) with multi-step scheduling: the JSON's inter-token gaps "
               "come in chunks of 10 tokens, so scheduling and input preparation run once per "
               "10 steps; closest to kvsim's async column")


@dataclass(frozen=True)
class Published:
    """One published figure and the kvsim config that reproduces its workload."""

    key: str  # experiments/configs/e2e/<key>.yaml
    hardware: str  # as the source names it
    vllm: str
    model: str
    workload: str  # lengths and concurrency, as the source states them
    metric: str  # "output_tokens_per_s", "tpot_p50_ms" or "ttft_mean_ms"
    value: float
    source: str
    note: str = ""


def published_rows() -> list[Published]:
    """The rows of docs/costmodel.md's end-to-end table."""
    lam_a100, lam_h100 = LAMBDA.format(gpu="1xA100-80GB-SXM"), LAMBDA.format(gpu="1xH100-80GB-SXM")
    ten = "10 ShareGPT prompts at once (lengths from the JSON)"
    return [
        Published("lambda_sharegpt10_a100", "A100-80GB-SXM", "0.6.0", "Llama-3-8B-Instruct", ten,
                  "output_tokens_per_s", 226.55, f"{lam_a100} (`output_throughput`)", LAMBDA_NOTE),
        Published("lambda_sharegpt10_a100", "A100-80GB-SXM", "0.6.0", "Llama-3-8B-Instruct", ten,
                  "tpot_p50_ms", 12.01, f"{lam_a100} (`median_tpot_ms`)", LAMBDA_NOTE),
        Published("lambda_sharegpt10_h100", "H100-80GB-SXM", "0.6.0", "Llama-3-8B-Instruct", ten,
                  "output_tokens_per_s", 347.89, f"{lam_h100} (`output_throughput`)", LAMBDA_NOTE),
        Published("lambda_sharegpt10_h100", "H100-80GB-SXM", "0.6.0", "Llama-3-8B-Instruct", ten,
                  "tpot_p50_ms", 7.56, f"{lam_h100} (`median_tpot_ms`)", LAMBDA_NOTE),
        Published("musgrave_a100_40gb_c1", "A100 40GB (Lambda)", "0.23.0", "Llama-3.1-8B-Instruct",
                  "1024 in / 128 out, concurrency 1", "output_tokens_per_s", 75.0,
                  f"{MUSGRAVE} (\"decode at one request per time runs at about 75 tokens/sec\")",
                  "\"about\" 75: read as output throughput; 1 / TPOT is ~4 % higher at these lengths"),
        Published("musgrave_a100_40gb_c8", "A100 40GB (Lambda)", "0.23.0", "Llama-3.1-8B-Instruct",
                  "1024 in / 128 out, concurrency 8", "output_tokens_per_s", 6.6 * 75.0,
                  f"{MUSGRAVE} (\"a 6.6x gain\" at C=8 over the 75 tokens/s of C=1)",
                  "the figure is the page's ratio times its C=1 figure"),
        Published("inferencebench_h100_c1", "H100-80GB-HBM3", "0.21.0", "Llama-3.1-8B-Instruct fp16",
                  "chatbot-short, concurrency 1", "tpot_p50_ms", 6.48,
                  f"{INFERENCEBENCH} (table, `tpot_p50_ms`)",
                  "prompt/output lengths not stated (512 / 256 assumed; TPOT barely depends on them)"),
        Published("inferencebench_h100_c4", "H100-80GB-HBM3", "0.21.0", "Llama-3.1-8B-Instruct fp16",
                  "chatbot-short, concurrency 4", "tpot_p50_ms", 6.59,
                  f"{INFERENCEBENCH} (table, `tpot_p50_ms`)",
                  "prompt/output lengths not stated (512 / 256 assumed)"),
    ]


def metric_of(summary: dict[str, Any], metric: str) -> float:
    """The row's metric from a run summary (docs/metrics.md)."""
    lat = summary["latency_s"]
    return {"output_tokens_per_s": lambda: summary["throughput"]["output_tokens_per_s"],
            "tpot_p50_ms": lambda: 1e3 * lat["tpot"]["p50"],
            "ttft_mean_ms": lambda: 1e3 * lat["ttft"]["mean"]}[metric]()


@dataclass(frozen=True)
class Comparison:
    row: Published
    sync: float  # kvsim, synchronous scheduling
    async_: float  # kvsim, the cost model's async scheduling

    def error_pct(self, value: float) -> float:
        return 100.0 * (value / self.row.value - 1.0)


def run_summary(path: Path, async_scheduling: bool) -> dict[str, Any]:
    """One config's run summary under engine.async_scheduling (vLLM 0.33's default true; false:
    the synchronous engine)."""
    from simulator.config.schema import build_config
    from simulator.engine.run import run

    return run(build_config(str(path), [f"engine.async_scheduling={str(async_scheduling).lower()}"])).summary


def compare(rows: list[Published] | None = None, config_dir: Path = CONFIG_DIR) -> list[Comparison]:
    """Each row's metric from its config, run synchronously and with async scheduling (module
    docstring). A config shared by several rows runs once per mode."""
    rows = published_rows() if rows is None else rows
    cache: dict[tuple[str, bool], dict[str, Any]] = {}
    out = []
    for r in rows:
        vals = []
        for mode in (False, True):
            if (r.key, mode) not in cache:
                cache[(r.key, mode)] = run_summary(config_dir / f"{r.key}.yaml", mode)
            vals.append(metric_of(cache[(r.key, mode)], r.metric))
        out.append(Comparison(r, vals[0], vals[1]))
    return out


METRIC_LABEL = {"output_tokens_per_s": "output tok/s", "tpot_p50_ms": "TPOT p50 ms",
                "ttft_mean_ms": "TTFT mean ms"}


def _num(x: float) -> str:
    return f"{x:.1f}" if x >= 100 else f"{x:.2f}"


def markdown_table(comparisons: list[Comparison]) -> str:
    """The docs table (docs/costmodel.md, "End-to-end check"), one line per row."""
    lines = ["| config (experiments/configs/e2e/) | hardware | vLLM | model | workload | metric | "
             "published | kvsim sync | error | kvsim async | error |",
             "|---|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for c in comparisons:
        r = c.row
        lines.append(f"| `{r.key}` | {r.hardware} | {r.vllm} | {r.model} | {r.workload} | "
                     f"{METRIC_LABEL[r.metric]} | {_num(r.value)} | {_num(c.sync)} | "
                     f"{c.error_pct(c.sync):+.1f} % | {_num(c.async_)} | {c.error_pct(c.async_):+.1f} % |")
    return "\n".join(lines)
