"""The vllm backend's pieces that need no vLLM: bad input (vLLM missing, unsupported settings),
token ids that reproduce kvsim's block identities, and the step-trace comparison."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from simulator.backends.vllm import INSTALL_HINT, TokenIds, import_vllm
from simulator.config.schema import build_config
from simulator.engine.kvcache.prefix import BlockHasher
from simulator.engine.run import run
from simulator.engine.steptrace import StepTrace, first_divergence, read_trace
from simulator.errors import ConfigError
from simulator.workload.request import Request

SMALL = ["workload.num_requests=5", "engine.max_model_len=4096"]


@pytest.fixture
def no_vllm(monkeypatch):
    """vLLM made unimportable, whether or not it is installed."""
    monkeypatch.setitem(sys.modules, "vllm", None)


def test_missing_vllm_is_one_line_saying_how_to_install(no_vllm):
    with pytest.raises(ConfigError) as e:
        import_vllm()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(INSTALL_HINT)
    assert "--no-deps vllm==0.33.0" in msg and "kvsim[vllm]" in msg


def test_missing_vllm_from_the_cli(no_vllm, capsys):
    from simulator.cli.main import main
    assert main(["run", "--set", "engine.backend=vllm", *sum((["--set", s] for s in SMALL), []),
                 "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install --no-deps vllm==0.33.0" in err[0]
    assert main(["parity", "--case", "fcfs-nocache"]) == 2
    assert "kvsim[vllm]" in capsys.readouterr().err


@pytest.mark.parametrize("setting,named", [
    ("engine.kv_allocator=contiguous", "kv_allocator 'contiguous'"),
    ("engine.scheduler=static", "scheduler 'static'"),
    ("engine.queue_policy=tiered", "queue_policy 'tiered'"),
    ("engine.preemption_mode=swap", "preemption_mode 'swap'"),
    ("engine.eviction_policy=lfu", "eviction_policy 'lfu'"),
    ("engine.enable_chunked_prefill=false", "enable_chunked_prefill false"),
])
def test_unsupported_combinations_are_config_errors(setting, named):
    extra = ["engine.queue_params={by: prompt_tokens, tiers: [{max_prompt_tokens: 100, "
             "max_seq_share: 0.5}, {}]}"] if "tiered" in setting else []
    if "chunked" in setting:
        extra = ["engine.max_num_batched_tokens=4096"]
    cfg = build_config(None, SMALL + ["engine.backend=vllm", setting, *extra])
    with pytest.raises(ConfigError, match=f"unsupported with engine.backend vllm: engine.{named}"):
        run(cfg)  # raised before vLLM is imported, so the same with or without it


def test_backend_name_is_checked_with_a_hint():
    with pytest.raises(ConfigError, match=r"engine.backend must be kvsim or vllm.*did you mean 'vllm'"):
        build_config(None, ["engine.backend=vlm"])


def _req(rid, prompt, output, prefix):
    return Request(rid, 0.0, prompt, output, prefix=None if prefix is None else np.asarray(prefix))


def _blocks(ids: list[int], bs: int) -> list[tuple[int, ...]]:
    """Chained block identities as vLLM hashes them: the token tuples of all blocks so far."""
    return [tuple(ids[:(j + 1) * bs]) for j in range(len(ids) // bs)]


@pytest.mark.parametrize("bs", [4, 6, 16])
def test_token_ids_share_exactly_the_blocks_kvsim_shares(bs):
    """For requests with shared chunks, unique tails and a session answer resent by its next
    turn, two vLLM blocks (chained token content) are equal iff kvsim's block hashes are."""
    c = 8
    reqs = [_req(0, 20, 6, [1, 2, 3]),  # ids for its prompt only (3 = ceil(20 / 8) chunks)
            _req(1, 20, 5, [1, 2, 9]),
            _req(2, 13, 12, [1, 2, 3, 4]),  # 4 ids * 8 = 32 > 16: they describe the answer
            _req(3, 30, 3, [1, 2, 3, 4]),  # the next turn resends request 2's answer
            _req(4, 17, 2, None)]
    tok, hasher = TokenIds(c), BlockHasher(bs, c)
    ids = {r.req_id: tok.ids(r, 0, r.prompt_tokens + r.output_tokens) for r in reqs}
    for r in reqs:
        n = (r.prompt_tokens + r.output_tokens) // bs
        r.block_hashes = None
        hasher.hashes(r, n)
    for a in reqs:
        for b in reqs:
            va, vb = _blocks(ids[a.req_id], bs), _blocks(ids[b.req_id], bs)
            for j in range(min(len(va), len(vb))):
                assert (va[j] == vb[j]) == (a.block_hashes[j] == b.block_hashes[j]), (a, b, j)
    # and the sharing is real: request 3 repeats request 2's stream, answer included
    assert ids[3][:25] == ids[2][:25] and ids[3][25:] != ids[2][25:]
    assert len(set(ids[4]) & set(ids[0])) == 0


def test_first_divergence_names_step_and_field(tmp_path):
    a = StepTrace()
    for k in range(3):
        a.rows.append({"step": k, "t_s": float(k), "scheduled": [[0, 1]], "preempted": [],
                       "admitted": [], "finished": [], "kv_usage": 0.5})
    b = StepTrace()
    b.rows = [dict(r) for r in a.rows]
    assert first_divergence(a.rows, b.rows) is None
    b.rows[2]["preempted"] = [0]
    assert first_divergence(a.rows, b.rows) == (2, "preempted")
    assert first_divergence(a.rows, b.rows[:2]) == (2, "length")
    assert read_trace(a.write(tmp_path / "t.jsonl")) == a.rows


def test_kvsim_trace_records_admissions_with_prefix_hits(tmp_path):
    from simulator.cli.main import main
    out = tmp_path / "trace.jsonl"
    assert main(["run", "--set", "workload.num_requests=30", "--set", "engine.max_model_len=4096",
                 "--set", "workload.system_prompts={count: 1, tokens: {dist: constant, value: 600}}",
                 "--out", str(tmp_path / "run"), "--quiet", "--trace-steps", str(out)]) == 0
    rows = read_trace(out)
    admitted = [a for r in rows for a in r["admitted"]]
    assert sorted(r for r, _ in admitted) == list(range(30))  # no preemption at this load
    assert admitted[0] == [0, 0] and any(hit >= 512 for _, hit in admitted[1:])
    assert sum(len(r["finished"]) for r in rows) == 30


def test_prefix_affinity_router_is_refused_before_any_work():
    cfg = build_config(None, SMALL + ["engine.backend=vllm", "cluster.replicas=2",
                                      "cluster.router=prefix_affinity"])
    with pytest.raises(ConfigError, match="unsupported with engine.backend vllm: cluster.router "
                                          "prefix_affinity"):
        run(cfg)
