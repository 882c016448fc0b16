"""Bad input gives one clear line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

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
    assert len(err.splitlines()) == 1 and "(line 3, column 1: " in err, err  # where, on one line


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


# -- output paths: refused in one line, exit 2, before any simulation work --------------------------

REPO = Path(__file__).resolve().parent.parent


def cli(capsys, *args) -> tuple[int, str]:
    """Exit code and stderr of `kvsim ARGS` (argparse's usage errors included)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err.strip()


@pytest.fixture
def paths(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"FILE": afile, "UNDER_FILE": afile / "sub", "DIR": folder, "TMP": tmp_path}


@pytest.fixture
def no_simulation(monkeypatch):
    """Any simulation, sweep or plan search fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("simulation work started before the output path was checked")
    import simulator.analysis.plan as plan
    import simulator.analysis.sweep as sweep
    import simulator.engine.run as engine_run
    monkeypatch.setattr(engine_run, "run", refuse)
    monkeypatch.setattr(sweep, "execute", refuse)
    monkeypatch.setattr(plan.Planner, "search", refuse)


OUT_PATH_CASES = [
    (["run", "--out", "FILE"], "--out FILE: is an existing file"),
    (["run", "--out", "UNDER_FILE"], "--out UNDER_FILE: cannot be created, FILE is a file"),
    (["run", "--seeds", "2", "--out", "FILE"], "--out FILE: is an existing file"),
    (["run", "--trace-steps", "DIR"], "--trace-steps DIR: is a folder"),
    (["plot", "DIR", "--out", "FILE"], "--out FILE: is an existing file"),
    (["report", "DIR", "--out", "DIR"], "--out DIR: is a folder"),
    (["sweep", "--grid", "engine.block_size=8,16", "--out", "FILE"], "--out FILE: is an existing file"),
    (["plan", "--rate", "5", "--out", "UNDER_FILE"], "--out UNDER_FILE: cannot be created"),
    (["calibrate", "--profiles", "DIR", "--report-dir", "FILE"], "--report-dir FILE: is an existing file"),
    (["parity", "--case", "fcfs-cache", "--json", "DIR"], "--json DIR: is a folder"),
    (["regress", "--suite", REPO / "regress", "--junit", "DIR"], "--junit DIR: is a folder"),
    (["workload", "inspect", REPO / "workloads" / "chat.yaml", "--png", "UNDER_FILE"],
     "--png UNDER_FILE: cannot be created"),
    (["profile", "--model", "llama-3.1-8b", "--gpu", "h100", "--out", "FILE"],
     "--out FILE: is an existing file"),
]


@pytest.mark.parametrize("args,expected", OUT_PATH_CASES, ids=[" ".join(map(str, a[:2])) + " " + a[-2]
                                                              for a, _ in OUT_PATH_CASES])
def test_bad_output_path_is_refused_before_any_work(capsys, paths, no_simulation, args, expected):
    def fill(text):
        for key in sorted(paths, key=len, reverse=True):
            text = str(text).replace(key, str(paths[key])) if isinstance(text, str) else text
        return text
    before = sorted(paths["TMP"].rglob("*"))
    code, err = cli(capsys, *(fill(a) if isinstance(a, str) else a for a in args))
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("kvsim: error: "), err
    assert fill(expected) in err
    assert sorted(paths["TMP"].rglob("*")) == before  # nothing written


def test_output_folder_that_cannot_be_written(capsys, paths, monkeypatch, no_simulation):
    from simulator.cli import common
    ro = paths["DIR"]
    monkeypatch.setattr(common, "_writable", lambda folder: folder.absolute() != ro.absolute())
    code, err = cli(capsys, "run", "--out", ro)
    assert code == 2 and err == f"kvsim: error: --out {ro}: folder is not writable"
    code, err = cli(capsys, "run", "--out", ro / "new" / "run")
    assert code == 2 and err == (f"kvsim: error: --out {ro / 'new' / 'run'}: cannot be created, "
                                 f"folder {ro} is not writable")


def test_a_good_new_output_folder_is_created(tmp_path, capsys):
    out = tmp_path / "a" / "b" / "run"
    assert main(["run", "--quiet", "--set", "workload.num_requests=5", "--out", str(out)]) == 0
    assert (out / "summary.json").is_file()


# -- every command: a few bad inputs, each one line and exit 2 ---------------------------------------

BAD_INPUTS = [
    (["run", "--set", "foo"], "--set expects key=value, got 'foo'"),
    (["run", "--seeds", "0"], "--seeds must be an integer >= 1, got 0"),
    (["run", "--seed", "abc"], "kvsim run: error: argument --seed: invalid int value: 'abc'"),
    (["run", "--metrics-interval-s", "-1"], "--metrics-interval-s must be a finite number of seconds "
                                            ">= 0.001 (Prometheus stores milliseconds), got -1.0"),
    (["run", "--metrics-interval-s", "0"], "--metrics-interval-s must be a finite number of seconds "
                                           ">= 0.001"),
    (["run", "--metrics-interval-s", "nan"], "--metrics-interval-s must be a finite number of seconds "
                                             ">= 0.001 (Prometheus stores milliseconds), got nan"),
    (["run", "--metrics-interval-s", "0.0009999999"], "got 0.0009999999"),
    (["run", "--metrics-interval-s", "inf"], "must be a finite number of seconds >= 0.001 "
                                             "(Prometheus stores milliseconds), got inf"),
    (["run", "--bogus"], "kvsim run: error: unrecognized arguments: --bogus"),
    (["workload", "inspect", "nosuch.csv", "--no-png"], "trace nosuch.csv: not found"),
    (["workload", "inspect", "nosuch.yaml", "--no-png"], "config file nosuch.yaml: not found"),
    (["workload", "inspect", REPO / "workloads" / "chat.yaml", "--set", "nosuch=3", "--no-png"],
     "unknown key 'nosuch'"),
    (["workload", "inspect", REPO / "workloads" / "chat.yaml", "--format", "azure", "--no-png"],
     "--format azure: "),
    (["workload", "inspect", REPO / "workloads" / "sample_trace.csv", "--format", "nosuch", "--no-png"],
     "unknown trace format 'nosuch'"),
    (["plot", "nosuch"], "nosuch is not a run directory"),
    (["report", "nosuch"], "run directory nosuch not found"),
    (["calibrate", "--profiles", "nosuch"], "--profiles nosuch: not found"),
    (["calibrate", "--profiles", REPO, "--fit-date", "2024-13-45", "--dry-run"],
     "--fit-date 2024-13-45: not a calendar date"),
    (["profile", "--model", "nosuch", "--gpu", "h100"], "unknown model 'nosuch'"),
    (["profile", "--model", "llama-3.1-8b", "--gpu", "a b"], "--gpu must be a plain folder name"),
    (["profile", "--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "0"], "argument --tp"),
    (["profile", "--model", "llama-3.1-8b", "--gpu", "h100", "--repeats", "0"], "--repeats must be >= 1"),
    (["parity", "--case", "nosuch"], "--case 'nosuch': unknown; valid: fcfs-nocache"),
    (["parity", "--case", "all", "--num-requests", "0"], "--num-requests must be an integer >= 1"),
    (["parity", "nosuch.yaml"], "config file nosuch.yaml: not found"),
    (["sweep", "--grid", "foo"], "--grid expects key=v1,v2,..., got 'foo'"),
    (["sweep", "--grid", "engine.block_size=8", "--workers", "0"], "--workers must be an integer >= 1"),
    (["sweep", "--grid", "engine.block_size=8", "--backend", "rya"], "argument --backend: invalid choice"),
    (["sweep", "--grid", "engine.block_size=8", "--x", "nosuch"], "plot axis 'nosuch' is not a grid key"),
    (["plan", "--rate", "0"], "--rate must be > 0 req/s, got 0"),
    (["plan", "--rate", "5", "--gpus", "nosuch"], "unknown GPU 'nosuch'"),
    (["plan", "--rate", "5", "--tp", "x"], "--tp expects comma-separated integers >= 1"),
    (["plan", "--rate", "5", "--slo", "ttft_p9=1"], "--slo: unknown key 'ttft_p9'"),
    (["plan"], "the following arguments are required: --rate"),
    (["regress", "--suite", "nosuch"], "regress suite nosuch: no such folder or file"),
    (["regress", "--suite", REPO / "regress", "--only", "nosuch"], "--only nosuch: no such scenario"),
    (["experiment", "nosuch"], "unknown experiment 'nosuch'"),
    (["nosuch"], "unknown command 'nosuch'"),
]


@pytest.mark.parametrize("args,expected", BAD_INPUTS,
                         ids=[" ".join(map(str, a[:3]))[-60:] for a, _ in BAD_INPUTS])
def test_every_command_bad_input_is_one_line(capsys, tmp_path, monkeypatch, no_simulation, args, expected):
    monkeypatch.chdir(tmp_path)
    code, err = cli(capsys, *args)
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and expected in err


def _one_line(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("kvsim: error: "), err
    return err


def test_unreadable_and_unwritable_paths_are_one_line(tmp_path, capsys):
    """Probed as a new user would: an output under /proc, a .gz that is not gzip, a config
    or GPU profile that is not UTF-8 text or not a mapping, a profile's negative price."""
    assert "/proc/kvsim-x: No such file or directory" in _one_line(
        capsys, ["run", "--quiet", "--out", "/proc/kvsim-x", "--set", "workload.num_requests=2"])
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(b"not gzip")
    assert f"trace {gz}: cannot read (Not a gzipped file" in _one_line(
        capsys, ["run", "--quiet", "--out", str(tmp_path / "o"), "--set", f"workload.trace={gz}"])
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    assert f"config file {binary}: not UTF-8 text" in _one_line(capsys, ["run", str(binary)])
    for text, expected in (("- a\n- b\n", "expected a mapping of fields, got list"),
                           ("name: x\nmemory_gib: 80\nhbm_bandwidth_gbps: 2000\npeak_tflops: {fp16: 1}\n"
                            "calibration: abc\n", "calibration must be a mapping, got 'abc'"),
                           ("name: x\nmemory_gib: 80\nhbm_bandwidth_gbps: 2000\npeak_tflops: {fp16: 1}\n"
                            "price_per_hour: -3\n", "price_per_hour must be a number of $ per GPU-hour")):
        gpu = tmp_path / "g.yaml"
        gpu.write_text(text)
        assert expected in _one_line(capsys, ["run", "--quiet", "--gpu", str(gpu)])


@pytest.mark.parametrize("args,expected", [
    (["--set", "workload.prompt_tokens.cv=1000000000000000000"],
     "workload.prompt_tokens.cv must be a coefficient of variation in (0, 100]"),
    (["--set", "workload.arrival={process: gamma, rate: 5, cv: 1.0e+300}"],
     "workload.arrival.cv must be a coefficient of variation in (0, 100]"),
    (["--set", "workload.trace=t.csv", "--set", "workload.tenants=[{name: a, priority: 3}]"],
     "workload.tenants shapes generated traffic, not a trace (workload.trace is set)"),
    (["--set", "workload.trace=t.csv",
      "--set", "workload.system_prompts={count: 2, tokens: {dist: constant, value: 100}}"],
     "workload.system_prompts shapes generated traffic"),
])
def test_out_of_range_spreads_are_named(capsys, args, expected):
    """(and generated-traffic settings beside a trace, which would do nothing)"""
    code, err = run_cli(capsys, *args)
    assert code == 2 and len(err.splitlines()) == 1 and expected in err, err


def test_exponent_without_a_dot_is_a_number(tmp_path):
    """PyYAML reads `1e3` as text (YAML 1.1); `--set` reads it as the number JSON and Python do."""
    from simulator.config.schema import build_config, parse_value

    assert parse_value("1e3") == 1000.0 and parse_value("-5E-1") == -0.5 and parse_value("1e") == "1e"
    assert build_config(None, ["workload.arrival.rate=1e3"]).workload.arrival["rate"] == 1000.0


def test_model_config_with_zero_heads_is_refused(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, '
                   '"num_attention_heads": 0, "num_hidden_layers": 32, "intermediate_size": 14336, '
                   '"vocab_size": 128256, "max_position_embeddings": 8192}')
    assert "num_attention_heads must be an integer >= 1, got 0" in _one_line(
        capsys, ["run", "--quiet", "--model", str(cfg)])


def test_plan_rate_must_be_finite_and_a_baseline_numbers(tmp_path, capsys):
    assert "--rate must be a finite number of req/s > 0, got inf" in _one_line(
        capsys, ["plan", "--rate", "inf", "--gpus", "h100", "--out", str(tmp_path / "p")])
    import json

    from simulator.analysis.regress import load_baseline
    from simulator.errors import ConfigError

    good = json.loads((Path(__file__).resolve().parent.parent / "regress/baseline.json").read_text())
    name = next(iter(good["scenarios"]))
    metric = next(iter(good["scenarios"][name]["metrics"]))
    for bad in ("abc", float("nan")):
        good["scenarios"][name]["metrics"][metric] = bad
        (tmp_path / "b.json").write_text(json.dumps(good))
        with pytest.raises(ConfigError, match=f"{name} {metric} must be a finite number or null"):
            load_baseline(tmp_path / "b.json")


def test_an_empty_out_is_refused(capsys):
    """`--out ''` named the current folder: a run's seven files landed beside the user's."""
    assert "--out: empty; give a folder for the outputs" in _one_line(capsys, ["run", "--quiet", "--out", ""])


def test_a_damaged_run_directory_is_named_not_a_traceback(tmp_path, capsys):
    """report / plot on a run directory whose files are not what kvsim wrote: one line naming
    the file (a JSONDecodeError, AttributeError or ArrowInvalid before)."""
    import shutil

    good = tmp_path / "good"
    assert main(["run", "--quiet", "--out", str(good), "--set", "workload.num_requests=5"]) == 0
    capsys.readouterr()
    for name, content, expected in (("summary.json", "{bad", "summary.json: not a kvsim output (invalid"),
                                    ("summary.json", "[1, 2]", "(a JSON list, expected an object)"),
                                    ("config.yaml", "- a\n", "config.yaml: not a kvsim output"),
                                    ("requests.parquet", "garbage", "requests.parquet: not a parquet table"),
                                    ("iterations.parquet", None, "has no iterations.parquet (a `kvsim run "
                                                                 "--no-iterations` run?)")):
        d = tmp_path / "bad"
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        if content is None:
            (d / name).unlink()
        else:
            (d / name).write_text(content)
        assert expected in _one_line(capsys, ["report", str(d), "--out", str(tmp_path / "r.html")])


def test_a_folder_given_as_a_file_and_warnings_on_one_line(tmp_path, capsys):
    """A folder as the config or the trace says so (it said 'not found'); a warning is one
    `kvsim: warning:` line (Python's format added the source file and line)."""
    assert f"config file {tmp_path}: is a folder; give the YAML file" in _one_line(
        capsys, ["run", str(tmp_path)])
    assert f"trace {tmp_path}: is a folder; give the file" in _one_line(
        capsys, ["run", "--quiet", "--set", f"workload.trace={tmp_path}"])
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n5,10,5\n1,20,5\n")
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "simulator", "run", "--quiet", "--out", str(tmp_path / "o"),
                           "--set", f"workload.trace={trace}"], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)  # (pytest keeps warnings to itself)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.strip()
    assert err.startswith("kvsim: warning: ") and len(err.splitlines()) == 1, err
    assert "timestamps are not sorted (this row is 0.000000 s after the earliest timestamp, line 2 " \
           "4.000000 s; 1 backward step(s))" in err


