"""What vLLM 0.33 refuses, kvsim refuses: one line, exit 2, before any simulation work.

Each rule of simulator/hardware/vllm_limits.py is checked on both sides of its boundary in
kvsim (plan_memory and the CLI) and, where vLLM is importable (docs/parity.md; CPU only),
against vLLM's own validator making the same decision.
"""

from __future__ import annotations

import json
import types

import pytest

from simulator.cli.main import main
from simulator.config.schema import build_config
from simulator.engine.run import setup
from simulator.errors import ConfigError
from simulator.hardware.gpus import get_gpu
from simulator.hardware.memory import plan_memory
from simulator.hardware.models import CATALOGUE, get_model
from simulator.hardware.vllm_limits import allowed_tp_sizes, tp_refusal

LLAMA8 = get_model("llama-3.1-8b")


def _plan(model=LLAMA8, gpu="h100-sxm", **kw):
    args = dict(tp=1, block_size=16, gpu_memory_utilization=0.9, max_num_batched_tokens=8192,
                max_num_seqs=1024, max_model_len=4096)
    return plan_memory(model, get_gpu(gpu), **{**args, **kw})


@pytest.fixture
def refused(capsys, monkeypatch, tmp_path):
    """Run `kvsim run ARGS`; the simulation must not start. Returns (exit code, stderr lines)."""
    import simpy

    def no_simulation(*a, **k):
        raise AssertionError("the simulation started before the input was refused")
    monkeypatch.setattr(simpy.Environment, "__init__", no_simulation)

    def run(*args):
        code = main(["run", "--quiet", "--out", str(tmp_path / "run"), *args])
        return code, capsys.readouterr().err.strip().splitlines()
    return run


def _one_line(code, lines, *expected):
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("kvsim: error: ")
    for text in expected:
        assert text in lines[0], lines[0]


# --- 1. the null block: one max_model_len request must fit in num_gpu_blocks - 1 blocks --------

def test_null_block_boundary_300_blocks_of_16():
    """300 blocks of 16: 299 usable, so 4,784 tokens (299 x 16) start and 4,785 do not."""
    plan = _plan(max_model_len=4784, num_gpu_blocks_override=300)
    assert plan.num_gpu_blocks == 300
    with pytest.raises(ConfigError, match=r"^engine.max_model_len \(4785\) is larger than the 4784 tokens"
                                          r" the KV cache can hold \(300 blocks of 16 on h100-sxm x tp=1, "
                                          r"less vLLM's null block\)"):
        _plan(max_model_len=4785, num_gpu_blocks_override=300)


def test_null_block_boundary_through_setup_and_cli(refused):
    s = setup(build_config(overrides=["engine.num_gpu_blocks_override=300", "engine.max_model_len=4784"]))
    assert s.memory.num_gpu_blocks == 300 and s.engine.max_model_len == 4784
    _one_line(*refused("--set", "engine.num_gpu_blocks_override=300", "--max-model-len", "4785"),
              "engine.max_model_len (4785) is larger than the 4784 tokens", "null block")


def test_pool_of_one_block_is_refused(refused):
    with pytest.raises(ConfigError, match=r"has 1 block\(s\) of 16 .* vLLM needs at least 2"):
        _plan(max_model_len=16, num_gpu_blocks_override=1)
    _one_line(*refused("--set", "engine.num_gpu_blocks_override=1", "--max-model-len", "16"),
              "vLLM needs at least 2 (one is its null block)")


def test_profiled_pool_also_keeps_the_null_block():
    """Without an override the same rule applies to the profiled block count."""
    plan = _plan(gpu="l4", max_model_len=2048)
    fits = (plan.num_gpu_blocks - 1) * 16
    assert _plan(gpu="l4", max_model_len=fits).num_gpu_blocks == plan.num_gpu_blocks
    with pytest.raises(ConfigError, match=rf"max_model_len \({fits + 1}\) is larger than the {fits} tokens"):
        _plan(gpu="l4", max_model_len=fits + 1)


# --- 2. tensor parallelism: heads, KV heads (or replication), dense MLP ------------------------

@pytest.mark.parametrize("tp", [3, 64])
def test_tp_that_does_not_divide_the_heads_is_refused(refused, tp):
    _one_line(*refused("--set", f"engine.tensor_parallel_size={tp}"),
              "engine.tensor_parallel_size must divide the 32 attention heads of meta-llama/Llama-3.1-8B",
              f"got {tp}; allowed: 1, 2, 4, 8, 16, 32")


