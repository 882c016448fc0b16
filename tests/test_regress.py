"""kvsim regress: suite and baseline validation, direction-aware comparison, the pass /
deliberate-regression / --update cycle through the CLI, JUnit XML structure, and the
repository's own suite being consistent with its committed baseline."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from simulator.analysis.regress import (
    BASELINE_SCHEMA_VERSION,
    MetricSpec,
    Outcome,
    compare,
    junit_xml,
    load_baseline,
    load_suite,
    lookup,
    run_suite,
    write_baseline,
)
from simulator.cli.main import main
from simulator.engine import build as runner  # setup() resolves the engine there
from simulator.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent

# A saturated 40-request run of the default model: fast (~0.3 s) and sensitive to batching.
TINY = """\
set: [workload.num_requests=40, workload.arrival.rate=1000, engine.max_model_len=4096]
metrics:
  throughput.output_tokens_per_s: {better: higher}
  latency_s.e2e.p99: {better: lower}
  kv_cache.total_slots: {better: none, rel: 0}
"""


def write_suite(tmp_path: Path, text: str = TINY, name: str = "tiny.yaml") -> Path:
    suite = tmp_path / "suite"
    suite.mkdir(exist_ok=True)
    (suite / name).write_text(text)
    return suite


def spec(better: str, rel: float = 0.01, abs_: float = 0.0) -> MetricSpec:
    return MetricSpec("m", better, rel, abs_)


# ----------------------------------------------------------------------------- comparison


@pytest.mark.parametrize("better,value,status", [
    ("higher", 100.5, "ok"), ("higher", 99.5, "ok"), ("higher", 102.0, "improved"),
    ("higher", 98.0, "regressed"), ("lower", 98.0, "improved"), ("lower", 102.0, "regressed"),
    ("lower", 100.9, "ok"), ("none", 102.0, "regressed"), ("none", 98.0, "regressed"),
    ("none", 99.1, "ok")])
def test_compare_is_direction_aware(better, value, status):
    assert compare("s", spec(better), value, {"m": 100.0}).status == status


def test_tolerance_is_the_larger_of_abs_and_rel():
    m = spec("lower", rel=0.01, abs_=0.5)
    assert m.tolerance(10.0) == 0.5 and m.tolerance(1000.0) == 10.0
    assert compare("s", m, 10.5, {"m": 10.0}).status == "ok"
    assert compare("s", m, 10.51, {"m": 10.0}).status == "regressed"


def test_missing_baseline_value_fails_as_new_and_nulls_compare_equal():
    c = compare("s", spec("higher"), 3.0, {})
    assert c.status == "new" and c.failed and "--update" in c.message()
    assert compare("s", spec("higher"), None, {"m": None}).status == "ok"
    assert compare("s", spec("higher"), None, {"m": 1.0}).status == "regressed"


def test_lookup_nested_flat_dotted_and_errors():
    data = {"a": {"b": 1.5, "c": {"d": 2}}, "x.y": 3, "flag": True, "none": None}
    assert lookup(data, "a.b", "w") == 1.5 and lookup(data, "x.y", "w") == 3.0
    assert lookup(data, "flag", "w") == 1.0 and lookup(data, "none", "w") is None
    with pytest.raises(ConfigError, match=r"metric 'a\.bb' does not exist \(did you mean 'a\.b'\?\)"):
        lookup(data, "a.bb", "w")
    with pytest.raises(ConfigError, match="is a section, not a number; its fields: d"):
        lookup(data, "a.c", "w")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("text,match", [
    (TINY.replace("{better: higher}", "{better: higher, rel: -0.01}"),
     r"tolerance rel must be >= 0, got -0\.01"),
    (TINY.replace("{better: higher}", "{better: higher, abs: -1}"), r"tolerance abs must be >= 0"),
    (TINY.replace("{better: higher}", "{better: up}"), r"better must be one of higher, lower, none"),
    (TINY.replace("{better: higher}", "{better: higher, tol: 1}"), r"unknown key 'tol'"),
    (TINY.replace("metrics:", "metrix:"), r"unknown key 'metrix' \(did you mean 'metrics'\?\)"),
    ("set: [a=1]\n", r"`metrics:` must map at least one"),
    ("experiment: no_such_thing\nmetrics: {x: {}}\n", r"unknown experiment 'no_such_thing'"),
    ("experiment: opt13b_memory\nparams: {requests: 5}\nmetrics: {x: {}}\n",
     r"experiment opt13b_memory takes no 'requests'; valid: none"),
    ("experiment: block_size_sweep\nparams: {request: 5}\nmetrics: {x: {}}\n",
     r"takes no 'request' \(did you mean 'requests'\?\)"),
    ("experiment: bench_core\nmetrics: {x: {}}\n", r"experiment bench_core has no headline"),
])
def test_bad_suite_is_a_config_error(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match):
        load_suite(write_suite(tmp_path, text))


def test_negative_default_tolerance_in_suite_yaml(tmp_path):
    suite = write_suite(tmp_path)
    (suite / "suite.yaml").write_text("defaults: {rel: -0.5}\n")
    with pytest.raises(ConfigError, match=r"suite\.yaml: defaults: tolerance rel must be >= 0"):
        load_suite(suite)


def test_baseline_schema_errors(tmp_path):
    path = write_baseline(tmp_path / "b.json", {"s": {"m": 1.0}})
    assert load_baseline(path) == {"s": {"m": 1.0}}
    doc = json.loads(path.read_text())
    doc["schema_version"] = BASELINE_SCHEMA_VERSION + 1
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"schema_version 2 is not supported \(this kvsim reads 1\)"):
        load_baseline(path)
    doc["schema_version"], doc["summary_schema_version"] = BASELINE_SCHEMA_VERSION, 2
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"summary schema_version 2, this kvsim writes 3"):
        load_baseline(path)
    path.write_text("{}")
    with pytest.raises(ConfigError, match="not a kvsim regress baseline"):
        load_baseline(path)
    with pytest.raises(ConfigError, match=r"not found; record one with `kvsim regress --update`"):
        load_baseline(tmp_path / "absent.json")


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    suite = write_suite(tmp_path, TINY.replace("{better: higher}", "{better: higher, rel: -1}"))
    assert main(["regress", "--suite", str(suite)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kvsim: error: ") and "\n" not in err and "must be >= 0" in err
    suite = write_suite(tmp_path, TINY.replace("latency_s.e2e.p99", "latency_s.e2e.p999"))
    assert main(["regress", "--suite", str(suite), "--update"]) == 2
    err = capsys.readouterr().err.strip()
    assert "metric 'latency_s.e2e.p999' does not exist (did you mean 'latency_s.e2e.p99'?)" in err
    assert "\n" not in err


# ----------------------------------------------------------------------------- the cycle


def parse_junit(path: Path) -> ET.Element:
    """Structural JUnit check (the subset CI systems read): testsuites > testsuite > testcase,
    counts consistent with the cases, every case named, times numeric."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    ts = suites[0]
    cases = ts.findall("testcase")
    assert int(ts.get("tests")) == len(cases) == int(root.get("tests"))
    failed = [c for c in cases if c.find("failure") is not None]
    assert int(ts.get("failures")) == len(failed) == int(root.get("failures"))
    assert int(ts.get("errors")) == 0
    for c in cases:
        assert c.get("classname").startswith("regress.") and c.get("name")
        float(c.get("time"))
        for f in c.findall("failure"):
            assert f.get("message") and f.get("type") in ("regressed", "new") and f.text
    float(ts.get("time"))
    return ts


