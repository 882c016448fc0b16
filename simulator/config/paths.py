"""Where packaged data lives, and how a relative path written in a YAML file is found.

Packaged data, found one way: gpu_profiles/ and workloads/ at the top of the repo, installed
as simulator.gpu_profiles / simulator.workloads. From a source checkout (tests run from the
repo root shadow the installed package) the top-level folders are used directly.

A relative path in a YAML file resolves against the file's own folder first, then the CWD,
then the packaged workloads/ (rebase_paths, applied once when the file is loaded)."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # simulator/
REPO_ROOT = PACKAGE_ROOT.parent


def data_dir(name: str) -> Path:
    """The folder of packaged data `name` ('gpu_profiles' or 'workloads')."""
    here = REPO_ROOT / name
    if (here / "__init__.py").is_file():  # a source checkout
        return here
    return Path(str(resources.files(f"simulator.{name}")))


# --- paths in a YAML file --------------------------------------------------------------------
# NOTE: the rule for a relative path written in a YAML file: the file's own folder, then the
# CWD, then the packaged workloads/. The last two are the readers' rule (workload's
# resolve_path, hardware's get_model / get_gpu); the first is applied here, at load, by
# rewriting the value to a path that reaches the file beside the YAML. A value the readers'
# rule already finds as the same file is kept as written, so configs and sweep ids that worked
# before stay byte-identical.


def _readers_find(p: Path) -> Path | None:
    """Where the readers' rule (CWD, then packaged workloads/) finds relative path `p`."""
    base = data_dir("workloads")
    for q in (p, base / p, base / p.name if p.parent == Path("workloads") else None):
        if q is not None and q.exists():
            return q
    return None


def rebase(value: str, base_dir: Path) -> str:
    """`value` (a path written in a YAML file in `base_dir`) as the readers must see it."""
    p = Path(value).expanduser()
    beside = base_dir / p
    if p.is_absolute() or not beside.exists():
        return value
    found = _readers_find(p)
    if found is not None and os.path.samefile(found, beside):
        return value
    return str(beside)


def _looks_like_model_path(value: str, base_dir: Path) -> bool:
    return value.endswith(".json") or (base_dir / value / "config.json").is_file()


def _rebase_lengths(node: Any, base_dir: Path) -> Any:
    """Every `file` of an empirical length distribution anywhere under `node`."""
    if isinstance(node, list):
        return [_rebase_lengths(v, base_dir) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rebase_lengths(v, base_dir) for k, v in node.items()}
    if out.get("dist") == "empirical" and isinstance(out.get("file"), str) and out["file"]:
        out["file"] = rebase(out["file"], base_dir)
    return out


def rebase_paths(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Raw YAML data with every path-valued field rebased on `base_dir` (the YAML's folder):
    model (a config.json or a folder holding one), gpu (a profile .yaml), workload.trace,
    workload.lengths_file and every empirical length distribution's file."""
    data = dict(data)
    model, gpu = data.get("model"), data.get("gpu")
    if isinstance(model, str) and model and _looks_like_model_path(model, base_dir):
        data["model"] = rebase(model, base_dir)
    if isinstance(gpu, str) and gpu.endswith((".yaml", ".yml")):
        data["gpu"] = rebase(gpu, base_dir)
    workload = data.get("workload")
    if isinstance(workload, dict):
        workload = _rebase_lengths(workload, base_dir)
        for key in ("trace", "lengths_file"):
            if isinstance(workload.get(key), str) and workload[key]:
                workload[key] = rebase(workload[key], base_dir)
        data["workload"] = workload
    return data