def test_every_allowed_tp_starts_and_no_other():
    assert allowed_tp_sizes(LLAMA8) == [1, 2, 4, 8, 16, 32]
    for tp in range(1, 65):
        if tp in allowed_tp_sizes(LLAMA8):
            assert _plan(tp=tp).num_gpu_blocks > 0
        else:
            with pytest.raises(ConfigError, match=rf"^engine.tensor_parallel_size must .* got {tp};"):
                _plan(tp=tp)


@pytest.mark.parametrize("model,tp,why", [
    ("qwen2.5-7b", 7, "must divide the 4 KV heads of Qwen/Qwen2.5-7B or be a multiple of them"),
    ("llama-2-13b", 5, "must divide the MLP intermediate size 13824 of meta-llama/Llama-2-13b-hf"),
    ("opt-13b", 3, "must divide the 40 attention heads of facebook/opt-13b"),
])
def test_kv_head_and_mlp_rules(refused, model, tp, why):
    _one_line(*refused("--model", model, "--set", f"engine.tensor_parallel_size={tp}",
                       "--max-model-len", "2048"), why)


def test_kv_heads_replicate_when_tp_exceeds_them():
    """Llama-3.1-8B has 8 KV heads: TP 16 and 32 keep one per GPU (vLLM replicates them)."""
    for tp in (16, 32):
        assert tp_refusal(LLAMA8, tp) is None
        assert _plan(tp=tp).kv_bytes_per_token == 2 * 32 * 1 * 128 * 2


# --- 3. block sizes the attention backends take -------------------------------------------------

@pytest.mark.parametrize("bs", [1, 4, 8, 24, 33])
def test_block_size_not_a_multiple_of_16_is_refused(refused, bs):
    with pytest.raises(ConfigError, match=rf"^engine.block_size must be a multiple of 16 .* got {bs};"):
        _plan(block_size=bs)
    _one_line(*refused("--block-size", str(bs)), "engine.block_size must be a multiple of 16",
              f"got {bs}")


@pytest.mark.parametrize("bs", [16, 32, 48, 64, 128, 256])
def test_multiples_of_16_start(bs):
    assert _plan(block_size=bs).block_size == bs


# --- 4. fields the config already refuses as vLLM does (checked here through the CLI) ----------

@pytest.mark.parametrize("args,field", [
    (["--gpu-memory-utilization", "0"], "gpu_memory_utilization"),
    (["--gpu-memory-utilization", "1.01"], "gpu_memory_utilization"),
    (["--block-size", "0"], "block_size"),
    (["--max-model-len", "131073"], "max_model_len"),
    (["--set", "engine.enable_chunked_prefill=false", "--set", "engine.max_num_batched_tokens=2048",
      "--max-model-len", "4096"], "max_num_batched_tokens"),
])
def test_already_refused(refused, args, field):
    _one_line(*refused(*args), field)


@pytest.mark.xfail(strict=True, reason="needs max_num_seqs defaulted as vLLM does (min(default, "
                   "max_num_batched_tokens)) before plan_memory can refuse a user's max_num_seqs "
                   "above max_num_batched_tokens (vllm/config/scheduler.py verify_max_model_len)")
def test_max_num_seqs_above_max_num_batched_tokens_is_refused():
    with pytest.raises(ConfigError):
        setup(build_config(overrides=["engine.max_num_seqs=512", "engine.max_num_batched_tokens=256"]))


# --- 5. vLLM's own validators make the same decisions (CPU-only vLLM, docs/parity.md) ----------

@pytest.fixture(scope="module")
def vllm_config_dir(tmp_path_factory):
    pytest.importorskip("vllm", reason="vLLM is not installed (the `vllm` extra, docs/parity.md)")
    path = tmp_path_factory.mktemp("llama8b-shape")
    (path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
        "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 131072,
        "torch_dtype": "float16", "rms_norm_eps": 1e-5}))
    return str(path)


