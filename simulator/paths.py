"""Where packaged data lives: gpu_profiles/ and workloads/ at the top of the repo, installed
as simulator.gpu_profiles / simulator.workloads. From a source checkout (tests run from the
repo root shadow the installed package) the top-level folders are used directly."""

from __future__ import annotations

from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_dir(name: str) -> Traversable:
    """`name` is 'gpu_profiles' or 'workloads'."""
    try:
        return resources.files(f"simulator.{name}")
    except ModuleNotFoundError:
        return REPO_ROOT / name
