"""Prefill/decode disaggregation (engine/disagg.py): bad input, TTFT's split, the link's FIFO,
step = event advance, colocated untouched, and a hypothesis state machine over both pools'
blocks (every block in exactly one place; arrived = finished + rejected)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simulator.cli.main import main
from simulator.config.schema import build_config
from simulator.engine.disagg import build_disaggregated, run_disaggregated
from simulator.engine.run import run
from simulator.errors import ConfigError
from simulator.workload.generators import RequestArrays
from simulator.workload.request import Request, Status

PD = ["cluster.mode=disaggregated"]
SMALL = ["workload.num_requests=150", "workload.arrival.rate=30", "workload.prompt_tokens.mean=600",
         "workload.output_tokens.mean=60", "engine.max_model_len=4096"]


def cfg(*extra):
    return build_config(None, [*SMALL, *PD, *extra])


# --- must-show 4: bad input, one line each ---------------------------------------------------
@pytest.mark.parametrize("args,expected", [
    (["cluster.decode.replicas=0"], "cluster.decode.replicas must be an integer >= 1, got 0"),
    (["cluster.prefill.replicas=0"], "cluster.prefill.replicas must be an integer >= 1, got 0"),
    (["cluster.transfer.bandwidth_gbps=0"],
     "cluster.transfer.bandwidth_gbps must be a number of GB/s > 0, got 0"),
    (["cluster.transfer.bandwidth_gbps=fast"],
     "cluster.transfer.bandwidth_gbps must be a number of GB/s > 0"),
    (["cluster.transfer.latency_us=-1"],
     "cluster.transfer.latency_us must be a number of microseconds >= 0"),
    (["cluster.transfer.kind=pcie"], "cluster.transfer.kind must be one of nvlink, infiniband, ethernet"),
    (["cluster.replicas=3"], "cluster.replicas (3) is the colocated fleet's size"),
    (["cluster.decode.gpu=h1000"], "cluster.decode: unknown GPU 'h1000'"),
    (["cluster.prefill.router=round_robbin"], "cluster.prefill.router: unknown router 'round_robbin'"),
    (["engine.backend=vllm"], "engine.backend must be kvsim"),
    (["engine.scheduler=static"], "engine.scheduler must be continuous, got static"),
    (["engine.kv_allocator=contiguous"], "the prefill pool's KV allocator must be paged"),
    (["engine.kv_offloading_size=32"], "engine.kv_offloading_size must be off"),
    (["engine.async_scheduling=true"], "engine.async_scheduling true is not modelled for P/D pools"),
])
def test_bad_pd_config_is_one_line(capsys, args, expected):
    sets = [x for a in [*PD, *args] for x in ("--set", a)]
    code = main(["run", "--quiet", "--out", "/tmp/kvsim-test-pd-cli", *sets])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and "Traceback" not in err
    assert expected in err


# --- the run -----------------------------------------------------------------------------------
def test_ttft_is_the_sum_of_its_parts_and_bytes_are_blocks():
    res = run(cfg("cluster.decode.replicas=2", "engine.enable_prefix_caching=false"))
    r = res.requests
    assert (r.status == "finished").all() and len(r) == 150
    parts = r[["ttft_prefill_queue_s", "ttft_prefill_s", "ttft_decode_queue_s", "ttft_transfer_s",
               "ttft_first_decode_s"]]
    assert (parts.to_numpy() >= 0).all()
    np.testing.assert_allclose(parts.sum(axis=1), r.first_token_s - r.arrival_s, rtol=0, atol=1e-9)
    bs = res.setup.engine.block_size
    assert (r.kv_transfer_blocks == -(-r.prompt_tokens // bs)).all()  # no local hits
    per_token = res.setup.memory.kv_bytes_per_token
    assert (r.kv_transfer_bytes == r.kv_transfer_blocks * bs * per_token).all()
    # the transfer takes at least bytes / bandwidth + latency
    bw, lat = build_config(None, PD).cluster.transfer.link()
    assert (r.ttft_transfer_s >= r.kv_transfer_bytes / (bw * 1e9) + lat * 1e-6 - 1e-12).all()
    d = res.summary["disaggregation"]
    assert d["decode"]["replicas"] == 2 and sorted(r.decode_replica.unique()) == [1, 2]
    assert d["transfer"]["bytes"] == int(r.kv_transfer_bytes.sum())
    assert 0 < d["transfer_share_of_ttft"] < 1
    assert 0 < d["prefill"]["utilization"] <= 1 and 0 < d["decode"]["utilization"] <= 1
    it = res.iterations
    assert set(it.pool) == {"prefill", "decode"}
    # prefill steps sample only first tokens (legs of max_tokens 1): one per request
    assert it[it.pool == "prefill"].num_sampled.sum() == 150


def test_a_slow_link_queues_transfers_first_in_first_out():
    _, _, r, _, dc = run_disaggregated(cfg("cluster.transfer.kind=ethernet",
                                           "cluster.transfer.bandwidth_gbps=0.5"))
    assert r.kv_link_wait_s.max() > 0
    wire_start = dc.t_wire[r.req_id.to_numpy()]
    wire_end = wire_start + r.kv_transfer_bytes.to_numpy() / 0.5e9
    order = np.argsort(wire_start, kind="stable")  # one prefill and one decode replica: one link
    assert (wire_start[order][1:] >= wire_end[order][:-1] - 1e-12).all()
    fast = run(cfg("cluster.transfer.kind=nvlink")).requests
    assert r.ttft_transfer_s.mean() > 10 * fast.ttft_transfer_s.mean()


def test_event_advance_equals_step_by_step():
    extra = ["cluster.decode.replicas=2", "engine.num_gpu_blocks_override=300",
             "workload.arrival.rate=60"]
    a = run(cfg(*extra))
    b = run(cfg(*extra, "engine.advance=step"))
    assert a.requests.equals(b.requests)
    assert json.dumps(a.summary, sort_keys=True) == json.dumps(b.summary, sort_keys=True)


def test_runs_are_deterministic_and_rejections_counted():
    extra = ["engine.max_model_len=1024", "workload.prompt_tokens.mean=700"]
    a, b = run(cfg(*extra)), run(cfg(*extra))
    assert a.requests.equals(b.requests)
    req = a.summary["requests"]
    assert req["rejected"] > 0 and req["arrived"] == req["finished"] + req["rejected"] == 150


def test_colocated_config_and_summary_carry_no_pd_fields():
    c = build_config(None, ["cluster.replicas=2"])
    assert "mode" not in c.cluster.to_dict() and "transfer" not in c.cluster.to_dict()
    res = run(build_config(None, SMALL + ["cluster.replicas=2"]))
    assert "disaggregation" not in res.summary and "ttft_transfer_s" not in res.requests


# --- must-show 3 (P/D part): a state machine over both pools ---------------------------------
MAX_REQUESTS = 60


class PDMachine(RuleBasedStateMachine):
    """Random arrivals and time steps on a P/D cluster with small pools and a slow link (pull
    waits, queued transfers, stalled prefill replicas); prefix caching off, so a used block has
    one owner. After every step each block is in exactly one place."""

    def __init__(self) -> None:
        super().__init__()
        config = build_config(None, [*PD, "engine.num_gpu_blocks_override=40", "engine.block_size=16",
                                     "engine.max_num_seqs=6", "engine.max_num_batched_tokens=128",
                                     "engine.enable_prefix_caching=false", "engine.max_model_len=480",
                                     "cluster.prefill.replicas=2", "cluster.decode.replicas=2",
                                     "cluster.transfer.bandwidth_gbps=2"])
        n = MAX_REQUESTS
        dummy = RequestArrays(np.zeros(n), np.ones(n, np.int64), np.ones(n, np.int64),
                              np.zeros(n, np.int64))
        self.dc = build_disaggregated(config, dummy)
        self.reqs: dict[int, Request] = {}
        # usable blocks of each pool (vLLM's null block is never handed out)
        self.usable = {id(rep): rep.scheduler.kv.pool.num_free_blocks
                       for c in (self.dc.prefill, self.dc.decode) for rep in c.replicas}

    @precondition(lambda self: len(self.reqs) < MAX_REQUESTS)
    @rule(prompt=st.integers(1, 300), output=st.integers(1, 120))
    def arrive(self, prompt, output):
        rid = len(self.reqs)
        req = self.reqs[rid] = Request(rid, self.dc.env.now, prompt, output)
        self.dc.submit(req)

    @rule(dt=st.floats(0.0005, 0.3))
    def advance(self, dt):
        env = self.dc.env
        env.run(until=env.now + dt)

    def teardown(self) -> None:
        dc = self.dc
        dc.close()
        dc.env.run()
        self.places()
        ended = [r for r in self.reqs.values() if r.status in (Status.FINISHED, Status.REJECTED)]
        assert len(ended) == len(self.reqs) == dc.num_arrived == dc.num_ended()
        for cluster in (dc.prefill, dc.decode):  # every block back in the free queue
            for rep in cluster.replicas:
                kv = rep.scheduler.kv
                assert not kv.req_to_blocks and kv.pool.num_free_blocks == self.usable[id(rep)]

    @invariant()
    def places(self):
        dc = self.dc
        pulling = {r.req_id for q in dc.pull for r in q}
        assert pulling.isdisjoint(dc.in_transit)
        assert set(dc.held) == pulling | dc.in_transit  # a held leg awaits its pull or moves
        on_prefill = set(dc.reqs) - set(dc.held)  # leg waiting or running
        for cluster, allowed in ((dc.prefill, on_prefill | set(dc.held)), (dc.decode, None)):
            for rep in cluster.replicas:
                kv = rep.scheduler.kv
                owners = kv.req_to_blocks
                blocks = [b for table in owners.values() for b in table]
                assert len(set(blocks)) == len(blocks)  # no block with two owners
                assert len(blocks) + kv.pool.num_free_blocks == self.usable[id(rep)]
                if allowed is not None:
                    assert set(owners) <= allowed
                else:  # decode: in transit, or landed and waiting / running there
                    for rid in owners:
                        req = self.reqs[rid]
                        assert rid in dc.in_transit or (
                            req.status in (Status.WAITING, Status.RUNNING, Status.PREEMPTED)
                            and not np.isnan(dc.t_landed[rid]))
        for rid in dc.held:  # a finished leg keeps its blocks until its KV has landed
            rep = dc.prefill.replicas[int(dc.p_replica[rid])]
            assert rid in rep.scheduler.kv.req_to_blocks
        for rid in dc.in_transit:
            rep = dc.decode.replicas[int(dc.d_replica[rid])]
            assert rid in rep.scheduler.kv.req_to_blocks
        # arrived = ended + in flight, each request in exactly one stage
        ended = sum(r.status in (Status.FINISHED, Status.REJECTED) for r in self.reqs.values())
        on_decode = sum(r.status in (Status.WAITING, Status.RUNNING, Status.PREEMPTED)
                        and not np.isnan(dc.t_landed[r.req_id]) for r in self.reqs.values())
        assert dc.num_arrived == len(self.reqs) == ended + len(dc.reqs) + on_decode


TestPDMachine = PDMachine.TestCase
TestPDMachine.settings = settings(max_examples=40, stateful_step_count=40, deadline=None)


def test_the_workload_must_fit_a_decode_replica():
    with pytest.raises(ConfigError, match="cluster.decode: unknown GPU"):
        run(cfg("cluster.decode.gpu=nope"))