def _vllm_starts_kv_cache(model_dir, num_blocks, block_size, max_model_len) -> bool:
    """vLLM's get_kv_cache_configs (null-block reserve + _check_enough_kv_cache_memory)."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig
    from vllm.v1.core import kv_cache_planning
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    cache = CacheConfig(block_size=block_size, num_gpu_blocks_override=num_blocks)
    cache.kv_cache_layout = "LBHNC"  # normally resolved by the engine core
    config = VllmConfig(model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                                 dtype="float16", max_model_len=max_model_len),
                        cache_config=cache, device_config=DeviceConfig(device="cpu"))
    specs = [{f"layer.{i}": FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128,
                                              dtype=torch.float16) for i in range(2)}]
    groups = kv_cache_planning.get_global_kv_cache_groups(config, specs)
    try:
        kv_cache_planning.get_kv_cache_configs(config, specs, [1 << 40], groups)
    except ValueError:
        return False
    return True


def _kvsim_starts(**kw) -> bool:
    try:
        _plan(**kw)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("num_blocks,bs,max_model_len", [
    (300, 16, 4784), (300, 16, 4785), (300, 16, 4800), (2, 16, 16), (2, 16, 17), (1, 16, 1),
    (64, 32, 2016), (64, 32, 2017),
])
def test_vllm_null_block_rule_agrees(vllm_config_dir, num_blocks, bs, max_model_len):
    theirs = _vllm_starts_kv_cache(vllm_config_dir, num_blocks, bs, max_model_len)
    ours = _kvsim_starts(block_size=bs, max_model_len=max_model_len, num_gpu_blocks_override=num_blocks)
    assert ours == theirs
    if (num_blocks, bs) == (300, 16):
        assert theirs == (max_model_len <= 4784)


def test_vllm_model_config_refuses_tp_3_and_64(vllm_config_dir):
    from vllm.config import ModelConfig, ParallelConfig
    model = ModelConfig(model=vllm_config_dir, skip_tokenizer_init=True, dtype="float16",
                        max_model_len=4096)
    for tp in range(1, 65):
        try:
            model.verify_with_parallel_config(ParallelConfig(tensor_parallel_size=tp))
            theirs = True
        except ValueError as e:
            assert "must be divisible by tensor parallel size" in str(e)
            theirs = False
        assert theirs == (32 % tp == 0), tp
        assert (tp_refusal(LLAMA8, tp) is None) == theirs, tp  # Llama-3.1-8B: only the heads bind


def test_vllm_layers_refuse_what_kvsim_refuses(vllm_config_dir, monkeypatch):
    """vLLM's QKVParallelLinear (heads, KV heads or replication) and MergedColumnParallelLinear
    (dense MLP), built tiny under a stand-in TP group, accept exactly kvsim's allowed TP sizes."""
    import vllm.distributed.parallel_state as parallel_state
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    def vllm_builds(m, tp) -> bool:
        monkeypatch.setattr(parallel_state, "_TP", types.SimpleNamespace(world_size=tp, rank_in_group=0))
        try:
            QKVParallelLinear(64, 8, m.num_heads, m.num_kv_heads, bias=False)
            if not m.is_moe:
                MergedColumnParallelLinear(8, [m.intermediate_size] * 2, bias=False)
        except AssertionError:
            return False
        return True
    for m in CATALOGUE.values():
        for tp in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 28, 32, 40, 48, 64, 80, 128):
            assert vllm_builds(m, tp) == (tp_refusal(m, tp) is None), (m.name, tp)


def test_vllm_attention_backends_take_multiples_of_16(vllm_config_dir):
    """FlashAttention and Triton (vLLM's CUDA choices that import on CPU; FlashInfer needs its
    own package) take a user block size exactly when kvsim does."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend
    for bs in range(1, 273):
        theirs = [b.supports_block_size(bs) for b in (FlashAttentionBackend, TritonAttentionBackend)]
        assert theirs == [bs % 16 == 0] * 2, bs
        assert _kvsim_starts(block_size=bs) == (bs % 16 == 0), bs


def test_vllm_cache_config_gpu_memory_utilization_range(vllm_config_dir):
    from pydantic import ValidationError
    from vllm.config import CacheConfig
    for util, ok in ((0.0, False), (1e-3, True), (0.9, True), (1.0, True), (1.01, False)):
        try:
            CacheConfig(gpu_memory_utilization=util)
            theirs = True
        except ValidationError:
            theirs = False
        assert theirs == ok, util
        try:
            build_config(overrides=[f"engine.gpu_memory_utilization={util}"])
            ours = True
        except ConfigError:
            ours = False
        assert ours == ok, util


def test_vllm_scheduler_config_max_num_seqs_rule(vllm_config_dir):
    """The rule kvsim cannot check yet (see the xfail above): vLLM refuses a max_num_seqs above
    max_num_batched_tokens."""
    from pydantic import ValidationError
    from vllm.config import SchedulerConfig
    with pytest.raises(ValidationError, match=r"max_num_batched_tokens \(256\) must be greater than or "
                                              r"equal to max_num_seqs \(512\)"):
        SchedulerConfig(max_model_len=4096, is_encoder_decoder=False, max_num_batched_tokens=256,
                        max_num_seqs=512)
