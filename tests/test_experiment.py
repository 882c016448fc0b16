"""kvsim experiment: discovery, errors, the memory experiment's exact figures, a small headline,
and every results page having its sections and figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.analysis.experiments import get_experiment, list_experiments
from simulator.cli.main import main
from simulator.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
SEVEN = ("static_vs_continuous", "contiguous_vs_paged", "opt13b_memory", "block_size_sweep",
         "max_num_seqs", "prefill_chunk", "gpu_memory_utilization")


def test_experiments_are_listed_with_their_first_docstring_line(capsys):
    names = list_experiments()
    assert set(SEVEN) | {"swap_vs_recompute", "prefix_eviction", "tiered_vs_fcfs"} <= set(names)
    assert main(["experiment", "--list"]) == 0
    out = capsys.readouterr().out
    assert "opt13b_memory: Experiment: PagedAttention Table 1" in out


def test_unknown_experiment_is_one_line_error(capsys):
    with pytest.raises(ConfigError,
                       match=r"unknown experiment 'opt13b_memroy' \(did you mean 'opt13b_memory'"):
        get_experiment("opt13b_memroy")
    assert main(["experiment", "static_vs_continous"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvsim: error: unknown experiment") and "\n" not in err


def test_opt13b_memory_headline_is_the_memory_math():
    h = get_experiment("opt13b_memory").headline()
    assert h["kv_bytes_per_token"] == 2 * 40 * 40 * 128 * 2 == 800 * 1024
    assert h["weights_gb"] == pytest.approx(25.68, abs=0.01)  # Table 1's "26 GB"
    assert h["token_slots"] == h["num_gpu_blocks"] * 16
    assert 14_000 <= h["token_slots"] <= 15_700  # below 15.7K by the activation reserve


def test_static_vs_continuous_headline_small():
    h = get_experiment("static_vs_continuous").headline(requests=40)
    assert h["speedup_output_tokens"] == pytest.approx(
        h["continuous_output_tokens_per_s"] / h["static_output_tokens_per_s"])
    assert h["speedup_output_tokens"] > 1.2


def test_headline_applies_regress_overrides_under_the_arm_settings():
    base = get_experiment("gpu_memory_utilization").headline(requests=30)
    more = get_experiment("gpu_memory_utilization").headline(
        requests=30, overrides=["engine.block_size=32"])
    assert more["kv_slots.u080"] != base["kv_slots.u080"]  # the override reached the runs


@pytest.mark.parametrize("name", SEVEN)
def test_results_page_has_claim_setup_figures_verdict_and_png(name):
    md = REPO / "experiments" / "results" / f"{name}.md"
    png = REPO / "experiments" / "results" / f"{name}.png"
    text = md.read_text()
    for section in ("**Claim.**", "**Setup.**", "**Measured.**", "**Verdict:", f"kvsim experiment {name}"):
        assert section in text, (name, section)
    assert f"]({name}.png)" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
