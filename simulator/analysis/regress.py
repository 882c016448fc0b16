"""Regression check of simulated figures against a committed baseline (`kvsim regress`).

A *suite* is a folder of scenario YAMLs (or one such file). A scenario is either a simulation
(a config, as `kvsim run` takes it) whose metrics are dotted paths into summary.json, or an
experiment's headline figures (`experiment: NAME`, experiments/NAME.py's `headline()`), whose
metrics are dotted paths into the dict it returns:

    name: continuous_sharegpt          # default: the file name without .yaml
    config_file: ../experiments/configs/quickstart.yaml   # optional, relative to this file
    config: {model: opt-13b, gpu: a100-40gb}               # optional mapping, over config_file
    set: [workload.num_requests=200]                       # optional --set style overrides
    metrics:
      throughput.output_tokens_per_s: {better: higher, rel: 0.005}
      latency_s.ttft.p99: {better: lower, rel: 0.01, abs: 0.001}

`better`: higher (may rise freely; fails when it falls by more than the tolerance), lower (may
fall freely), or none (any move beyond the tolerance fails). The tolerance is
max(abs, rel * |baseline|); a suite-wide `defaults:` in `suite.yaml` (or each metric) sets it.
Invariants: a run is deterministic, so the same code gives the same figures and a tolerance only
has to absorb floating-point summation order across numpy builds; the baseline holds values,
the suite holds policy (directions, tolerances), so loosening a tolerance never needs --update.
"""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator import __version__
from simulator.config.schema import read_yaml
from simulator.errors import ConfigError, did_you_mean

BASELINE_SCHEMA_VERSION = 1
SUMMARY_SCHEMA_VERSION = 3  # metrics.py's summary schema the baseline's run metrics refer to
DEFAULT_TOLERANCE = {"rel": 0.005, "abs": 0.0}  # 0.5 %: float order across numpy builds, not noise
DIRECTIONS = ("higher", "lower", "none")
SCENARIO_KEYS = ("name", "description", "config_file", "config", "set", "experiment", "params",
                 "metrics")
METRIC_KEYS = ("better", "rel", "abs")
SUITE_FILE = "suite.yaml"  # optional: {defaults: {rel, abs}}; not a scenario


@dataclass(frozen=True, slots=True)
class MetricSpec:
    path: str
    better: str  # higher | lower | none
    rel: float
    abs: float

    def tolerance(self, baseline: float) -> float:
        return max(self.abs, self.rel * abs(baseline))


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    file: Path
    metrics: tuple[MetricSpec, ...]
    config: dict[str, Any] = field(default_factory=dict)
    config_file: Path | None = None
    overrides: tuple[str, ...] = ()
    experiment: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Check:
    """One metric of one scenario compared with its baseline."""

    scenario: str
    metric: MetricSpec
    value: float | None
    baseline: float | None
    status: str  # ok | improved | regressed | new (no baseline value)
    wall_s: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in ("regressed", "new")

    def message(self) -> str:
        m = self.metric
        if self.status == "new":
            return (f"{self.scenario}: {m.path} = {fmt(self.value)} has no baseline value; "
                    f"record it with `kvsim regress --update`")
        tol = m.tolerance(self.baseline) if self.baseline is not None else 0.0
        return (f"{self.scenario}: {m.path} = {fmt(self.value)}, baseline {fmt(self.baseline)} "
                f"({change_text(self.value, self.baseline)}); allowed: {allowed_text(m, tol)}")


def fmt(x: float | None) -> str:
    if x is None:
        return "null"
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return f"{x:,.6g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.4g}"


def change_text(value: float | None, baseline: float | None) -> str:
    if value is None or baseline is None:
        return "-"
    d = value - baseline
    if baseline != 0:
        return f"{d:+.4g} ({100 * d / abs(baseline):+.2f} %)"
    return f"{d:+.4g}"


def allowed_text(m: MetricSpec, tol: float) -> str:
    side = {"higher": f"no drop beyond {tol:.4g}", "lower": f"no rise beyond {tol:.4g}",
            "none": f"within ±{tol:.4g}"}[m.better]
    return side


# ----------------------------------------------------------------------------- loading


