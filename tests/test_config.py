"""The typed config: one-line errors naming field and value, sections read as before, every
section in force in to_dict(), paths in a YAML resolved beside it, config below every layer."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from simulator.config.fields import config_error
from simulator.config.paths import rebase_paths
from simulator.config.registry import Registry
from simulator.config.schema import (
    EngineConfig,
    SimConfig,
    apply_overrides,
    build_config,
    from_dict,
    load_config,
    split_override,
)
from simulator.config.sections import DEFAULT_RULES, AlertsConfig, ClusterConfig, SloConfig
from simulator.config.workload import WorkloadConfig
from simulator.errors import ConfigError
from simulator.workload.load import generate


@pytest.mark.parametrize("data, message", [
    ({"engine": {"block_size": 0}}, "engine.block_size must be a positive integer, got 0"),
    ({"engine": {"block_size": 16.0}}, "engine.block_size must be a positive integer, got 16.0"),
    ({"engine": {"block_size": True}}, "engine.block_size must be a positive integer, got True"),
    ({"engine": {"gpu_memory_utilization": "0.9"}},
     "engine.gpu_memory_utilization must be in (0, 1], got '0.9'"),
    ({"engine": {"enable_prefix_caching": "yes"}},
     "engine.enable_prefix_caching must be true or false, got 'yes'"),
    ({"engine": {"contiguous_reserve": "pow3"}},
     "engine.contiguous_reserve must be one of max_model_len, pow2, oracle (did you mean 'pow2'?), "
     "got 'pow3'"),
    ({"engine": {"eviction_params": 60}}, "engine.eviction_params must be a mapping, got 60"),
    ({"engine": {"kv_allocator_params": [1]}}, "engine.kv_allocator_params must be a mapping, got [1]"),
    ({"engine": {"eviction_ttl_s": 0}}, "engine.eviction_ttl_s must be > 0 seconds, got 0"),
    ({"engine": {"kv_allocator": ""}}, "engine.kv_allocator must be a name, got ''"),
    ({"engine": {"blok_size": 8}}, "engine: unknown key 'blok_size' (did you mean 'block_size'?); valid: "
                                   "block_size, gpu_memory_utilization,"),
    ({"engine": [16]}, "engine: expected a mapping, got [16]"),
    ({"modle": "x"}, "config: unknown key 'modle' (did you mean 'model'?); valid: model, gpu, seed,"),
    ({"seed": 1.5}, "seed must be a non-negative integer, got 1.5"),
    ({"model": 7}, "model must be a non-empty string, got 7"),
    ({"workload": {"arrival": {"process": "onoff", "rate_on": 1, "on_s": 1, "off_s": 1,
                               "periods": "random"}}},
     "workload.arrival.periods must be one of fixed, exponential, got 'random'"),
    ({"workload": {"arrival": {"process": "ramp", "start_rate": 0, "end_rate": 0, "ramp_s": 5}}},
     "workload.arrival: ramp start_rate and end_rate are both 0"),
    ({"workload": {"prompt_tokens": 100}},
     "workload.prompt_tokens: expected a mapping with 'dist' (constant, empirical, lognormal, uniform, "
     "zipf), got 100"),
    ({"workload": {"prompt_tokens": {"dist": "zipf", "s": 1.1, "high": 2.5}}},
     "workload.prompt_tokens.high must be a positive integer, got 2.5"),
    ({"workload": {"sessions": {"turns": {"dist": "constant", "value": 2},
                                "think_time_s": {"dist": "uniform", "low": 5, "high": 1}}}},
     "workload.sessions.think_time_s: uniform high (1) < low (5)"),
    ({"workload": {"tenants": [{"name": "a"}, {"name": "b", "prompt_tokens": {"dist": "constant"}}]}},
     "workload.tenants[1].prompt_tokens: missing 'value'"),
    ({"workload": {"tenants": [{"name": "a", "priority": "high"}]}},
     "workload.tenants[0].priority must be an integer, got 'high'"),
    ({"workload": {"trace": "x.csv", "columns": {"prompt_tokens": "", "output_tokens": "o"}}},
     "workload.columns.prompt_tokens must be a column name, got ''"),
    ({"workload": {"trace": "x.csv", "filter": {"Model": {"a": 1}}}},
     "workload.filter.Model must be a value or a list of values, got {'a': 1}"),
    ({"slo": {"ttft_s": True}},
     "slo.ttft_s must be a number of seconds > 0 (or null: not checked), got True"),
    ({"cluster": {"replicas": 1.0}}, "cluster.replicas must be an integer >= 1, got 1.0"),
    ({"cluster": {"router": 3}}, "cluster.router must be a name, got 3"),
    ({"alerts": {"busy": {"signal": "runing", "threshold": 3}}},
     "alerts.busy.signal must be one of kv_usage, pending, running, preemption_rate "
     "(did you mean 'running'?), got 'runing'"),
    ({"alerts": []}, "alerts: expected a mapping of rule name -> fields, got []"),
])
def test_each_rule_is_one_line_naming_field_value_and_range(data, message):
    with pytest.raises(ConfigError) as e:
        from_dict(data)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(message), text


def test_direct_construction_names_the_section():
    with pytest.raises(ConfigError, match=r"^engine\.max_num_seqs must be a positive integer, got -3$"):
        EngineConfig(max_num_seqs=-3)
    with pytest.raises(ConfigError, match=r"^workload\.duration_s must be > 0, got 0$"):
        WorkloadConfig(duration_s=0)
    with pytest.raises(ConfigError, match=r"^seed must be a non-negative integer, got -1$"):
        SimConfig(seed=-1)
    with pytest.raises(ConfigError, match=r"^slo: unknown key 'ttft'"):
        SloConfig(ttft=1)


def test_numbers_keep_their_type_and_sections_are_frozen():
    cfg = from_dict({"engine": {"gpu_memory_utilization": 1, "eviction_ttl_s": 30},
                     "workload": {"duration_s": 60, "window_start_s": 5,
                                  "arrival": {"process": "poisson", "rate": 2}}})
    assert type(cfg.engine.gpu_memory_utilization) is int and type(cfg.workload.duration_s) is int
    assert type(cfg.workload.window_start_s) is int and type(cfg.workload.arrival["rate"]) is int
    assert type(cfg.slo.ttft_s) is float  # the summary reports SLO targets as floats
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen-instance error
        cfg.engine.block_size = 32  # type: ignore[misc]


def test_workload_parts_read_like_the_mappings_they_replace():
    cfg = from_dict({"workload": {"sessions": {"turns": {"dist": "constant", "value": 3},
                                               "think_time_s": {"dist": "constant", "value": 1}},
                                  "tenants": [{"name": "a"}, {"name": "b", "tier": "gold"}]}}).workload
    spec = cfg.prompt_tokens
    assert spec["dist"] == "lognormal" and spec.get("min", 0) == 1 and spec.get("nope", 7) == 7
    assert "max" in spec and "value" not in spec
    assert cfg.sessions["turns"] == {"dist": "constant", "value": 3}
    a, b = cfg.tenants
    assert a.get("tier", "") == "" and b["tier"] == "gold" and a.get("slo_ttft_s", np.nan) is np.nan
    assert a["sessions"] == cfg.sessions.to_dict()  # inherited from the top level
    with pytest.raises(KeyError):
        a["slo_ttft_s"]


def test_to_dict_holds_every_section_in_force_and_round_trips():
    cfg = build_config(None, ["alerts.pending_high.for_s=30", "alerts.kv_usage_high.enabled=false",
                              "slo.tpot_s=null", "engine.eviction_params={ttl_s: 5}"])
    d = cfg.to_dict()
    assert set(d) == {"model", "gpu", "seed", "engine", "workload", "alerts", "slo", "cluster"}
    assert d["slo"] == {"ttft_s": 2.0, "tpot_s": None}
    assert d["cluster"] == {"replicas": 1, "router": "round_robin", "router_params": {}}
    assert list(d["alerts"]) == list(DEFAULT_RULES)
    assert d["alerts"]["pending_high"] == {"signal": "pending", "threshold": 10, "for_s": 30,
                                           "window_s": 10.0, "enabled": True}
    assert d["alerts"]["kv_usage_high"]["enabled"] is False  # kept, so a re-read stays disabled
    assert d["engine"]["eviction_params"] == {"ttl_s": 5} and d["engine"]["kv_allocator_params"] == {}
    assert from_dict(d) == cfg and from_dict(yaml.safe_load(yaml.safe_dump(d))) == cfg
    assert from_dict({}).to_dict()["alerts"] == AlertsConfig.from_section(None).to_dict()


def test_run_directory_config_yaml_holds_default_slo_and_alerts(tmp_path):
    from simulator.engine.run import run

    cfg = build_config(None, ["workload.num_requests=5"])
    out = run(cfg).write(tmp_path / "run")
    written = yaml.safe_load((out / "config.yaml").read_text())
    assert written["slo"] == {"ttft_s": 2.0, "tpot_s": 0.1}
    assert set(written["alerts"]) == set(DEFAULT_RULES)
    assert written["cluster"]["replicas"] == 1
    assert from_dict({k: written[k] for k in SimConfig.model_fields}) == cfg


def test_null_sections_are_their_defaults_and_set_edits_default_mappings():
    cfg = from_dict({"engine": None, "slo": None, "alerts": None, "cluster": None})
    assert cfg == SimConfig()
    cfg = build_config(None, ["workload.prompt_tokens.mean=600", "replicas=2", "ttft_s=1"])
    assert cfg.workload.prompt_tokens == {"dist": "lognormal", "mean": 600, "cv": 1.0, "min": 1,
                                          "max": 2048}
    assert cfg.cluster == ClusterConfig(replicas=2) and cfg.slo.ttft_s == 1.0


def test_set_switching_a_distribution_drops_the_defaults_it_does_not_take(tmp_path):
    """`--set X.dist=constant` on the default lognormal: its mean and cv go (the clip bounds,
    which constant takes too, stay), in either order with the new key, and come back when the
    dist is switched back; a key the user gave stays (refused by name if the new distribution
    does not take it), even one equal to the default, and so do a config file's keys."""
    for sets in (["workload.output_tokens.dist=constant", "workload.output_tokens.value=200"],
                 ["workload.output_tokens.value=200", "workload.output_tokens.dist=constant"]):
        cfg = build_config(None, sets)
        assert cfg.workload.output_tokens == {"dist": "constant", "value": 200, "min": 1, "max": 2048}
    back = build_config(None, ["workload.output_tokens.dist=constant",
                               "workload.output_tokens.dist=lognormal"])
    assert back.workload.output_tokens == SimConfig().workload.output_tokens
    with pytest.raises(ConfigError, match=r"workload.output_tokens: missing 'value'"):
        build_config(None, ["workload.output_tokens.dist=constant"])
    for given in ("5", "337.99"):  # (337.99 is the default's mean: given, it is the user's)
        with pytest.raises(ConfigError, match=r"unknown key 'mean'; valid: dist, min, max, value"):
            build_config(None, [f"workload.output_tokens.mean={given}",
                                "workload.output_tokens.dist=constant", "workload.output_tokens.value=5"])
    f = tmp_path / "c.yaml"
    f.write_text("workload:\n  output_tokens: {dist: lognormal, mean: 337.99, cv: 1.0}\n")
    with pytest.raises(ConfigError, match=r"unknown key 'mean'"):
        build_config(f, ["workload.output_tokens.dist=constant", "workload.output_tokens.value=5"])
    cfg = build_config(None, ["workload.arrival.process=gamma", "workload.arrival.cv=2"])
    assert cfg.workload.arrival == {"process": "gamma", "rate": 20.0, "cv": 2}
    with pytest.raises(ConfigError, match=r"cluster.transfer: unknown key 'process'; valid: kind, "):
        build_config(None, ["cluster.transfer.process=gamma"])  # not the tag of that mapping


