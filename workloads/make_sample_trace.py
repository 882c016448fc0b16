"""Generate workloads/sample_trace.csv: a small synthetic trace in the Azure LLM inference CSV
format, so that trace replay works out of the box (workloads/sample.yaml) with no download.

Ten minutes of two tenants mixed: bursty chat (Gamma inter-arrivals, CV 2) and code completion
in on/off bursts, with lengths shaped like the Azure 2023 traces. Deterministic: the same
kvsim version and seed write byte-identical files (tests/test_workload_cli.py checks it).

Usage: python workloads/make_sample_trace.py [--out workloads/sample_trace.csv] [--seed 2024]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from simulator.config.workload import WorkloadConfig
from simulator.workload.load import generate

SPEC = {
    "duration_s": 600.0,
    "tenants": [
        {"name": "chat", "arrival": {"process": "gamma", "rate": 2.5, "cv": 2.0},
         "prompt_tokens": {"dist": "lognormal", "mean": 1155, "cv": 1.0, "max": 16000},
         "output_tokens": {"dist": "lognormal", "mean": 211, "cv": 0.9, "max": 2000}},
        {"name": "code", "arrival": {"process": "onoff", "rate_on": 8.0, "rate_off": 0.3,
                                     "on_s": 8.0, "off_s": 40.0, "periods": "exponential"},
         "prompt_tokens": {"dist": "lognormal", "mean": 2048, "cv": 1.2, "max": 7500},
         "output_tokens": {"dist": "lognormal", "mean": 28, "cv": 1.0, "max": 500}},
    ],
}
START = np.datetime64("2024-01-01T00:00:00", "us")


def write_sample(out: Path, seed: int = 2024) -> int:
    work = generate(WorkloadConfig(**SPEC), np.random.SeedSequence(seed))
    stamps = START + np.rint(work.arrival_s * 1e6).astype("timedelta64[us]")
    text = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    text += [f"{str(s).replace('T', ' ')},{p},{o}"
             for s, p, o in zip(stamps, work.prompt_tokens, work.output_tokens)]
    out.write_text("\n".join(text) + "\n")
    return len(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).with_name("sample_trace.csv")))
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args()
    n = write_sample(Path(args.out), args.seed)
    print(f"wrote {args.out}: {n} requests")


if __name__ == "__main__":
    main()
