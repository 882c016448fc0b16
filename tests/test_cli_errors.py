"""Bad input gives one clear line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import pytest

from simulator.cli.main import main


def run_cli(capsys, *args):
    code = main(["run", "--quiet", "--out", "/tmp/kvsim-test-cli", *args])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.mark.parametrize("args,expected", [
    (["--model", "llama-9"], "unknown model 'llama-9'"),
    (["--gpu", "h1000"], "unknown GPU 'h1000' (did you mean 'h100'?); valid:"),
    (["--set", "engine.scheduler=contiuous"],
     "unknown scheduler 'contiuous' (did you mean 'continuous'?); valid: continuous"),
    (["--set", "engine.kv_allocator=pagd"], "unknown kv_allocator 'pagd' (did you mean 'paged'?)"),
    (["--set", "engine.queue_policy=lifo"], "unknown queue_policy 'lifo'"),
    (["--block-size", "0"], "engine.block_size must be a positive integer, got 0"),
    (["--max-num-seqs", "-3"], "engine.max_num_seqs must be a positive integer, got -3"),
    (["--gpu-memory-utilization", "1.2"], "engine.gpu_memory_utilization must be in (0, 1], got 1.2"),
    (["--gpu-memory-utilization", "0"], "engine.gpu_memory_utilization must be in (0, 1], got 0"),
    (["--model", "llama-3.1-70b", "--gpu", "l4"], "does not fit"),
    (["--set", "engine.blok_size=8"], "unknown key 'blok_size' (did you mean 'block_size'?)"),
    (["--set", "blok_size=8"], "unknown key 'blok_size'"),
    (["--set", "workload.num_requests=0"], "workload.num_requests must be a positive integer, got 0"),
    (["--set", "workload.arrival.rate=-1"], "workload.arrival.rate must be > 0, got -1"),
    (["--set", "workload.prompt_tokens.dist=zipff"], "unknown length distribution 'zipff'"),
    (["no-such.yaml"], "config file no-such.yaml: not found"),
    (["--set", "seed=-1"], "seed must be a non-negative integer, got -1"),
    (["--set", "engine.eviction_params=60"], "engine.eviction_params must be a mapping, got 60"),
    (["--set", "workload.tenants=[{name: a, priorty: 1}]"],
     "workload.tenants[0]: unknown key 'priorty' (did you mean 'priority'?)"),
    (["--set", "slo.ttft_s=0"], "slo.ttft_s must be a number of seconds > 0"),
    (["--set", "cluster.router=round_robbin"], "unknown router 'round_robbin' (did you mean 'round_robin'?)"),
    (["--set", "cluster.replicas=0"], "cluster.replicas must be an integer >= 1, got 0"),
])
def test_bad_input_is_one_clear_line(capsys, args, expected):
    code, err = run_cli(capsys, *args)
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("kvsim: error: ")
    assert expected in err


def test_bad_yaml_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("engine:\n  block_size: [1,\n")
    code, err = run_cli(capsys, str(bad))
    assert code == 2 and f"config file {bad}: invalid YAML" in err.splitlines()[0]


@pytest.mark.parametrize("text", ["", "# a comment, no settings\n"])
def test_empty_yaml_file_is_refused(tmp_path, capsys, text):
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    code, err = run_cli(capsys, str(empty))
    assert code == 2 and len(err.splitlines()) == 1
    assert f"config file {empty}: no settings (the file is empty or holds only comments)" in err


def test_vllm_flags_reach_the_engine(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--quiet", "--out", str(out), "--block-size", "32", "--max-num-seqs", "8",
                 "--max-model-len", "4096", "--set", "workload.num_requests=20"])
    assert code == 0
    import yaml
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["resolved_engine"]["block_size"] == 32
    assert cfg["resolved_engine"]["max_num_seqs"] == 8
    assert cfg["resolved_engine"]["max_model_len"] == 4096
