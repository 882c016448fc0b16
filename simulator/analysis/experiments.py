"""Experiments: one question or published claim each, run by `kvsim experiment NAME`.

An experiment is experiments/NAME.py (its base config in experiments/configs/NAME.yaml when it
simulates). It exposes
- `main(argv=None)`: the full experiment; writes experiments/results/NAME.md (claim, setup,
  measured figures, whether the claim holds and why) and NAME.png;
- optionally `headline(overrides=(), **params) -> dict`: its headline figures from a small, fast
  variant, which a `kvsim regress` scenario (`experiment: NAME`) checks against a baseline.
Scripts written before this module (a `main()` that parses sys.argv) run unchanged.
This module also holds the helpers the experiments share (running one point, writing a page).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from simulator.config.paths import REPO_ROOT
from simulator.errors import ConfigError, did_you_mean


def experiments_dir() -> Path:
    """experiments/ of the source checkout, else of the working directory."""
    for d in (REPO_ROOT / "experiments", Path.cwd() / "experiments"):
        if d.is_dir():
            return d
    raise ConfigError("no experiments/ folder (looked in the kvsim checkout and the working directory)")


def list_experiments() -> list[str]:
    d = experiments_dir()
    return sorted(p.stem for p in d.glob("*.py") if not p.name.startswith("_"))


_LOADED: dict[str, ModuleType] = {}


def get_experiment(name: str) -> ModuleType:
    if name in _LOADED:
        return _LOADED[name]
    names = list_experiments()
    if name not in names:
        raise ConfigError(f"unknown experiment {name!r}{did_you_mean(name, names)}; "
                          f"valid: {', '.join(names)}")
    path = experiments_dir() / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"kvsim_experiments.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "headline"):
        module.headline = _no_headline(name)
    _LOADED[name] = module
    return module


def _no_headline(name: str):
    def headline(**_: Any) -> dict:
        raise ConfigError(f"experiment {name} has no headline() to check in a regress suite")
    headline.missing = True
    return headline


def run_experiment(name: str, argv: list[str]) -> int:
    """Run experiment `name`'s main with `argv` (its own flags, e.g. --requests)."""
    module = get_experiment(name)
    main = getattr(module, "main", None)
    if main is None:
        raise ConfigError(f"experiment {name} has no main()")
    if inspect.signature(main).parameters:
        return int(main(argv) or 0)
    saved = sys.argv
    sys.argv = [str(experiments_dir() / f"{name}.py"), *argv]  # a script that parses sys.argv
    try:
        return int(main() or 0)
    finally:
        sys.argv = saved


# ----------------------------------------------------------------------------- shared helpers


def results_dir() -> Path:
    out = experiments_dir() / "results"
    out.mkdir(exist_ok=True)
    return out


def config_path(name: str) -> Path:
    return experiments_dir() / "configs" / f"{name}.yaml"


def run_point(config: str | Path | None, sets: list[str], overrides=()) -> dict[str, Any]:
    """summary.json of one simulation: the experiment's YAML, then `overrides` (a regress
    --set, applied to every point), then the point's own `sets` (its axis value wins)."""
    from simulator.config.schema import build_config
    from simulator.engine.run import run
    return run(build_config(config, [*overrides, *sets])).summary


def run_result(config: str | Path | None, sets: list[str], overrides=()):
    from simulator.config.schema import build_config
    from simulator.engine.run import run
    return run(build_config(config, [*overrides, *sets]))


def md_table(header: list[str], rows: list[list[Any]], align: str | None = None) -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |",
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def write_page(name: str, title: str, *, claim: str, reproduce: str, setup: str,
               figures: list[str], verdict: str, why: str, png: bool = True) -> Path:
    """experiments/results/NAME.md with the sections every results page has."""
    lines = [f"# {title}", "", f"Reproduce: `{reproduce}`.", "", f"**Claim.** {claim}", "",
             f"**Setup.** {setup}", "", "**Measured.**", "", *figures, ""]
    if png:
        lines += [f"![{title}]({name}.png)", ""]
    lines += [f"**Verdict: {verdict}.** {why}", ""]
    path = results_dir() / f"{name}.md"
    path.write_text("\n".join(lines))
    return path
