"""engine.kv_cache_dtype, quantization, enable_expert_parallel and disable_hybrid_kv_cache_manager
(vLLM's flags of the same names): validated once, passed to the memory plan, shown only when set,
and bad values refused in one line before any work (issue 15, item 5)."""

from __future__ import annotations

import pytest

from simulator.cli.main import main
from simulator.config.schema import KV_CACHE_DTYPES, QUANTIZATIONS, from_dict
from simulator.engine.build import setup
from simulator.hardware.dtypes import KV_CACHE_DTYPE_BYTES, QUANTIZATION_ALIASES, WEIGHT_FORMATS


def test_config_names_are_the_memory_math_names():
    assert list(KV_CACHE_DTYPES) == list(KV_CACHE_DTYPE_BYTES)
    assert list(QUANTIZATIONS) == [*WEIGHT_FORMATS, *QUANTIZATION_ALIASES]


@pytest.fixture
def no_work(monkeypatch):
    """Generating the workload (the first work after setup) fails the test."""
    import simulator.engine.run as engine_run

    def refuse(*args, **kwargs):
        raise AssertionError("work started before the bad input was refused")
    monkeypatch.setattr(engine_run, "generate", refuse)


@pytest.mark.parametrize("args,expected", [
    (["--kv-cache-dtype", "fp9"], "engine.kv_cache_dtype must be one of auto, bfloat16, float16, fp8, "
                                  "fp8_e4m3, fp8_e5m2 (did you mean 'fp8'?), got 'fp9'"),
    (["--set", "engine.kv_cache_dtype=int8"], "engine.kv_cache_dtype must be one of auto,"),
    (["--quantization", "fp4"], "engine.quantization must be one of bf16, fp8, w4a16, mxfp4, nvfp4, "
                                "none, fp16, bfloat16, float16, int4, gptq, awq, gptq_marlin, awq_marlin, "
                                "gpt_oss_mxfp4, modelopt_fp4 (did you mean 'nvfp4'?), got 'fp4'"),
    (["--set", "engine.enable_expert_parallel=2"],
     "engine.enable_expert_parallel must be true or false, got 2"),
    (["--model", "deepseek-v3", "--tensor-parallel-size", "8", "--enable-expert-parallel"],
     "model deepseek-ai/DeepSeek-V3 does not fit even with expert parallelism: h100-sxm x tp=8 (experts "
     "over 8 GPUs) gives 71.7 GiB at gpu_memory_utilization=0.9, but weights need 78.3 GiB/GPU"),
    (["--model", "qwen3-235b-a22b", "--tensor-parallel-size", "4", "--enable-expert-parallel"],
     "does not fit even with expert parallelism: h100-sxm x tp=4 (experts over 4 GPUs)"),
])
def test_bad_model_flag_is_one_line_exit_2_before_any_work(capsys, no_work, args, expected):
    code = main(["run", "--quiet", "--out", "/tmp/kvsim-test-models2", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("kvsim: error: ") and expected in err


def test_flags_reach_the_memory_plan():
    """fp8 KV halves the page: the same budget holds exactly twice the blocks; EP over 3 replicas
    shrinks DeepSeek-V3's weights per GPU from 78.3 to 28.4 GiB (docs/models.md)."""
    base = {"model": "qwen3-8b", "gpu": "h100-sxm", "engine": {"num_gpu_blocks_override": None}}
    auto = setup(from_dict(base))
    fp8 = setup(from_dict({**base, "engine": {"kv_cache_dtype": "fp8"}}))
    assert fp8.memory.kv_budget_bytes == auto.memory.kv_budget_bytes
    assert fp8.memory.block_bytes * 2 == auto.memory.block_bytes
    assert fp8.memory.num_gpu_blocks in (2 * auto.memory.num_gpu_blocks, 2 * auto.memory.num_gpu_blocks + 1)
    ep = {"model": "deepseek-v3", "gpu": "h200", "engine": {"tensor_parallel_size": 8}}
    tp_only = setup(from_dict(ep))
    dp3 = setup(from_dict({**ep, "engine": {"tensor_parallel_size": 8, "enable_expert_parallel": True},
                           "cluster": {"replicas": 3}}))
    assert tp_only.memory.weights_bytes / 2**30 == pytest.approx(78.3, abs=0.05)
    assert dp3.memory.weights_bytes / 2**30 == pytest.approx(28.4, abs=0.05)
    w4 = setup(from_dict({**base, "engine": {"quantization": "w4a16"}}))
    assert w4.memory.weights_bytes < auto.memory.weights_bytes / 2  # embeddings stay 16-bit


def test_setup_lines_show_the_flags_only_when_set():
    base = {"model": "deepseek-v3", "gpu": "h200", "engine": {"tensor_parallel_size": 8}}
    plain = setup(from_dict(base))
    assert plain.format_info() == {} and plain.lines()[1].startswith("memory:")
    s = setup(from_dict({**base, "engine": {"tensor_parallel_size": 8, "kv_cache_dtype": "fp8",
                                            "quantization": "fp8", "enable_expert_parallel": True}}))
    assert s.lines()[1] == "kv_cache_dtype fp8, quantization fp8, expert_parallel_size 8"
    assert s.format_info() == {"kv_cache_dtype": "fp8", "quantization": "fp8", "expert_parallel_size": 8}
