"""Plug-ins: each kind is one module plus one registry line (tests/plugins/), then used by
`kvsim run --set ...` end to end; their params are validated before any work, one line each."""

from __future__ import annotations

import importlib
import json

import pandas as pd
import pytest

import simulator.config.registry as registry
from simulator.cli.main import main
from simulator.config.schema import build_config
from simulator.engine import run as run_module
from simulator.engine.run import run
from simulator.errors import ConfigError

SMALL = ["--set", "workload.num_requests=150", "--set", "engine.max_model_len=4096"]
SHARED = ["--set", "engine.num_gpu_blocks_override=400", "--set", "workload.arrival.rate=20",
          "--set", "workload.system_prompts={count: 8, tokens: {dist: constant, value: 600}}"]


def kvsim_run(tmp_path, capsys, *sets: str) -> tuple[int, str, dict | None]:
    out = tmp_path / "run"
    code = main(["run", "--quiet", "--out", str(out), *SMALL, *sets])
    err = capsys.readouterr().err.strip()
    summary = json.loads((out / "summary.json").read_text()) if code == 0 else None
    return code, err, summary


def test_eviction_policy_with_a_parameter(tmp_path, capsys):
    importlib.import_module("tests.plugins.lifo_eviction")
    code, _, lru = kvsim_run(tmp_path, capsys, *SHARED)
    assert code == 0
    code, _, lifo = kvsim_run(tmp_path, capsys, *SHARED, "--set", "engine.eviction_policy=lifo",
                              "--set", "engine.eviction_params={unhashed_first: false}")
    assert code == 0 and lifo["requests"]["finished"] == 150
    # reusing the newest free blocks first evicts the hot system prompts LRU keeps
    assert lifo["prefix_cache"]["evictions"] > lru["prefix_cache"]["evictions"] > 0
    assert lifo["prefix_cache"]["hit_rate"] < lru["prefix_cache"]["hit_rate"]
    code, err, _ = kvsim_run(tmp_path, capsys, "--set", "engine.eviction_policy=lifo",
                             "--set", "engine.eviction_params.unhashed_first=maybe")
    assert code == 2 and len(err.splitlines()) == 1
    assert "engine.eviction_params.unhashed_first must be true or false, got 'maybe'" in err


def test_queue_policy(tmp_path, capsys):
    importlib.import_module("tests.plugins.sjf_queue")
    load = ["--set", "workload.arrival.rate=200", "--set", "engine.max_num_seqs=8"]
    code, _, fcfs = kvsim_run(tmp_path, capsys, *load)
    code, _, sjf = kvsim_run(tmp_path, capsys, *load, "--set", "engine.queue_policy=sjf")
    assert code == 0 and sjf["requests"]["finished"] == 150
    # short jobs first: the typical wait drops
    assert sjf["latency_s"]["queue"]["p50"] < 0.8 * fcfs["latency_s"]["queue"]["p50"]
    assert sjf["latency_s"]["e2e"]["mean"] < fcfs["latency_s"]["e2e"]["mean"]
    code, err, _ = kvsim_run(tmp_path, capsys, "--set", "engine.queue_policy=sjf",
                             "--set", "engine.queue_params={by: tier}")
    assert code == 2 and "engine.queue_params.by: unknown key (queue_policy 'sjf' takes no" in err


def test_router_with_a_parameter(tmp_path, capsys):
    importlib.import_module("tests.plugins.hash_router")
    code, _, summary = kvsim_run(tmp_path, capsys, "--set", "cluster.replicas=3",
                                 "--set", "cluster.router=by_id",
                                 "--set", "cluster.router_params={offset: 1}")
    assert code == 0 and summary["cluster"]["router"] == "by_id"
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert (req.replica == (req.req_id + 1) % 3).all()
    code, err, _ = kvsim_run(tmp_path, capsys, "--set", "cluster.replicas=3",
                             "--set", "cluster.router=by_id", "--set", "cluster.router_params={offset: -2}")
    assert code == 2 and "cluster.router_params.offset must be >= 0, got -2" in err


def test_allocator_from_a_throw_away_package(tmp_path, capsys, monkeypatch):
    """The allocator module is named by an entry point of a package kvsim has never heard of."""
    dist = tmp_path / "site" / "toyplug-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[{registry.ENTRY_POINT_GROUP}]\ntoy = tests.plugins.toy_allocator\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    importlib.invalidate_caches()
    code, err, summary = kvsim_run(tmp_path, capsys, "--set", "engine.kv_allocator=toy_bump",
                                   "--set", "engine.kv_allocator_params={extra_slots: 64}")
    assert code == 0, err
    assert summary["config"]["kv_allocator"] == "toy_bump" and summary["requests"]["finished"] == 150
    it = pd.read_parquet(tmp_path / "run" / "iterations.parquet")
    req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    # every running request holds its final size + 64 slots: after the first step (request 0
    # alone) the used slots are exactly that
    assert it.num_running[0] == 1
    assert it.kv_used_slots[0] == req.prompt_tokens[0] + req.output_tokens[0] - 1 + 64
    assert (it.kv_used_slots >= 64 * it.num_running).all() and it.kv_used_slots.iloc[-1] == 0
    code, err, _ = kvsim_run(tmp_path, capsys, "--set", "engine.kv_allocator=toy_bump",
                             "--set", "engine.kv_allocator_params={extra_slot: 1}")
    assert code == 2 and err.endswith("engine.kv_allocator_params: unknown key 'extra_slot' for "
                                      "kv_allocator 'toy_bump' (did you mean 'extra_slots'?); "
                                      "valid: extra_slots")


