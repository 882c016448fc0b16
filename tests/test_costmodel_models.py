"""Cost-model terms of the 2025-26 models (issue 15): MoE, MLA, sliding windows, fp8 KV, fp8 / fp4
and 4-bit weights, expert parallelism. Each term moves the step time the way physics says, by the
exact ratio where one is exact (costmodel.py docstring, item 7)."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.config.schema import build_config
from simulator.engine.costmodel import CostModel, StepShape, prefill_pairs, window_kv_sums
from simulator.engine.run import run
from simulator.hardware.gpus import get_gpu
from simulator.hardware.models import get_model

NEW_MODELS = ["deepseek-v3", "gpt-oss-120b", "gemma-3-27b", "qwen3-30b-a3b", "llama-4-scout", "qwen3-8b"]


@cache
def cost(model: str, gpu: str = "h100-sxm", tp: int = 1, **kw) -> CostModel:
    return CostModel(get_model(model), get_gpu(gpu), tp=tp, max_tokens=2048, **kw)


def decode(m: int, ctx: int, window: int = 0) -> StepShape:
    """m one-token decodes after ctx tokens each (window: the sliding layers' window)."""
    reach = ctx + 1
    return StepShape(m, m, float(m * reach), m * reach, m, 0, m * min(reach, window) if window else -1)


def slope(cm: CostModel, shape_of, a: int, b: int) -> float:
    """Seconds per unit of the shape's argument between a and b."""
    return (cm.step_time(shape_of(b)) - cm.step_time(shape_of(a))) / (b - a)


# --- KV dtype ------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-32b", "deepseek-v3"])
def test_fp8_kv_halves_the_decode_kv_read_time(model):
    """Must-show 3: a decode's KV read (seconds per KV token, memory-bound) halves with fp8."""
    auto, fp8 = cost(model, tp=8), cost(model, tp=8, kv_cache_dtype="fp8")
    per_token = [slope(cm, lambda c: decode(64, c), 20_000, 40_000) for cm in (auto, fp8)]
    assert per_token[1] == pytest.approx(per_token[0] / 2, rel=1e-9)
    assert fp8.kv_dtype_bytes == 1 and auto.kv_dtype_bytes == 2
    assert "fp8 KV" in fp8.describe() and "fp8 KV" not in auto.describe()


# --- sliding windows -------------------------------------------------------------------------
@pytest.mark.parametrize("model,window,windowed,layers", [("gpt-oss-120b", 128, 18, 36),
                                                          ("gemma-3-27b", 1024, 52, 62)])
def test_sliding_layers_read_at_most_the_window(model, window, windowed, layers):
    cm = cost(model, tp=2)
    assert (cm.window_tokens, cm._layers_window, cm._layers) == (window, windowed, layers)
    # past the window only the full layers' reads grow: the slope falls by full / all layers
    capped = slope(cm, lambda c: decode(32, c, window), 20_000, 40_000)
    uncapped = slope(cm, lambda c: decode(32, c), 20_000, 40_000)
    assert capped == pytest.approx(uncapped * (layers - windowed) / layers, rel=1e-9)
    # inside the window the cap changes nothing; -1 (not given) reads kv_tokens
    short = decode(32, window - 10, window)
    assert cm.step_time(short) == cm.step_time(short._replace(window_kv_tokens=-1))
    assert cm.step_time(decode(32, 20_000, window)) < cm.step_time(decode(32, 20_000))


def test_sliding_prefill_flops_capped_at_t_times_window():
    """A long prompt's windowed layers compute at most T * window query-key pairs."""
    cm = cost("gpt-oss-120b", tp=1)
    n = 2000
    shape = StepShape(n, 1, prefill_pairs(n, 30_000), 30_000 + n, 1, n, n * 128)
    full_only = replace(get_model("gpt-oss-120b"), layer_types=(), sliding_window=None)
    assert cm.step_time(shape) < CostModel(full_only, get_gpu("h100-sxm"), max_tokens=2048).step_time(shape)


def test_window_kv_sums_equals_the_sum_of_minima():
    rng = np.random.default_rng(1)
    c = rng.integers(0, 500, 40)
    ahead = np.arange(1, 300)
    want = [int(np.minimum(c + a, 128).sum()) for a in ahead]
    assert window_kv_sums(c, ahead, 128).tolist() == want


def test_full_attention_models_have_no_window():
    for model in ("llama-3.1-8b", "qwen3-8b", "deepseek-v3"):
        assert cost(model).window_tokens == 0


def assert_event_equals_step(overrides: list[str]) -> None:
    """The event-level and the step-by-step engine write the same bytes for this config."""
    files = {}
    with tempfile.TemporaryDirectory() as tmp:
        for advance in ("step", "event"):
            res = run(build_config(None, [*overrides, f"engine.advance={advance}"]))
            res.write(Path(tmp) / advance)
            files[advance] = [(Path(tmp) / advance / n).read_bytes()
                              for n in ("summary.json", "requests.parquet", "iterations.parquet")]
    assert files["event"] == files["step"]


def test_scheduler_gives_window_kv_and_event_advance_matches_steps():
    """gpt-oss-20b decodes past its 128-token window: the scheduler's window_kv_tokens reaches
    the cost model, and the event-level decode runs (window_kv_sums) equal stepping."""
    overrides = ["model=gpt-oss-20b", "gpu=h100-sxm", "workload.num_requests=30", "workload.arrival.rate=4",
                 "workload.prompt_tokens={dist: uniform, low: 50, high: 400}",
                 "workload.output_tokens={dist: uniform, low: 100, high: 300}", "engine.max_model_len=4096"]
    assert_event_equals_step(overrides)
    import simulator.engine.scheduling.scheduler as sched_mod
    seen = []
    original = sched_mod.Scheduler._summarise

    def spy(self, *a, **k):
        batch = original(self, *a, **k)
        seen.append((self.window_tokens, batch.shape.kv_tokens, batch.shape.window_kv_tokens))
        return batch
    sched_mod.Scheduler._summarise = spy
    try:
        run(build_config(None, [*overrides, "engine.advance=step", "workload.num_requests=8"]))
        run(build_config(None, ["model=llama-3.1-8b", "workload.num_requests=3"]))
    finally:
        sched_mod.Scheduler._summarise = original
    windowed = [s for s in seen if s[0] and s[1]]  # an empty schedule (async) reads nothing
    bad = [s for s in windowed if not (s[0] == 128 and 0 < s[2] <= s[1])]
    assert windowed and not bad, bad[:5]
    assert any(wkv < kv for _, kv, wkv in windowed)
    assert all(wkv == -1 for w, _, wkv in seen if not w)  # full attention: not computed


# --- MoE ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b", "mixtral-8x7b"])
def test_experts_touched_at_one_token_is_k_and_tends_to_all(model):
    m = get_model(model)
    cm = cost(model, tp=8)
    e, k = m.num_experts, m.experts_per_token
    touched = lambda t: float(e * (1 - (1 - k / e) ** t))  # noqa: E731  (the formula, by hand)
    assert touched(1) == pytest.approx(k)
    assert touched(10**6) == pytest.approx(e)
    # one token's MoE MLP costs no more than k experts' GEMMs, much less than all E experts'
    t1 = float(cm._moe_mlp(np.array([1.0]))["mlp_down_proj"][0])
    all_hit = float(CostModel(replace(m, num_experts=k), get_gpu("h100-sxm"), tp=8,
                              max_tokens=64)._moe_mlp(np.array([1.0]))["mlp_down_proj"][0])
    assert t1 == pytest.approx(all_hit, rel=1e-12)  # k of E experts hit = k of k experts hit


def test_moe_decode_grows_with_batch_as_experts_fill_then_flattens():
    cm = cost("qwen3-30b-a3b")
    per_step = cm.per_step_time(np.array([1, 8, 64, 512]))
    assert np.all(np.diff(per_step) > 0)
    # from 1 to 64 tokens the experts touched go from 8 to ~126 of 128: the weights read grow ~16x
    assert per_step[2] / per_step[0] > 4


def test_shared_experts_and_dense_layers_add_time():
    m = get_model("deepseek-v3")
    gpu = get_gpu("h200")
    base = CostModel(m, gpu, tp=8, max_tokens=512).per_step_time(np.array([1, 256]))
    no_shared = CostModel(replace(m, num_shared_experts=0), gpu, tp=8, max_tokens=512).per_step_time(
        np.array([1, 256]))
    no_dense = CostModel(replace(m, dense_layers=()), gpu, tp=8, max_tokens=512).per_step_time(
        np.array([1, 256]))
    assert np.all(no_shared < base)
    # at 256 tokens an MoE layer touches ~all 256 experts: far more weights than the dense
    # 18432-wide MLP (= 9 experts' width) of the first three layers
    assert no_dense[1] > base[1]


def test_expert_parallel_is_free_at_one_gpu_and_dp_one():
    m = get_model("qwen3-30b-a3b")
    gpu = get_gpu("h100-sxm")
    shapes = [decode(8, 1000), StepShape(1024, 1, prefill_pairs(1024, 0), 1024, 1, 1024)]
    plain = CostModel(m, gpu, tp=1, max_tokens=2048)
    ep1 = CostModel(m, gpu, tp=1, max_tokens=2048, enable_expert_parallel=True)
    assert [ep1.step_time(s) for s in shapes] == [plain.step_time(s) for s in shapes]
    ep8 = CostModel(m, gpu, tp=8, max_tokens=2048, enable_expert_parallel=True)
    assert float(ep8.expert_comm_time_per_layer(4096)) == 0.0  # dp 1: the TP all-reduce combines
    ep16 = CostModel(m, gpu, tp=8, max_tokens=2048, enable_expert_parallel=True, data_parallel_size=2)
    comm = ep16.expert_comm_time_per_layer(np.array([0, 1, 512, 2048]))
    assert comm[0] == 0.0 and np.all(np.diff(comm) > 0)
    p = ep16.params
    # all-gather + reduce-scatter over 2 DP ranks: 2 x (latency + 1/2 * 2*T*hidden*2 bytes / bus)
    want = 2 * (p.allreduce_latency_s + 0.5 * 2 * 2048 * 2048 * 2 / (900e9 * p.allreduce_bus_eff))
    assert comm[3] == pytest.approx(want, rel=1e-12)
    assert ep16.step_time(shapes[1]) > ep8.step_time(shapes[1])
    # over dp ranks each rank runs its E/ep experts on all dp x T gathered tokens
    tp16 = CostModel(m, gpu, tp=16, max_tokens=2048, enable_expert_parallel=True)
    t = np.array([64.0])
    assert ep16._moe_mlp(t)["mlp_down_proj"] == tp16._moe_mlp(2 * t)["mlp_down_proj"]
    assert "expert-parallel" in ep8.describe()
    # a dense model ignores the flag (vLLM: EP applies to MoE layers only)
    assert cost("llama-3.1-8b", tp=2, enable_expert_parallel=True).extrapolated_terms == ()


# --- MLA -----------------------------------------------------------------------------------------
def test_mla_decode_reads_the_latent_at_the_kv_dtype():
    m = get_model("deepseek-v3")
    for kv_dtype, kvb in (("auto", 2), ("fp8", 1)):
        cm = cost("deepseek-v3", "h200", 8, kv_cache_dtype=kv_dtype)
        per_token = slope(cm, lambda c: decode(64, c), 20_000, 40_000) / 64  # seconds per KV token
        bw = get_gpu("h200").hbm_bandwidth_gbps * 1e9 * cm.params.attn_bandwidth_eff
        # one latent of kv_lora_rank + qk_rope_head_dim per token and layer, read whole on every rank
        assert per_token == pytest.approx(m.num_layers * (512 + 64) * kvb / bw, rel=1e-9)


def test_mla_decode_flops_are_the_absorbed_form():
    """Decode-only steps: MQA over the latent (2 (Lkv + R) + 2 Lkv per head and pair); steps with
    a prefill: MHA (2 (P + R) + 2 V), vLLM's forward_mqa / forward_mha."""
    cm = cost("deepseek-v3", "h200", 8)

    def compute_bound(prefill: int):  # huge pairs, few KV entries: the FLOP term decides
        return lambda pairs: StepShape(64, 64, float(pairs), 64, 64, prefill)
    absorbed = slope(cm, compute_bound(0), 10**10, 2 * 10**10)
    mha = slope(cm, compute_bound(1), 10**10, 2 * 10**10)
    assert absorbed / mha == pytest.approx((2 * 576 + 2 * 512) / (2 * 192 + 2 * 128), rel=1e-9)


def test_mla_kv_read_is_far_below_an_mha_model_of_the_same_heads():
    mla = cost("deepseek-v3", "h200", 8)
    mha = CostModel(replace(get_model("deepseek-v3"), kv_lora_rank=0, num_kv_heads=128), get_gpu("h200"),
                    tp=8, max_tokens=2048)
    ratio = slope(mla, lambda c: decode(64, c), 20_000, 40_000) / slope(mha, lambda c: decode(64, c),
                                                                          20_000, 40_000)
    assert ratio == pytest.approx(576 / (2 * 16 * 192), rel=1e-9)  # 16 KV heads per rank at tp 8


# --- weight formats --------------------------------------------------------------------------------
def _linear(model: str, gpu: str, quantization: str | None, t: int) -> float:
    return float(CostModel(get_model(model), get_gpu(gpu), tp=1, max_tokens=64,
                           quantization=quantization).linear_time_per_layer(t))


def test_fp8_weights_run_at_the_fp8_peak_where_the_gpu_has_one():
    big, small = 8192, 1
    h100 = {q: (_linear("qwen3-8b", "h100-sxm", q, big), _linear("qwen3-8b", "h100-sxm", q, small))
            for q in (None, "fp8")}
    assert 0.4 < h100["fp8"][0] / h100[None][0] < 0.65  # compute-bound: fp8 peak 2x bf16
    assert 0.4 < h100["fp8"][1] / h100[None][1] < 0.75  # decode: half the weight bytes
    a100 = {q: _linear("qwen3-8b", "a100-80gb", q, big) for q in (None, "fp8")}
    assert a100["fp8"] / a100[None] > 0.9  # no fp8 peak: 16-bit tiles, weight-only fp8
    assert cost("qwen3-8b", "a100-80gb", quantization="fp8").compute_dtype == "bf16"


def test_fp4_gemms_at_b200_fp4_peak_and_weight_only_on_hopper():
    b200 = {q: _linear("qwen3-32b", "b200", q, 8192) for q in (None, "fp8", "nvfp4")}
    assert b200["nvfp4"] < b200["fp8"] < b200[None]
    assert get_gpu("b200").peak_flops("fp4") == 2 * get_gpu("b200").peak_flops("fp8")
    assert get_gpu("h100-sxm").compute_dtype("fp4") == "bf16"
    h100 = {q: (_linear("qwen3-32b", "h100-sxm", q, 8192), _linear("qwen3-32b", "h100-sxm", q, 1))
            for q in (None, "w4a16", "nvfp4")}
    for q in ("w4a16", "nvfp4"):  # 16-bit compute with 4-bit weight bytes read
        assert h100[q][0] / h100[None][0] > 0.9
        assert h100[q][1] / h100[None][1] < 0.5


def test_mxfp4_quantizes_only_the_experts():
    m = get_model("gpt-oss-120b")  # checkpoint: mxfp4 experts
    cm = cost("gpt-oss-120b", "h100-sxm", 1)
    bf16 = cost("gpt-oss-120b", "h100-sxm", 1, quantization="bf16")
    assert cm.weight_format.name == "mxfp4" and bf16.weight_format.name == "bf16"
    t = np.array([1.0])
    assert cm._layer_ops(t, True)["attn_pre_proj"] == bf16._layer_ops(t, True)["attn_pre_proj"]
    assert cm._moe_mlp(t)["mlp_down_proj"] < 0.5 * bf16._moe_mlp(t)["mlp_down_proj"]
    assert m.quantization == "mxfp4"


# --- flags, equality, monotonicity ------------------------------------------------------------------
def test_describe_flags_only_models_that_use_the_terms():
    assert "extrapolated (no measured kernels)" not in cost("llama-3.1-8b").describe()
    assert "extrapolated (no measured kernels)" not in cost("qwen3-8b").describe()
    ds = cost("deepseek-v3", "h200", 8).describe()
    assert "MoE/MLA/fp8 weights (fp8 GEMMs) terms: extrapolated (no measured kernels)" in ds
    assert "sliding-window" in cost("gpt-oss-120b").describe()
    assert "chunked-attention" in cost("llama-4-scout").describe()


VARIANTS = [{}, {"kv_cache_dtype": "fp8"}, {"quantization": "fp8"}, {"enable_expert_parallel": True,
                                                                    "data_parallel_size": 2}]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(NEW_MODELS), variant=st.sampled_from(range(len(VARIANTS))),
       gpu=st.sampled_from(["h100-sxm", "b200", "mi300x", "a100-80gb"]), asyn=st.booleans(),
       rows=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 300), st.floats(0, 1e7),
                               st.integers(0, 200000), st.integers(0, 300), st.integers(-1, 3000),
                               st.integers(-1, 200000)), min_size=1, max_size=12))
