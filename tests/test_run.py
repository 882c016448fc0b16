"""End-to-end runs: conservation, limits, determinism, and sanity a user can check by eye."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simulator.config.schema import build_config
from simulator.engine.run import run
from simulator.workload.generators import RequestArrays


def cfg(**overrides):
    base = {"workload.num_requests": 300, "workload.arrival.rate": 50.0}
    base.update(overrides)
    return build_config(None, [f"{k}={v}" for k, v in base.items()])


def small_workload(n=6):
    return RequestArrays(np.arange(n, dtype=float) * 0.01, np.full(n, 100, np.int64),
                         np.full(n, 20, np.int64), np.zeros(n, np.int64))


@pytest.mark.parametrize("allocator,scheduler", [("paged", "continuous"), ("paged", "static"),
                                                 ("contiguous", "continuous"),
                                                 ("contiguous", "static")])
def test_everything_returns_to_the_pool(allocator, scheduler):
    c = cfg(**{"engine.kv_allocator": allocator, "engine.scheduler": scheduler,
               "engine.max_model_len": 4096, "engine.gpu_memory_utilization": 0.5})
    res = run(c)
    s = res.summary["requests"]
    assert s["arrived"] == 300 == s["finished"] + s["rejected"]
    kv = res.scheduler.kv
    stats = kv.stats()
    assert stats.used_slots == 0 and stats.usage == 0
    if allocator == "paged":
        assert kv.pool.num_free_blocks == kv.pool.num_blocks - 1 and not kv.req_to_blocks
    else:
        assert kv.largest_hole == kv.total_slots and not kv.req_to_region
    assert res.iterations.kv_tokens_stored.iloc[-1] == 0


def test_continuous_never_exceeds_limits_under_pressure():
    # tiny KV pool + high load: preemptions happen, limits must still hold every step
    c = cfg(**{"engine.max_num_seqs": 16, "engine.max_num_batched_tokens": 512,
               "engine.gpu_memory_utilization": 0.36, "engine.max_model_len": 2048,
               "workload.arrival.rate": 200.0, "gpu": "a100-40gb", "model": "llama-2-7b"})
    res = run(c)
    it = res.iterations
    assert res.summary["preemptions"]["total"] > 0
    assert it.num_seqs.max() <= 16 and it.num_running.max() <= 16
    assert it.num_tokens.max() <= 512
    assert (it.prefill_tokens + it.decode_tokens == it.num_tokens).all()
    assert res.summary["requests"]["finished"] == 300


@pytest.mark.parametrize("caching", [True, False])
def test_vectorized_run_equals_sequential_reference(caching):
    c = cfg(**{"engine.max_num_seqs": 64, "engine.gpu_memory_utilization": 0.36,
               "engine.max_model_len": 2048, "engine.enable_prefix_caching": caching,
               "workload.arrival.rate": 200.0, "gpu": "a100-40gb", "model": "llama-2-7b"})
    fast, slow = run(c), run(c, vectorized=False)
    assert fast.summary["preemptions"]["total"] > 10
    assert fast.summary == slow.summary
    assert fast.iterations.equals(slow.iterations)


def test_static_never_admits_into_a_running_batch():
    res = run(cfg(**{"engine.scheduler": "static", "engine.max_num_seqs": 32}))
    it = res.iterations
    running_before = np.concatenate([[0], it.num_running.to_numpy()[:-1]])
    assert (it.num_admitted[running_before > 0] == 0).all()
    assert it.num_admitted.sum() == 300
    assert it.num_running.max() <= 32


def test_same_seed_gives_byte_identical_outputs(tmp_path):
    c = cfg(**{"seed": 7})
    a, b = run(c).write(tmp_path / "a"), run(c).write(tmp_path / "b")
    for name in ("summary.json", "requests.parquet", "iterations.parquet", "config.yaml"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    other = run(cfg(**{"seed": 8})).write(tmp_path / "c")
    assert (other / "summary.json").read_bytes() != (a / "summary.json").read_bytes()


def test_request_longer_than_max_model_len_is_rejected_with_reason():
    w = small_workload()
    w.prompt_tokens[2] = 5000
    res = run(cfg(**{"engine.max_model_len": 4096}), workload=w)
    s = res.summary["requests"]
    assert (s["finished"], s["rejected"]) == (5, 1)
    assert s["rejected_by_reason"] == {"prompt+output 5020 > max_model_len 4096": 1}
    row = res.requests.set_index("req_id").loc[2]
    assert row.status == "rejected"


def test_contiguous_max_model_len_rejects_nothing_that_fits():
    res = run(cfg(**{"engine.kv_allocator": "contiguous", "engine.max_model_len": 2048}),
              workload=small_workload())
    assert res.summary["requests"]["finished"] == 6


# --- sanity a user can check by eye -------------------------------------------------------

SATURATING = {"workload.num_requests": 600, "workload.arrival.rate": 1000.0,
              "engine.max_model_len": 4096}


def test_continuous_beats_static_throughput():
    # batch slots bind (64 seqs on an A100-80GB): static waits for each batch's longest member
    common = {**SATURATING, "gpu": "a100-80gb", "engine.max_num_seqs": 64}
    cont = run(cfg(**common)).summary["throughput"]["output_tokens_per_s"]
    stat = run(cfg(**common, **{"engine.scheduler": "static"})).summary["throughput"][
        "output_tokens_per_s"]
    assert cont > 1.5 * stat, (cont, stat)


def test_paged_admits_more_concurrent_requests_than_contiguous():
    # an A100-40GB with Llama-2-13B leaves room for few max_model_len reservations
    common = {**SATURATING, "model": "llama-2-13b", "gpu": "a100-40gb",
              "workload.num_requests": 150}
    paged = run(cfg(**common)).iterations.num_running.max()
    contig = run(cfg(**common, **{"engine.kv_allocator": "contiguous"})).iterations.num_running.max()
    assert paged > 2 * contig, (paged, contig)


def test_bigger_gpu_sustains_higher_rate():
    tput = {g: run(cfg(**SATURATING, gpu=g)).summary["throughput"]["requests_per_s"]
            for g in ("l4", "a100-80gb", "h100")}
    assert tput["l4"] < tput["a100-80gb"] < tput["h100"], tput


def test_static_batching_without_chunked_prefill():
    """engine.scheduler static with enable_chunked_prefill false: batches are formed when
    nothing runs, their prompts run whole before any decode, and nobody joins a running batch
    (it used to run as continuous batching while the summary said static)."""
    common = {"engine.enable_chunked_prefill": "false", "engine.max_model_len": 4096,
              "engine.max_num_batched_tokens": 8192, "engine.max_num_seqs": 16,
              "workload.num_requests": 120}
    stat = run(cfg(**common, **{"engine.scheduler": "static"}))
    cont = run(cfg(**common))
    it = stat.iterations
    running_before = np.concatenate([[0], it.num_running.to_numpy()[:-1]])
    assert (it.num_admitted[running_before > 0] == 0).all()
    assert it.num_admitted.sum() == 120 and it.num_running.max() <= 16
    assert ((it.prefill_tokens == 0) | (it.decode_tokens == 0)).all()  # prompts or decodes
    assert stat.summary["requests"]["finished"] == 120
    assert stat.summary["batch"] != cont.summary["batch"]
    assert (stat.summary["throughput"]["output_tokens_per_s"]
            < cont.summary["throughput"]["output_tokens_per_s"])


def test_on_setup_sees_the_setup_before_the_workload_is_generated(monkeypatch):
    from simulator.engine import run as run_module
    events = []
    real = run_module.generate

    def generate(*args, **kwargs):
        events.append("workload")
        return real(*args, **kwargs)

    monkeypatch.setattr(run_module, "generate", generate)
    res = run(cfg(**{"workload.num_requests": 20}), on_setup=lambda s: events.append(s.lines()))
    lines = events[0]
    assert events[1:] == ["workload"] and lines == res.setup.lines()
    assert lines[0].startswith("model ") and any("GPU blocks" in line for line in lines)


@pytest.mark.parametrize("overrides", [[], ["cluster.replicas=2"], ["model=qwen3-30b-a3b", "gpu=a100-80gb"]])
def test_config_yaml_is_the_resolved_config_as_safe_dump_writes_it(tmp_path, overrides):
    """config.yaml (written with libyaml's emitter when PyYAML has it) holds the same text as
    yaml.safe_dump of the resolved config, and reads back as it."""
    import yaml

    c = build_config(None, ["workload.num_requests=5", *overrides])
    res = run(c)
    text = (res.write(tmp_path / "r", iterations=False) / "config.yaml").read_text()
    assert text == yaml.safe_dump(res.setup.resolved_dict(), sort_keys=True)
    assert yaml.safe_load(text) == res.setup.resolved_dict()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity") else True,
                    reason="OpenBLAS runs one thread on one CPU: the two runs could not differ")
def test_outputs_do_not_depend_on_the_number_of_blas_threads(tmp_path):
    """Byte-identical files with one and with two OpenBLAS threads: a run of > 10,000 steps, the
    length past which BLAS splits a dot product over its threads (so `a @ b` in the summary and
    the time series changed their last digits with the core count)."""
    repo = Path(__file__).resolve().parent.parent
    args = ["--set", "workload.num_requests=60", "--set", "workload.arrival.rate=0.2",
            "--set", "workload.output_tokens={dist: constant, value: 200}"]
    outs = []
    for threads in ("1", "2"):
        out = tmp_path / f"t{threads}"
        env = {**os.environ, "OPENBLAS_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        subprocess.run([sys.executable, "-m", "simulator", "run", *args, "--out", str(out), "--quiet"],
                       check=True, capture_output=True, cwd=repo, env=env, timeout=300)
        outs.append(out)
    steps = json.loads((outs[0] / "summary.json").read_text())["batch"]["num_iterations"]
    assert steps > 10_000
    for name in ("summary.json", "timeseries.parquet", "openmetrics.txt", "alerts.json"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


@pytest.mark.parametrize("pd", [False, True])
def test_progress_is_called_every_few_hundred_steps(pd):
    """run(progress=...) hands (ended, total) every PROGRESS_EVERY steps or runs, not on every
    one: the counts never fall, never pass the total, and the calls are a few per thousand steps
    (one replica and P/D)."""
    from simulator.engine.replica import PROGRESS_EVERY

    cfg = (build_config("experiments/configs/pd_disagg.yaml", ["workload.num_requests=300"]) if pd
           else build_config(None, ["workload.num_requests=400", "engine.advance=step"]))
    calls = []
    res = run(cfg, progress=lambda done, total: calls.append((done, total)), keep_iterations=False)
    total = 300 if pd else 400
    assert calls and all(t == total and 0 <= d <= total for d, t in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)
    assert len(calls) <= len(res.steps) // 100 + 1  # (not on every step)
    assert len(calls) >= len(res.steps) // PROGRESS_EVERY // 4  # (still some: runs count as one)