def _tolerances(where: str, data: dict[str, Any], base: dict[str, float]) -> dict[str, float]:
    out = dict(base)
    for key in ("rel", "abs"):
        if key in data:
            v = data[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"{where}: tolerance {key} must be a number >= 0, got {v!r}")
            if v < 0:
                raise ConfigError(f"{where}: tolerance {key} must be >= 0, got {v!r} "
                                  f"(direction is set by `better:`, not by the sign)")
            out[key] = float(v)
    return out


def _read_yaml(path: Path) -> Any:
    return read_yaml(path, str(path))


def load_suite(suite: str | Path) -> list[Scenario]:
    """Scenarios of a suite folder (every *.yaml but suite.yaml, sorted by file name) or of one
    file. Every rule is checked here, before anything runs."""
    root = Path(suite)
    if root.is_dir():
        files = sorted(p for p in root.glob("*.yaml") if p.name != SUITE_FILE)
        settings_file = root / SUITE_FILE
    elif root.is_file():
        files, settings_file = [root], root.parent / SUITE_FILE
    else:
        raise ConfigError(f"regress suite {root}: no such folder or file")
    if not files:
        raise ConfigError(f"regress suite {root}: no scenario *.yaml files")
    defaults = dict(DEFAULT_TOLERANCE)
    if settings_file.is_file():
        settings = _read_yaml(settings_file) or {}
        if not isinstance(settings, dict) or set(settings) - {"defaults"}:
            raise ConfigError(f"{settings_file}: expected only a `defaults: {{rel, abs}}` mapping")
        defaults = _tolerances(f"{settings_file}: defaults", settings.get("defaults") or {}, defaults)
    scenarios = [load_scenario(p, defaults) for p in files]
    seen: dict[str, Path] = {}
    for s in scenarios:
        if s.name in seen:
            raise ConfigError(f"regress suite {root}: scenario name {s.name!r} is used by both "
                              f"{seen[s.name].name} and {s.file.name}")
        seen[s.name] = s.file
    return scenarios


def load_scenario(path: Path, defaults: dict[str, float] | None = None) -> Scenario:
    data = _read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a scenario must be a mapping")
    for key in data:
        if key not in SCENARIO_KEYS:
            raise ConfigError(f"{path}: unknown key {key!r}{did_you_mean(key, SCENARIO_KEYS)}; "
                              f"valid: {', '.join(SCENARIO_KEYS)}")
    defaults = defaults or dict(DEFAULT_TOLERANCE)
    name = str(data.get("name") or path.stem)
    metrics_raw = data.get("metrics")
    if not isinstance(metrics_raw, dict) or not metrics_raw:
        raise ConfigError(f"{path}: `metrics:` must map at least one dotted metric path to "
                          f"{{better, rel, abs}}")
    metrics = []
    for mpath, spec in metrics_raw.items():
        where = f"{path}: metric {mpath}"
        spec = spec or {}
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: expected a mapping {{better, rel, abs}}, got {spec!r}")
        for key in spec:
            if key not in METRIC_KEYS:
                raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, METRIC_KEYS)}; "
                                  f"valid: {', '.join(METRIC_KEYS)}")
        better = spec.get("better", "none")
        if better not in DIRECTIONS:
            raise ConfigError(f"{where}: better must be one of {', '.join(DIRECTIONS)}, "
                              f"got {better!r}")
        tol = _tolerances(where, spec, defaults)
        metrics.append(MetricSpec(str(mpath), better, tol["rel"], tol["abs"]))
    experiment = data.get("experiment")
    if experiment is not None and any(k in data for k in ("config", "config_file", "set")):
        raise ConfigError(f"{path}: an experiment scenario takes `params:`, not config/config_file/set")
    params = data.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: params must be a mapping, got {params!r}")
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: config must be a mapping, got {config!r}")
    overrides = data.get("set") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(f"{path}: set must be a list of key=value strings, got {overrides!r}")
    config_file = None
    if data.get("config_file"):
        config_file = (path.parent / str(data["config_file"])).resolve()
        if not config_file.is_file():
            raise ConfigError(f"{path}: config_file {data['config_file']} not found ({config_file})")
    if experiment is not None:
        _check_params(path, str(experiment), params)
    return Scenario(name, path, tuple(metrics), config, config_file, tuple(overrides),
                    str(experiment) if experiment is not None else None, params)