# --- params of the built-in plug-ins -------------------------------------------------------
def _run(*sets: str):
    return run(build_config(None, ["workload.num_requests=150", "engine.max_model_len=4096",
                                   "engine.num_gpu_blocks_override=400", "workload.arrival.rate=20",
                                   "workload.system_prompts={count: 8, tokens: {dist: constant, "
                                   "value: 600}}", *sets]))


def test_eviction_ttl_s_is_lru_ttl_params_default():
    legacy = _run("engine.eviction_policy=lru_ttl", "engine.eviction_ttl_s=2")
    params = _run("engine.eviction_policy=lru_ttl", "engine.eviction_params.ttl_s=2")
    both = _run("engine.eviction_policy=lru_ttl", "engine.eviction_ttl_s=900",
                "engine.eviction_params.ttl_s=2")  # the params section wins
    default = _run("engine.eviction_policy=lru_ttl")
    assert legacy.summary == params.summary == both.summary
    assert legacy.summary["prefix_cache"] != default.summary["prefix_cache"]


def test_contiguous_reserve_is_the_allocator_params_default():
    sets = ["engine.kv_allocator=contiguous", "engine.enable_prefix_caching=false",
            "workload.num_requests=40"]
    legacy = _run(*sets, "engine.contiguous_reserve=pow2")
    params = _run(*sets, "engine.kv_allocator_params={reserve: pow2}")
    assert legacy.summary == params.summary
    assert legacy.summary != _run(*sets).summary


@pytest.mark.parametrize("sets,message", [
    (["engine.eviction_policy=lru_ttl", "engine.eviction_params.ttl_s=-1"],
     "engine.eviction_params.ttl_s must be > 0, got -1"),
    (["engine.eviction_policy=lru_ttl", "engine.eviction_params.ttl_s='5'"],
     "engine.eviction_params.ttl_s must be a number, got '5'"),
    (["engine.eviction_params.ttl_s=5"],
     "engine.eviction_params.ttl_s: unknown key (eviction_policy 'lru' takes no parameters)"),
    (["engine.eviction_params=[1]"], "engine.eviction_params must be a mapping, got [1]"),
    (["engine.kv_allocator=contiguous", "engine.kv_allocator_params={reserve: pow3}"],
     "engine.kv_allocator_params.reserve must be one of max_model_len, pow2, oracle "
     "(did you mean 'pow2'?), got 'pow3'"),
    (["engine.queue_policy=tiered", "engine.queue_params={tiers: []}"],
     "engine.queue_params.tiers: the tiered policy needs a non-empty list of tiers"),
    (["engine.queue_policy=tiered", "engine.queue_params={tier: []}"],
     "engine.queue_params: unknown key 'tier' for queue_policy 'tiered' (did you mean 'tiers'?)"),
])
def test_bad_params_fail_before_any_work(monkeypatch, sets, message):
    def no_work(*args, **kwargs):
        raise AssertionError("the workload was generated before the params were checked")

    monkeypatch.setattr(run_module, "generate", no_work)
    with pytest.raises(ConfigError) as e:
        run(build_config(None, ["engine.max_model_len=4096", *sets]))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_trace_format(tmp_path, capsys):
    importlib.import_module("tests.plugins.ms_trace_format")
    trace = tmp_path / "log.csv"
    rows = [(i * 250, 100 + 10 * i, 20 + i) for i in range(40)]  # one request every 250 ms
    trace.write_text("t_ms,in_tok,out_tok\n" + "".join(f"{t},{a},{b}\n" for t, a, b in rows))
    for fmt in ("kvlog", "auto"):  # named, and found by auto-detection from its columns
        code, err, summary = kvsim_run(tmp_path, capsys, "--set", f"workload.trace={trace}",
                                       "--set", f"workload.format={fmt}")
        assert code == 0, err
        req = pd.read_parquet(tmp_path / "run" / "requests.parquet").sort_values("req_id")
        assert summary["requests"]["finished"] == 40
        assert req.arrival_s.tolist() == [t / 1000 for t, _, _ in rows]
        assert req.prompt_tokens.tolist() == [a for _, a, _ in rows]
        assert req.output_tokens.tolist() == [b for _, _, b in rows]
    trace.write_text("t_ms,in_tok\n0,5\n")
    code, err, _ = kvsim_run(tmp_path, capsys, "--set", f"workload.trace={trace}",
                             "--set", "workload.format=kvlog")
    assert code == 2 and "out_tok" in err and len(err.splitlines()) == 1
