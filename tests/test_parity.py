"""kvsim's scheduler vs vLLM 0.33's own, step by step (needs the `vllm` extra; docs/parity.md).

Each parity case (fcfs / priority x prefix caching off / on, on a KV pool that forces
preemption, in async scheduling, vLLM 0.33's default, and sync) runs on both backends; every
step's {request: tokens}, preemptions, admissions with their prefix-hit tokens, finishes and
KV usage must be equal, and so must the end-to-end metrics. The default run checks one
500-request seed per case (about three minutes with vLLM); `-m slow` runs the 20-seed matrix.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: the parity tests need the `vllm` extra "
                                   "(install steps in docs/parity.md; .ci/run installs it)")

from simulator.analysis.parity import CASES, case_config, run_pair  # noqa: E402


def _check(case: str, seed: int, num_requests: int) -> None:
    pair = run_pair(case_config(case, seed, num_requests))
    assert pair.identical, pair.describe_divergence()
    kv, vl = pair.summaries["kvsim"], pair.summaries["vllm"]
    # the runs did what the case is for
    assert kv["requests"]["finished"] + kv["requests"]["rejected"] == num_requests
    assert kv["preemptions"]["total"] > 0
    if "cache" in case and "nocache" not in case:
        assert kv["prefix_cache"]["hits"] > 0
    # identical decisions and the same cost model: identical metrics
    for section in ("requests", "latency_s", "throughput", "preemptions", "kv_cache", "batch",
                    "prefix_cache"):
        assert kv.get(section) == vl.get(section), section
    assert vl["config"]["vllm_version"] == "0.33.0"


@pytest.mark.parametrize("case", list(CASES))
def test_identical_steps_and_metrics(case):
    _check(case, seed=0, num_requests=500)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("case", list(CASES))
def test_identical_steps_matrix(case, seed):
    _check(case, seed, num_requests=500)


@pytest.mark.parametrize("case", ["fcfs-cache", "fcfs-cache-sync"])
def test_sequential_reference_loop_matches_vllm_too(case):
    pair = run_pair(case_config(case, 3, 200), vectorized=False)
    assert pair.identical, pair.describe_divergence()


def test_async_and_sync_differ_as_vllm_does():
    """The async cases are not the sync ones renamed: vLLM's AsyncScheduler runs, frees a
    finished request's blocks a step later and hides the host time, so the traces differ."""
    a = run_pair(case_config("fcfs-nocache", 1, 150))
    s = run_pair(case_config("fcfs-nocache-sync", 1, 150))
    assert a.identical and s.identical
    assert a.traces["vllm"] != s.traces["vllm"]
    assert any("AsyncScheduler" in line for line in a.results["vllm"].setup.lines())
    assert not any("AsyncScheduler" in line for line in s.results["vllm"].setup.lines())


def test_cli_reports_identical_and_the_ratio(tmp_path, capsys):
    from simulator.cli.main import main
    rc = main(["parity", "--case", "fcfs-nocache", "--num-requests", "100", "--seed", "5",
               "--trace-dir", str(tmp_path), "--json", str(tmp_path / "parity.json")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "vLLM 0.33.0" in out and "identical" in out and "vllm / kvsim" in out
    a = (tmp_path / "fcfs-nocache-seed5-kvsim.jsonl").read_bytes()
    assert a == (tmp_path / "fcfs-nocache-seed5-vllm.jsonl").read_bytes()


@pytest.mark.parametrize("kwargs,arrivals", [
    # tests/test_parity_rules.py's hand-traced scenarios, with and without the admission gate
    ({"num_blocks": 7, "block_size": 4, "budget": 8}, {0: [(12, 2), (16, 1)]}),
    ({"num_blocks": 7, "block_size": 4, "budget": 8, "isl": False}, {0: [(12, 2), (16, 1)]}),
    ({"num_blocks": 4, "block_size": 4, "budget": 16, "policy": "priority"},
     {0: [(2, 6, 0), (2, 6, 5), (3, 6, 0)]}),
])
def test_golden_scenarios_step_for_step_on_vllm(kwargs, arrivals):
    from helpers import drive, make_scheduler

    from simulator.backends.vllm import VllmScheduler
    kwargs = dict(kwargs)
    isl = kwargs.pop("isl", True)
    ours = make_scheduler(max_num_seqs=4, **kwargs)
    ours.reserve_full_isl = isl
    theirs = VllmScheduler(num_blocks=kwargs["num_blocks"], block_size=kwargs["block_size"],
                           max_num_seqs=4, max_num_batched_tokens=kwargs["budget"],
                           max_model_len=64, policy=kwargs.get("policy", "fcfs"),
                           reserve_full_isl=isl)
    assert drive(ours, arrivals) == drive(theirs, arrivals)


@pytest.mark.parametrize("kwargs,arrivals", [
    # tests/test_scheduler_async.py's scenarios: blocks freed a step later; a victim whose
    # last token is in flight; priority self-preemption with outputs in flight
    ({"num_blocks": 3, "block_size": 4, "budget": 8}, {0: [(4, 2), (6, 1)]}),
    ({"num_blocks": 5, "block_size": 4, "budget": 16}, {0: [(7, 6), (4, 2)]}),
    ({"num_blocks": 6, "block_size": 4, "budget": 16}, {0: [(5, 9), (3, 4)], 2: [(6, 3)], 4: [(2, 5)]}),
    ({"num_blocks": 5, "block_size": 4, "budget": 16, "policy": "priority"},
     {0: [(2, 6, 0), (2, 6, 5), (3, 6, 0)], 3: [(4, 3, 1)]}),
])
def test_async_golden_scenarios_step_for_step_on_vllm(kwargs, arrivals):
    """Two batches in flight on both: vLLM's AsyncScheduler and kvsim's async mode."""
    from test_scheduler_async import _async, drive_async

    from simulator.backends.vllm import VllmScheduler
    ours = _async(max_num_seqs=4, **kwargs)
    theirs = VllmScheduler(num_blocks=kwargs["num_blocks"], block_size=kwargs["block_size"],
                           max_num_seqs=4, max_num_batched_tokens=kwargs["budget"],
                           max_model_len=64, policy=kwargs.get("policy", "fcfs"),
                           async_scheduling=True)
    a, b = drive_async(ours, arrivals), drive_async(theirs, arrivals)
    assert a == b
    assert sum(len(p) for _, _, p, _ in a) or kwargs["num_blocks"] == 3