def _check_params(path: Path, name: str, params: dict[str, Any]) -> None:
    """The experiment exists, has a headline, and takes these params (before anything runs)."""
    import inspect

    from simulator.analysis.experiments import get_experiment
    exp = get_experiment(name)  # unknown name: an error listing the valid ones
    if getattr(exp.headline, "missing", False):
        raise ConfigError(f"{path}: experiment {name} has no headline() to check")
    valid = [n for n, p in inspect.signature(exp.headline).parameters.items()
             if n != "overrides" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in params:
        if key not in valid:
            raise ConfigError(f"{path}: params: experiment {name} takes no {key!r}"
                              f"{did_you_mean(key, valid)}; valid: {', '.join(valid) or 'none'}")


def load_baseline(path: str | Path) -> dict[str, dict[str, float | None]]:
    """scenario -> metric -> value. Raises ConfigError on a missing file or another schema."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"baseline {path}: not found; record one with `kvsim regress --update`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"baseline {path}: invalid JSON ({e})") from None
    if not isinstance(data, dict) or data.get("kind") != "kvsim_regress_baseline":
        raise ConfigError(f"baseline {path}: not a kvsim regress baseline (no kind: "
                          f"kvsim_regress_baseline)")
    version = data.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise ConfigError(f"baseline {path}: schema_version {version!r} is not supported (this kvsim "
                          f"reads {BASELINE_SCHEMA_VERSION}); regenerate it with `kvsim regress "
                          f"--update` and review the diff")
    summary_version = data.get("summary_schema_version")
    if summary_version != SUMMARY_SCHEMA_VERSION:
        raise ConfigError(f"baseline {path}: recorded against summary schema_version "
                          f"{summary_version!r}, this kvsim writes {SUMMARY_SCHEMA_VERSION} (metric "
                          f"meanings may differ); regenerate it with `kvsim regress --update`")
    scenarios = data.get("scenarios")
    if not isinstance(scenarios, dict):
        raise ConfigError(f"baseline {path}: `scenarios` must be a mapping")
    out: dict[str, dict[str, float | None]] = {}
    for name, entry in scenarios.items():
        metrics = entry.get("metrics", {}) if isinstance(entry, dict) else None
        if not isinstance(metrics, dict):
            raise ConfigError(f"baseline {path}: scenario {name!r} must map metrics to numbers")
        for metric, v in metrics.items():
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v)):
                raise ConfigError(f"baseline {path}: {name} {metric} must be a finite number or "
                                  f"null, got {v!r}; regenerate it with `kvsim regress --update`")
        out[name] = dict(metrics)
    return out


def write_baseline(path: str | Path, values: dict[str, dict[str, float | None]]) -> Path:
    path = Path(path)
    doc = {"kind": "kvsim_regress_baseline", "schema_version": BASELINE_SCHEMA_VERSION,
           "summary_schema_version": SUMMARY_SCHEMA_VERSION, "kvsim_version": __version__,
           "scenarios": {name: {"metrics": dict(sorted(m.items()))}
                         for name, m in sorted(values.items())}}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


# ----------------------------------------------------------------------------- running


def leaf_paths(d: Any, prefix: str = "") -> list[str]:
    if not isinstance(d, dict):
        return [prefix[:-1]] if prefix else []
    out = []
    for k, v in d.items():
        out += leaf_paths(v, f"{prefix}{k}.")
    return out


_MISSING = object()


def _find(node: Any, parts: list[str]) -> Any:
    """Follow `parts` through nested mappings; a key may itself hold dots ("a.b" in a flat
    headline dict), so every split of the remaining path is tried, longest key first."""
    if not parts:
        return node
    if not isinstance(node, dict):
        return _MISSING
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in node:
            found = _find(node[key], parts[n:])
            if found is not _MISSING:
                return found
    return _MISSING


def lookup(data: dict[str, Any], path: str, where: str) -> float | None:
    """The number at a dotted path; ConfigError with a suggestion when it does not exist."""
    node = _find(data, path.split("."))
    if node is _MISSING:
        valid = [p for p in leaf_paths(data) if p]
        raise ConfigError(f"{where}: metric {path!r} does not exist{did_you_mean(path, valid)}")
    if isinstance(node, dict):
        raise ConfigError(f"{where}: metric {path!r} is a section, not a number; its fields: "
                          f"{', '.join(sorted(node))}")
    if node is None:
        return None
    if isinstance(node, bool):
        return float(node)
    if not isinstance(node, (int, float)):
        raise ConfigError(f"{where}: metric {path!r} is {node!r}, not a number")
    return float(node)


def run_scenario(s: Scenario, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """The mapping the scenario's metric paths point into: summary.json for a simulation, the
    headline dict for an experiment. `overrides` (kvsim regress --set) apply to every
    simulation, after the scenario's own."""
    if s.experiment is not None:
        from simulator.analysis.experiments import get_experiment
        exp = get_experiment(s.experiment)
        try:
            return exp.headline(**s.params, overrides=list(overrides))
        except TypeError as e:
            raise ConfigError(f"{s.file}: params for experiment {s.experiment}: {e}") from None
    from simulator.config.schema import apply_overrides, from_dict, load_config
    from simulator.engine.run import run
    data = _merge(load_config(s.config_file), s.config)
    apply_overrides(data, [*s.overrides, *overrides], where=f"{s.file}: ")
    return run(from_dict(data)).summary


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, mapping by mapping (config: over config_file:)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def compare(scenario: str, m: MetricSpec, value: float | None, baseline: dict[str, float | None]
            ) -> Check:
    if m.path not in baseline:
        return Check(scenario, m, value, None, "new")
    base = baseline[m.path]
    if value is None or base is None:
        return Check(scenario, m, value, base, "ok" if value == base else "regressed")
    tol = m.tolerance(base)
    d = value - base
    if abs(d) <= tol:
        status = "ok"
    elif m.better == "higher":
        status = "improved" if d > 0 else "regressed"
    elif m.better == "lower":
        status = "improved" if d < 0 else "regressed"
    else:
        status = "regressed"
    return Check(scenario, m, value, base, status)


@dataclass
class Outcome:
    checks: list[Check]
    values: dict[str, dict[str, float | None]]
    wall_s: float
    stale: list[str]  # baseline scenarios no longer in the suite

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.failed]