def test_step_times_equals_step_time_for_the_new_terms(model, variant, gpu, asyn, rows):
    cm = CostModel(get_model(model), get_gpu(gpu), tp=2, max_tokens=1024, async_scheduling=asyn,
                   **VARIANTS[variant])
    cols = [np.array(c) for c in zip(*rows)]
    assert cm.step_times(*cols).tolist() == [cm.step_time(StepShape(*r)) for r in rows]


requests = st.lists(st.tuples(st.integers(1, 600), st.integers(0, 5000), st.booleans()), min_size=1,
                    max_size=10)


def _shape(cm: CostModel, reqs) -> StepShape:
    w = cm.window_tokens
    return StepShape(sum(n for n, _, _ in reqs), sum(1 for _, _, s in reqs if s),
                     float(sum(prefill_pairs(n, c) for n, c, _ in reqs)), sum(c + n for n, c, _ in reqs),
                     len(reqs), sum(n for n, _, _ in reqs),
                     sum(min(c + n, w) for n, c, _ in reqs) if w else -1)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(model=st.sampled_from(NEW_MODELS), reqs=requests, extra=st.integers(1, 700), which=st.integers(0, 9))
def test_more_tokens_never_makes_a_step_faster_new_models(model, reqs, extra, which):
    cm = cost(model, "h200", 4)
    i = which % len(reqs)
    n, c, s = reqs[i]
    grown = [*reqs[:i], (n + extra, c, s), *reqs[i + 1:]]
    assert cm.step_time(_shape(cm, grown)) >= cm.step_time(_shape(cm, reqs)) > 0


@pytest.mark.parametrize("async_scheduling", ["true", "false"])
def test_window_reads_in_decode_runs_equal_stepping_on_the_paged_allocator(async_scheduling):
    """gpt-oss-20b on the paged allocator (hybrid manager off, prefix caching off) takes decode
    runs in both scheduling modes; their durations must carry the sliding layers' capped reads
    as the step loop's do (a run under async once priced them as full attention)."""
    overrides = ["model=gpt-oss-20b", "engine.max_model_len=4096",
                 "engine.disable_hybrid_kv_cache_manager=true", "engine.enable_prefix_caching=false",
                 "workload.num_requests=60",
                 f"engine.async_scheduling={async_scheduling}"]
    assert_event_equals_step(overrides)
