"""The hybrid KV allocator (engine/kvcache/hybrid.py): one block table per KV cache group over one
block pool, sliding-window and chunked-local groups freeing what falls out of their window, as
vLLM 0.33's HybridKVCacheCoordinator; its choice by build.py and the CLI end to end."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from simulator.config.schema import from_dict
from simulator.engine.build import setup
from simulator.engine.kvcache import ALLOCATORS, HybridAllocator
from simulator.engine.kvcache.hybrid import layout_params
from simulator.engine.protocols import QueueContext
from simulator.engine.scheduling import BATCHING_MODES, QUEUE_POLICIES, Scheduler
from simulator.errors import ConfigError
from simulator.hardware.kv_spec import LayerKVSpec, cdiv, kv_cache_layout
from simulator.hardware.models import get_model
from simulator.workload.request import Request


def spec(kind: str, size: int | None = None, bs: int = 16) -> LayerKVSpec:
    return LayerKVSpec(kind, bs, 1, 1, 1, 1, sliding_window=size if kind == "sliding_window" else None,
                       attention_chunk_size=size if kind == "chunked_local" else None)


def scheduler(kv, budget=8192, max_num_seqs=16) -> Scheduler:
    queue = QUEUE_POLICIES.build("fcfs", None, "q", QueueContext(max_num_seqs, kv.total_slots))
    return Scheduler(kv, queue, BATCHING_MODES.get("continuous")(), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=budget)


def test_long_decode_keeps_at_most_window_over_block_size_plus_one_blocks_per_sliding_group():
    """gpt-oss-120b's layout (sliding 128 + full, block 16), driven through kvsim's scheduler: a
    1,000-token prompt (chunks of 512) decoding 3,000 tokens. After every step the sliding group
    holds every block of the window the next token attends to and, once decoding, never more than
    128 / 16 + 1 = 9 (its prefill chunks' blocks freed at the first decode step, as vLLM does);
    the full group holds every block of the sequence."""
    layout = kv_cache_layout(get_model("gpt-oss-120b"), tp=1, block_size=16)
    kv = HybridAllocator.from_layout(layout, 2000, max_model_len=8192, max_in_flight_tokens=512)
    sched = scheduler(kv, budget=512)
    r = Request(0, 0.0, 1000, 3000)
    sched.add_request(r)
    peak, steps = 0, 0
    while sched.has_work:
        sched.schedule(float(steps))
        sched.commit(float(steps) + 1)
        steps += 1
        if not sched.has_work:
            break
        computed = int(sched.running.computed[0])
        sliding, full = kv.req_to_blocks[0]
        assert all(full) and len(full) >= cdiv(computed, 16)  # full attention keeps every block
        # the next token attends to tokens [computed - 127, computed]: none of their blocks freed
        assert all(sliding[max(0, computed - 127) // 16:])
        if computed > 1000:  # decoding
            peak = max(peak, kv.blocks_held(r)[0])
            assert kv.blocks_held(r)[0] <= 128 // 16 + 1
    assert steps == 2 + 2999  # two prefill chunks (512 + 488), then one token a step
    assert peak == 128 // 16 + 1
    assert kv.pool.num_free_blocks == 1999  # all returned


def test_chunked_local_frees_finished_chunks():
    kv = HybridAllocator(400, 16, [spec("chunked_local", 64), spec("full_attention")],
                         max_model_len=4096, max_in_flight_tokens=64)
    r = Request(0, 0.0, 300, 10)
    for c in range(0, 300, 50):  # prefill in chunks of 50 tokens
        assert kv.allocate_slots(r, 50, c) is not None
    chunked, full = kv.blocks_held(r)
    assert full == cdiv(300, 16) == 19
    # computed 250 at the last call: chunks [0, 192) done, blocks 0-11 freed; 12..18 held
    assert chunked == cdiv(300, 16) - 250 // 64 * 64 // 16 == 7


def test_admission_caps_recycling_groups_as_vllm_and_refuses_what_does_not_fit():
    """A 32k request with full_sequence_must_fit: full group cdiv(32000, 16) = 2000 blocks, the
    sliding group only its admission cap cdiv(127 + 8192, 16) + 1 = 521."""
    specs = [spec("sliding_window", 128), spec("full_attention")]
    kv = HybridAllocator(2522, 16, specs, max_model_len=32768, max_in_flight_tokens=8192)
    r = Request(0, 0.0, 32000, 10)
    assert kv.max_request_slots(r) == (2001 + 521) * 16  # final 32009 tokens
    # the first chunk takes 512 blocks in each group; capacity 143: at 143 computed tokens the
    # sliding group's first block leaves the window, so the next step must call again
    assert kv.allocate_slots(r, 8192, 0, full_sequence_must_fit=True) == 16 + 127
    assert kv.blocks_held(r) == [512, 512]
    assert kv.allocate_slots(r, 8192, 8192) == (504 + 1) * 16 + 127  # 504 blocks freed, 512 new
    assert kv.blocks_held(r) == [8 + 512, 1024]
    kv.free(r)
    small = HybridAllocator(2520, 16, specs, max_model_len=32768, max_in_flight_tokens=8192)
    assert small.allocate_slots(r, 8192, 0, full_sequence_must_fit=True) is None  # 2521 > 2519
    assert small.pool.num_free_blocks == 2519  # nothing taken


def test_build_picks_hybrid_for_hybrid_layouts_only():
    base = {"gpu": "h100-sxm", "engine": {"max_model_len": 32768, "max_num_seqs": 256}}
    s = setup(from_dict({**base, "model": "gpt-oss-120b"}))
    assert s.kv_allocator == "hybrid"
    # vLLM's max_in_flight_tokens = max_concurrent_batches x max_num_batched_tokens: two batches
    # under async scheduling (vLLM 0.33's default), one when synchronous
    assert s.params.kv_allocator == {"groups": ("sliding_window:128", "full_attention"),
                                     "max_in_flight_tokens": 2 * 8192}
    sync = setup(from_dict({**base, "model": "gpt-oss-120b",
                            "engine": {**base["engine"], "async_scheduling": False}}))
    assert sync.params.kv_allocator["max_in_flight_tokens"] == 8192
    assert s.lines()[0].startswith("model openai/gpt-oss-120b on h100-sxm x tp=1; hybrid KV")
    gemma = setup(from_dict({**base, "model": "gemma-3-27b"}))
    assert gemma.params.kv_allocator["groups"] == ("sliding_window:1024",) * 6 + ("full_attention",)
    assert setup(from_dict({**base, "model": "llama-3.1-8b"})).kv_allocator == "paged"
    unified = {"max_model_len": 16384, "max_num_seqs": 256, "disable_hybrid_kv_cache_manager": True}
    s = setup(from_dict({**base, "model": "gpt-oss-120b", "engine": unified}))
    assert s.kv_allocator == "paged"  # vLLM's --disable-hybrid-kv-cache-manager: one full group
    assert s.lines()[1] == "disable_hybrid_kv_cache_manager True"


def test_hybrid_allocator_runs_through_the_registry_with_explicit_groups():
    kv = ALLOCATORS.build("hybrid", {"groups": ["sliding_window:32", "full_attention"],
                                     "max_in_flight_tokens": 64}, "engine.kv_allocator_params",
                          _ctx(100))
    assert [s.kind for s in kv.specs] == ["sliding_window", "full_attention"]
    with pytest.raises(ConfigError, match="engine.kv_allocator_params.groups"):
        ALLOCATORS.validate_params("hybrid", {"groups": ["sliding_window"]}, "engine.kv_allocator_params")


def _ctx(num_blocks):
    from simulator.engine.protocols import KVContext
    return KVContext(num_gpu_blocks=num_blocks, block_size=16, kv_budget_slots=0, max_model_len=4096,
                     enable_prefix_caching=False, eviction_policy="lru", eviction_params={},
                     prefix_chunk_tokens=512)


def test_layout_params_name_every_group():
    layout = kv_cache_layout(get_model("llama-4-scout"), tp=1, block_size=16)
    assert layout_params(layout, 8192)["groups"] == ("chunked_local:8192",) * 3 + ("full_attention",)


def test_32k_prompt_on_gpt_oss_runs_end_to_end_where_full_attention_refuses(tmp_path):
    """`python -m simulator run --model gpt-oss-120b --gpu h100-sxm`, gpu_memory_utilization 0.8,
    max_model_len 32768: 1.85 GiB of KV cache, 3,360 blocks. Four 32,000-token prompts run to the
    end (one at a time: each is admitted with 2,001 + 521 blocks); with the hybrid manager disabled
    (every layer keeps every token) the same command refuses to start, one line, exit 2."""
    cmd = [sys.executable, "-m", "simulator", "run", "--model", "gpt-oss-120b", "--gpu", "h100-sxm",
           "--gpu-memory-utilization", "0.8", "--max-model-len", "32768", "--max-num-seqs", "256",
           "--set", "workload.prompt_tokens={dist: constant, value: 32000}",
           "--set", "workload.output_tokens={dist: constant, value: 64}",
           "--set", "workload.num_requests=4", "--out", str(tmp_path / "run")]
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "hybrid KV" in ok.stdout and "# GPU blocks: 3,360" in ok.stdout
    assert "requests: 4 arrived, 4 finished, 0 rejected" in ok.stdout
    bad = subprocess.run([*cmd, "--set", "engine.disable_hybrid_kv_cache_manager=true"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "kvsim: error: engine.max_model_len (32768) is larger than the 26864 tokens the KV cache can "
        "hold (1680 blocks of 16 on h100-sxm x tp=1, less vLLM's null block); lower max_model_len or "
        "raise gpu_memory_utilization / tensor_parallel_size"]


class HybridMachine(RuleBasedStateMachine):
    """Blocks are conserved over random admit / grow / free on a sliding + chunked + full layout:
    free + held == pool, no block in two places, every table holds exactly vLLM's blocks."""

    SPECS = [spec("sliding_window", 8, 4), spec("chunked_local", 12, 4), spec("full_attention", bs=4)]

    def __init__(self):
        super().__init__()
        self.kv = HybridAllocator(61, 4, self.SPECS, max_model_len=200, max_in_flight_tokens=8)
        self.tokens: dict[int, int] = {}  # req_id -> tokens with slots
        self.computed: dict[int, int] = {}  # req_id -> computed at its last allocation
        self.next_id = 0

    @rule(n=st.integers(1, 30), must_fit=st.booleans())
    def admit(self, n, must_fit):
        r = Request(self.next_id, 0.0, n, 5)
        self.next_id += 1
        if self.kv.allocate_slots(r, n, 0, full_sequence_must_fit=must_fit) is not None:
            self.tokens[r.req_id], self.computed[r.req_id] = n, 0

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), n=st.integers(1, 9))
    def grow(self, data, n):
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        before = self.kv.pool.num_free_blocks
        c = self.tokens[rid]  # the tokens allocated so far are now computed
        cap = self.kv.allocate_slots(Request(rid, 0.0, c, 5), n, c)
        self.computed[rid] = c  # skipped blocks are freed even when the allocation fails
        if cap is None:
            assert self.kv.pool.num_free_blocks >= before
        else:
            self.tokens[rid] = c + n
            assert cap <= cdiv(c + n, 4) * 4  # the slots held, or less: the next freeing point

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.tokens)))
        self.kv.free(Request(rid, 0.0, 1, 1))
        del self.tokens[rid], self.computed[rid]

    @invariant()
    def conserved(self):
        kv = self.kv
        held = [b for tables in kv.req_to_blocks.values() for t in tables for b in t if b]
        free = set(kv.pool.free_queue.order())
        assert len(held) == len(set(held)) and not free & set(held)
        assert len(free) + len(held) == kv.pool.num_blocks - 1
        assert all(kv.pool.ref_cnt[b] == 1 for b in held) and kv.pool.ref_cnt[0] == 1
        for rid, t in self.tokens.items():
            tables = kv.req_to_blocks[rid]
            assert all(len(table) == cdiv(t, 4) for table in tables)
            c = self.computed[rid]
            for s, got in zip(self.SPECS, kv.blocks_held(Request(rid, 0.0, 1, 1))):
                assert got == cdiv(t, 4) - s.num_skipped_tokens(c) // 4


TestHybridMachine = HybridMachine.TestCase
TestHybridMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
