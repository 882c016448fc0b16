"""`kvsim workload inspect` figures vs independent computations; examples; sample trace;
end-to-end runs through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.cli.main import main
from simulator.cli.workload import load_source

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = REPO / "workloads"


def inspect_json(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["workload", "inspect", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def raw_trace(path: Path) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(seconds from the first request or None, prompt, output) straight from the file."""
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        t = np.array([r["timestamp"] for r in rows], dtype=float) / 1000.0
        return t - t.min(), np.array([r["input_length"] for r in rows]), \
            np.array([r["output_length"] for r in rows])
    df = pd.read_csv(path)
    if "TIMESTAMP" in df:
        ts = pd.to_datetime(df["TIMESTAMP"])
        return ((ts - ts.min()).dt.total_seconds().to_numpy(), df["ContextTokens"].to_numpy(),
                df["GeneratedTokens"].to_numpy())
    return None, df["num_prefill_tokens"].to_numpy(), df["num_decode_tokens"].to_numpy()


TRACES = ["azure_llm_2023_conv.csv", "azure_llm_2023_code.csv", "mooncake_conversation.jsonl",
          "mooncake_synthetic.jsonl", "lengths_sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
          "lengths_arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
          "lengths_bwb_stats_llama2_tokenizer_filtered_v2.csv"]


@pytest.mark.parametrize("name", TRACES)
def test_inspect_matches_independent_figures(shared_data, capsys, name):
    path = shared_data / "traces" / name
    stats = inspect_json(capsys, path, "--no-png")
    t, prompt, output = raw_trace(path)
    assert stats["num_requests"] == len(prompt)
    for key, values in (("prompt_tokens", prompt), ("output_tokens", output)):
        s = pd.Series(values)
        assert stats[key]["mean"] == pytest.approx(s.mean(), rel=1e-9)
        for q in (50, 90, 99):
            assert stats[key][f"p{q}"] == pytest.approx(s.quantile(q / 100), rel=1e-9)
        assert stats[key]["max"] == s.max() and stats[key]["min"] == s.min()
    if t is not None:
        t = np.sort(t)
        gaps = pd.Series(t).diff().dropna()
        assert stats["duration_s"] == pytest.approx(t[-1] - t[0], abs=1e-6)
        assert stats["mean_rate_rps"] == pytest.approx((len(t) - 1) / (t[-1] - t[0]), rel=1e-6)
        assert stats["interarrival_cv"] == pytest.approx(gaps.std(ddof=0) / gaps.mean(), rel=1e-6)


def test_inspect_headline_figures_of_the_issue(shared_data, capsys):
    conv = inspect_json(capsys, shared_data / "traces" / "azure_llm_2023_conv.csv", "--no-png")
    assert conv["num_requests"] == 19_366 and round(conv["duration_s"] / 60) == 58
    moon = inspect_json(capsys, shared_data / "traces" / "mooncake_conversation.jsonl", "--no-png")
    assert moon["num_requests"] == 12_031
    assert round(moon["prompt_tokens"]["mean"]) == 12_035
    assert round(moon["output_tokens"]["mean"]) == 343
    assert moon["prefix"]["block_tokens"] == 512


def test_inspect_prefix_reuse_matches_hash_ids(shared_data, capsys):
    path = shared_data / "traces" / "mooncake_synthetic.jsonl"
    rows = [json.loads(line)["hash_ids"] for line in path.read_text().splitlines() if line.strip()]
    flat = [h for r in rows for h in r]
    stats = inspect_json(capsys, path, "--no-png")
    assert stats["prefix"]["chunks"] == len(flat)
    assert stats["prefix"]["unique_chunks"] == len(set(flat))


def test_inspect_text_and_png(tmp_path, capsys):
    png = tmp_path / "sample.png"
    assert main(["workload", "inspect", str(WORKLOADS / "multi_tenant.yaml"), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "requests" in out and "inter-arrival CV" in out and "tenants" in out
    assert png.is_file() and png.stat().st_size > 20_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_overrides_and_errors(tmp_path, capsys):
    base = inspect_json(capsys, WORKLOADS / "sample.yaml", "--no-png", "--set", "duration_s=60")
    assert base["duration_s"] < 60
    stats = inspect_json(capsys, WORKLOADS / "sample.yaml", "--no-png", "--set", "duration_s=60",
                         "--set", "target_rate=10")
    assert stats["num_requests"] == base["num_requests"]
    assert stats["mean_rate_rps"] == pytest.approx(10.0, rel=1e-9)
    assert stats["duration_s"] == pytest.approx(base["duration_s"] * base["mean_rate_rps"] / 10)
    assert stats["interarrival_cv"] == pytest.approx(base["interarrival_cv"], rel=1e-9)
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,x,1\n")
    assert main(["workload", "inspect", str(bad), "--no-png"]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "row 1 (line 2)" in err and "'ContextTokens'" in err
    assert main(["workload", "inspect", str(bad), "--format", "azur", "--no-png"]) == 2
    assert "did you mean 'azure'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(p.name for p in WORKLOADS.glob("*.yaml")))
def test_every_example_yaml_builds(shared_data, name):
    config, work = load_source(str(WORKLOADS / name))
    assert len(work) > 100 and work.arrival_s[0] == 0
    assert np.all(np.diff(work.arrival_s) >= 0) and work.prompt_tokens.min() >= 1


def test_sample_trace_is_regenerated_byte_identical(tmp_path):
    sys.path.insert(0, str(WORKLOADS))
    try:
        from make_sample_trace import write_sample
    finally:
        sys.path.remove(str(WORKLOADS))
    out = tmp_path / "sample_trace.csv"
    write_sample(out)
    shipped = WORKLOADS / "sample_trace.csv"
    assert out.read_bytes() == shipped.read_bytes()
    assert shipped.stat().st_size < 200_000


def test_run_sample_trace_end_to_end(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "simulator.cli.main", "run", str(WORKLOADS / "sample.yaml"),
                           "--set", "workload.duration_s=60", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    _, work = load_source(str(WORKLOADS / "sample.yaml"), overrides=["duration_s=60"])
    assert summary["requests"]["arrived"] == len(work)
    assert summary["requests"]["finished"] + summary["requests"]["rejected"] == len(work)


@pytest.mark.slow
def test_run_azure_conv_trace_end_to_end(shared_data, tmp_path):
    """The whole hour of the Azure 2023 conversation trace through `kvsim run`."""
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "simulator.cli.main", "run",
                           str(WORKLOADS / "azure_conv.yaml"), "--set",
                           f"workload.trace={shared_data / 'traces' / 'azure_llm_2023_conv.csv'}",
                           "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["arrived"] == 19_366
    assert summary["requests"]["finished"] + summary["requests"]["rejected"] == 19_366