def test_replace_validates():
    cfg = SimConfig()
    assert cfg.replace(seed=3).seed == 3 and cfg.seed == 0
    with pytest.raises(ConfigError, match="seed must be a non-negative integer, got -2"):
        cfg.replace(seed=-2)


def test_one_set_parser():
    assert split_override("engine.block_size= 32") == ("engine.block_size", 32)
    assert split_override("workload.filter={Model: [a, b]}") == ("workload.filter", {"Model": ["a", "b"]})
    assert split_override("model=a=b") == ("model", "a=b")
    with pytest.raises(ConfigError, match=r"^suite.yaml: --set expects key=value, got 'x'$"):
        apply_overrides({}, ["x"], where="suite.yaml: ")


# --- files -------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["", "# only a comment\n\n# and another\n", "---\n"])
def test_an_empty_yaml_file_is_refused(tmp_path, text):
    p = tmp_path / "empty.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=r"config file .*empty.yaml: no settings \(the file is empty"):
        load_config(p)
    (tmp_path / "defaults.yaml").write_text("{}\n")  # an explicit empty mapping is the defaults
    assert build_config(tmp_path / "defaults.yaml") == SimConfig()


TRACE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00,10,5\n2024-01-01 00:00:01,20,7\n"


def test_a_relative_trace_resolves_beside_its_yaml_first(tmp_path, monkeypatch):
    conf, elsewhere = tmp_path / "conf", tmp_path / "elsewhere"
    conf.mkdir()
    elsewhere.mkdir()
    (conf / "t.csv").write_text(TRACE)
    (conf / "w.yaml").write_text("workload:\n  trace: t.csv\n  format: azure\n")
    # a different t.csv in the CWD: the YAML's own folder wins
    (elsewhere / "t.csv").write_text(TRACE.replace(",10,5", ",99,5"))
    monkeypatch.chdir(elsewhere)
    cfg = build_config(conf / "w.yaml")
    work = generate(cfg.workload, np.random.SeedSequence(0))
    assert list(work.prompt_tokens) == [10, 20]
    # a --set path is the user's, typed at the CWD: not rebased
    cfg = build_config(conf / "w.yaml", ["workload.trace=t.csv"])
    assert list(generate(cfg.workload, np.random.SeedSequence(0)).prompt_tokens) == [99, 20]
    # nothing beside the YAML: the CWD, as before
    (conf / "t.csv").unlink()
    assert build_config(conf / "w.yaml").workload.trace == "t.csv"


def test_paths_a_reader_already_finds_are_kept_as_written(tmp_path, monkeypatch):
    from simulator.config.paths import REPO_ROOT

    # the packaged sample: beside its YAML and in the packaged workloads/ - the same file
    assert load_config(REPO_ROOT / "workloads" / "sample.yaml")["workload"]["trace"] == "sample_trace.csv"
    monkeypatch.chdir(tmp_path)
    assert load_config(REPO_ROOT / "workloads" / "sample.yaml")["workload"]["trace"] == "sample_trace.csv"
    (tmp_path / "w.yaml").write_text("workload: {trace: t.csv}\n")
    (tmp_path / "t.csv").write_text(TRACE)
    assert load_config("w.yaml")["workload"]["trace"] == "t.csv"  # YAML folder = CWD


def test_every_path_valued_field_is_rebased(tmp_path):
    for name in ("t.csv", "lengths.csv", "emp.csv", "sys.csv", "my.yaml"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text("{}")
    emp = {"dist": "empirical", "file": "emp.csv", "column": "n"}
    data = {"model": "llama", "gpu": "my.yaml",
            "workload": {"trace": "t.csv", "lengths_file": "lengths.csv", "prompt_tokens": emp,
                         "system_prompts": {"count": 2, "tokens": {**emp, "file": "sys.csv"}},
                         "tenants": [{"name": "a", "output_tokens": emp}]}}
    out = rebase_paths(data, tmp_path)
    w = out["workload"]
    assert out["model"] == str(tmp_path / "llama") and out["gpu"] == str(tmp_path / "my.yaml")
    assert w["trace"] == str(tmp_path / "t.csv") and w["lengths_file"] == str(tmp_path / "lengths.csv")
    assert w["prompt_tokens"]["file"] == str(tmp_path / "emp.csv")
    assert w["system_prompts"]["tokens"]["file"] == str(tmp_path / "sys.csv")
    assert w["tenants"][0]["output_tokens"]["file"] == str(tmp_path / "emp.csv")
    assert data["workload"]["trace"] == "t.csv"  # the input is not changed
    # names that are not paths beside the YAML stay as written
    kept = rebase_paths({"model": "llama-2-7b", "gpu": "h100", "workload": {"trace": "/abs/t.csv"}}, tmp_path)
    assert kept == {"model": "llama-2-7b", "gpu": "h100", "workload": {"trace": "/abs/t.csv"}}


def test_a_gpu_profile_beside_the_yaml_is_used(tmp_path, monkeypatch):
    from simulator.config.paths import data_dir
    from simulator.engine.run import setup

    profile = (data_dir("gpu_profiles") / "l4.yaml").read_text()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text(profile)
    (tmp_path / "conf" / "w.yaml").write_text("gpu: mine.yaml\nmodel: llama-2-7b\n")
    monkeypatch.chdir(tmp_path)
    s = setup(build_config(tmp_path / "conf" / "w.yaml"))
    assert s.gpu.memory_gib == setup(build_config(None, ["gpu=l4", "model=llama-2-7b"])).gpu.memory_gib


# --- plug-in params and layering -----------------------------------------------------------------
class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ttl_s: float = Field(60.0, gt=0)
    mode: str = Field("a", pattern="^(a|b)$")


def test_plugin_params_errors_name_the_field_and_list_valid_keys():
    reg: Registry[type] = Registry("eviction_policy")
    reg.register("toy", params=_Params)(dict)
    assert reg.validate_params("toy", {"ttl_s": 5}, "engine.eviction_params") == {"ttl_s": 5.0, "mode": "a"}
    with pytest.raises(ConfigError, match=r"^engine\.eviction_params\.ttl_s must be > 0, got -1$"):
        reg.validate_params("toy", {"ttl_s": -1}, "engine.eviction_params")
    with pytest.raises(ConfigError, match=r"^engine\.eviction_params: unknown key 'ttl' for "
                                          r"eviction_policy 'toy' \(did you mean 'ttl_s'\?\); "
                                          r"valid: ttl_s, mode$"):
        reg.validate_params("toy", {"ttl": 1}, "engine.eviction_params")
    with pytest.raises(ConfigError, match=r"^engine\.eviction_params\.ttl_s must be a number, got 'x'$"):
        reg.validate_params("toy", {"ttl_s": "x"}, "engine.eviction_params")


def test_config_error_for_a_plain_model_keeps_the_path():
    from pydantic import ValidationError

    class M(BaseModel):
        n: int

    with pytest.raises(ValidationError) as e:
        M.model_validate({})
    assert str(config_error(e.value, "cluster.router_params")) == "cluster.router_params: missing 'n'"


def test_config_imports_nothing_above_it():
    code = ("import sys, simulator.config.schema, simulator.config.registry; "
            "print(sorted(m for m in sys.modules if m.startswith('simulator.') "
            "and not m.startswith(('simulator.config', 'simulator.errors'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