def run_suite(scenarios: list[Scenario], baseline: dict[str, dict[str, float | None]] | None,
              overrides: list[str] | tuple[str, ...] = (),
              progress: Callable[[Scenario, float], None] | None = None) -> Outcome:
    """Steps: 1. run each scenario; 2. read its metrics (unknown path: ConfigError);
    3. compare each with the baseline (None: nothing to compare, every check is `new`)."""
    checks, values = [], {}
    t_all = time.perf_counter()
    for s in scenarios:
        t0 = time.perf_counter()
        data = run_scenario(s, overrides)
        wall = time.perf_counter() - t0
        values[s.name] = {}
        for m in s.metrics:
            v = lookup(data, m.path, f"{s.file}")
            values[s.name][m.path] = v
            c = compare(s.name, m, v, (baseline or {}).get(s.name, {}))
            c.wall_s = wall / len(s.metrics)
            checks.append(c)
        if progress is not None:
            progress(s, wall)
    stale = sorted(set(baseline or {}) - set(values))
    return Outcome(checks, values, time.perf_counter() - t_all, stale)


# ----------------------------------------------------------------------------- JUnit


def junit_xml(outcome: Outcome, suite_name: str = "kvsim regress") -> ET.ElementTree:
    """One <testcase> per (scenario, metric): classname regress.<scenario>, name the metric;
    a regression or a missing baseline value is a <failure> whose message is the diff line."""
    failures = len(outcome.failed)
    root = ET.Element("testsuites", name=suite_name, tests=str(len(outcome.checks)),
                      failures=str(failures), errors="0", time=f"{outcome.wall_s:.3f}")
    ts = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(outcome.checks)),
                       failures=str(failures), errors="0", skipped="0",
                       time=f"{outcome.wall_s:.3f}")
    for c in outcome.checks:
        tc = ET.SubElement(ts, "testcase", classname=f"regress.{c.scenario}", name=c.metric.path,
                           time=f"{c.wall_s:.3f}")
        if c.failed:
            f = ET.SubElement(tc, "failure", message=c.message(), type=c.status)
            f.text = c.message()
        else:
            out = ET.SubElement(tc, "system-out")
            out.text = f"{c.status}: {c.message()}"
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(outcome: Outcome, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_xml(outcome).write(path, encoding="utf-8", xml_declaration=True)
    return path
