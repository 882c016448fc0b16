"""Where packaged data lives, found one way: gpu_profiles/ and workloads/ at the top of the
repo, installed as simulator.gpu_profiles / simulator.workloads. From a source checkout (tests
run from the repo root shadow the installed package) the top-level folders are used directly."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # simulator/
REPO_ROOT = PACKAGE_ROOT.parent


def data_dir(name: str) -> Path:
    """The folder of packaged data `name` ('gpu_profiles' or 'workloads')."""
    here = REPO_ROOT / name
    if (here / "__init__.py").is_file():  # a source checkout
        return here
    return Path(str(resources.files(f"simulator.{name}")))