def test_pass_then_deliberate_regression_then_update(tmp_path, capsys):
    suite = write_suite(tmp_path)
    junit = tmp_path / "junit.xml"
    assert main(["regress", "--suite", str(suite), "--update"]) == 0
    baseline = suite / "baseline.json"
    first = baseline.read_text()
    assert main(["regress", "--suite", str(suite), "--junit", str(junit)]) == 0
    assert "pass 3 metrics in 1 scenarios" in capsys.readouterr().out
    assert len(parse_junit(junit).findall("testcase/failure")) == 0
    # a deliberately worse change: static batching forced on the scenario from the CLI
    assert main(["regress", "--suite", str(suite), "--junit", str(junit),
                 "--set", "engine.scheduler=static"]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "regressed" in out
    assert "tiny: throughput.output_tokens_per_s = " in out and "allowed: no drop beyond" in out
    ts = parse_junit(junit)
    failed = {c.get("name") for c in ts.findall("testcase") if c.find("failure") is not None}
    assert "throughput.output_tokens_per_s" in failed and "kv_cache.total_slots" not in failed
    # --update records the new figures deliberately; the same change then passes
    assert main(["regress", "--suite", str(suite), "--update", "--set", "engine.scheduler=static"]) == 0
    assert baseline.read_text() != first
    assert main(["regress", "--suite", str(suite), "--set", "engine.scheduler=static"]) == 0
    assert main(["regress", "--suite", str(suite)]) == 0  # continuous is better: "improved" passes
    assert "improved" in capsys.readouterr().out


def test_code_change_caught_by_monkeypatch(tmp_path, monkeypatch, capsys):
    """A worse engine (max_num_seqs silently cut to 1/32) fails the suite recorded without it."""
    suite = write_suite(tmp_path)
    assert main(["regress", "--suite", str(suite), "--update"]) == 0
    real = runner.resolve_engine

    def worse(*args, **kwargs):
        e = real(*args, **kwargs)
        return dataclasses.replace(e, max_num_seqs=max(1, e.max_num_seqs // 32))

    monkeypatch.setattr(runner, "resolve_engine", worse)
    assert main(["regress", "--suite", str(suite)]) == 1
    assert "throughput.output_tokens_per_s" in capsys.readouterr().out


def test_run_suite_is_deterministic_and_junit_counts(tmp_path):
    scenarios = load_suite(write_suite(tmp_path))
    a, b = run_suite(scenarios, None), run_suite(scenarios, None)
    assert a.values == b.values
    assert all(c.status == "new" for c in a.checks)
    tree = junit_xml(Outcome(a.checks, a.values, 0.1, []))
    path = tmp_path / "j.xml"
    tree.write(path)
    assert len(parse_junit(path).findall("testcase/failure")) == 3


# ----------------------------------------------------------------------------- repo suite


def test_repository_suite_matches_its_baseline():
    """Every scenario of regress/ loads (experiments exist, tolerances valid) and every metric
    has a committed baseline value, so CI fails only on a real change."""
    scenarios = load_suite(REPO / "regress")
    baseline = load_baseline(REPO / "regress" / "baseline.json")
    experiments = {s.experiment for s in scenarios if s.experiment}
    assert experiments == {"static_vs_continuous", "contiguous_vs_paged", "opt13b_memory",
                           "block_size_sweep", "max_num_seqs", "prefill_chunk", "gpu_memory_utilization"}
    for s in scenarios:
        for m in s.metrics:
            assert m.path in baseline.get(s.name, {}), (s.name, m.path)


@pytest.mark.slow
def test_repository_suite_passes():
    assert main(["regress", "--suite", str(REPO / "regress"), "--quiet"]) == 0


def test_update_only_keeps_other_scenarios_and_drops_stale(tmp_path, capsys):
    suite = write_suite(tmp_path)
    write_suite(tmp_path, TINY.replace("num_requests=40", "num_requests=30"), name="tiny2.yaml")
    baseline = suite / "baseline.json"
    write_baseline(baseline, {"gone": {"m": 1.0}, "tiny": {"throughput.output_tokens_per_s": 1.0}})
    assert main(["regress", "--suite", str(suite), "--update", "--only", "tiny2"]) == 0
    values = load_baseline(baseline)
    assert set(values) == {"gone", "tiny", "tiny2"}
    assert values["tiny"] == {"throughput.output_tokens_per_s": 1.0}
    assert main(["regress", "--suite", str(suite), "--only", "nope"]) == 2
    assert "--only nope: no such scenario; valid: tiny, tiny2" in capsys.readouterr().err
    assert main(["regress", "--suite", str(suite), "--update"]) == 0
    assert set(load_baseline(baseline)) == {"tiny", "tiny2"}  # a full update drops stale entries