def test_a_setting_past_the_machine_is_out_of_memory_in_one_line(capsys):
    """A system-prompt count of 1e12 asks numpy for 7 TiB: one line saying so (a traceback of
    numpy's _ArrayMemoryError before)."""
    huge = "workload.system_prompts={count: 1000000000000, tokens: {dist: constant, value: 10}}"
    err = _one_line(capsys, ["run", "--quiet", "--out", "/tmp/kvsim-test-oom", "--set", huge])
    assert "out of memory (Unable to allocate" in err and "lower it" in err


def test_a_command_runs_with_a_raised_gc_threshold_and_puts_it_back(monkeypatch, capsys):
    """The command line collects the young generation every _GC_GEN0 allocations while a command
    runs (its start-up makes long-lived objects), and puts the caller's thresholds back when
    the command returns or fails."""
    import gc

    import simulator.cli.main as cli_main
    import simulator.cli.run as cli_run

    seen = []

    def command(args):
        seen.append(gc.get_threshold())
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_run, "main", command)
    before = gc.get_threshold()
    gc.set_threshold(321, *before[1:])
    try:
        assert cli_main.main(["run", "--quiet"]) == 130  # interrupted, one line
        assert seen == [(cli_main._GC_GEN0, *before[1:])]
        assert gc.get_threshold() == (321, *before[1:])
    finally:
        gc.set_threshold(*before)
    assert "interrupted" in capsys.readouterr().err


@pytest.mark.parametrize("args,code", [(["run", "--quiet", "--set", "workload.num_requests=3"], 0),
                                       (["run", "--quiet", "--set", "engine.block_size=0"], 2)])
def test_the_executable_ends_as_an_interpreter_exit_would(tmp_path, args, code):
    """`python -m simulator` (the `kvsim` executable) skips the interpreter's teardown but not
    what the outside world sees of an exit: a thread that is not a daemon runs to its end, the
    atexit functions run, the output is flushed and the exit status is the command's."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import atexit, runpy, sys, threading, time
        def late():
            time.sleep(0.3)
            open({str(tmp_path / "thread")!r}, "w").write("joined")
        threading.Thread(target=late).start()
        atexit.register(lambda: open({str(tmp_path / "atexit")!r}, "w").write("ran"))
        sys.stdout.write("unflushed")  # (a pipe: block-buffered)
        sys.argv = ["kvsim", *{args!r}, "--out", {str(tmp_path / "out")!r}]
        runpy.run_module("simulator", run_name="__main__")
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.startswith("unflushed")
    assert (tmp_path / "thread").read_text() == "joined"
    assert (tmp_path / "atexit").read_text() == "ran"
    if code:
        assert proc.stderr.strip() == "kvsim: error: engine.block_size must be a positive integer, got 0"
    else:
        assert (tmp_path / "out" / "summary.json").is_file()


def test_a_reader_that_leaves_is_not_an_error(tmp_path):
    """`kvsim run | head -1`: the rest of the output goes nowhere, the run goes on to write its
    files and exits with status 0, nothing on stderr (rich's Console alone exits with status 1
    at the second setup line, before the simulation)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "simulator", "run", "--set", "workload.num_requests=30",
                             "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
    proc.stdout.readline()
    proc.stdout.close()  # (as head does after its line)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""
    assert (tmp_path / "out" / "summary.json").is_file()


def test_the_executable_under_a_profiler_or_without_stdout(tmp_path):
    """Under a profiler the process exits as usual (its output file is written after the module
    has run); with stdout closed at start (`kvsim run >&-`, sys.stdout is None) the command
    still ends with status 0."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    run = ["run", "--quiet", "--set", "workload.num_requests=5"]
    prof = tmp_path / "prof.out"
    proc = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "simulator", *run,
                           "--out", str(tmp_path / "a")], capture_output=True, text=True, cwd=root,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert prof.stat().st_size > 0
    proc = subprocess.run([sys.executable, "-m", "simulator", *run, "--out", str(tmp_path / "b")],
                          stderr=subprocess.PIPE, text=True, cwd=root, timeout=120,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and (tmp_path / "b" / "summary.json").is_file()
