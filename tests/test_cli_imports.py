"""`kvsim --help` and every command's --help import only the standard library (no numpy, pandas,
matplotlib, simpy, ...): a test of what is imported, not of timing. And `python -m simulator` works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "pandas", "matplotlib", "simpy", "pyarrow", "scipy", "pydantic", "rich", "yaml")


def _python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=REPO,
                          timeout=timeout)


def imported_modules(importtime_stderr: str) -> set[str]:
    """Top-level package names from `python -X importtime` output."""
    names = set()
    for line in importtime_stderr.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            name = line.rsplit("|", 1)[1].strip()
            if name != "package":  # the header line
                names.add(name.split(".")[0])
    return names


def test_kvsim_help_imports_nothing_heavy():
    proc = _python("-X", "importtime", "-m", "simulator", "--help")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: kvsim" in proc.stdout
    names = imported_modules(proc.stderr)
    assert "simulator" in names and "argparse" in names  # the parse really was looked at
    assert not names & set(HEAVY), sorted(names & set(HEAVY))


def test_kvsim_version_imports_nothing_heavy():
    proc = _python("-X", "importtime", "-m", "simulator", "--version")
    assert proc.returncode == 0 and proc.stdout.strip().startswith("kvsim ")
    assert not imported_modules(proc.stderr) & set(HEAVY)


def test_every_command_help_builds_without_heavy_imports():
    """The whole parser (every command's and action's options) and every help text, in one fresh
    interpreter: sys.modules afterwards holds none of the heavy packages."""
    code = f"""
import json, sys
HEAVY = {HEAVY!r}
from simulator.cli.main import build_parser
parser = build_parser()
texts = [parser.format_help()]
for name, p in parser.commands.items():
    texts.append(p.format_help())
    sub = [a for a in p._actions if a.__class__.__name__ == '_SubParsersAction']
    for action in sub:
        texts += [q.format_help() for q in action.choices.values()]
heavy = sorted(m for m in sys.modules if m.split('.')[0] in HEAVY)
print(json.dumps(dict(heavy=heavy, commands=sorted(parser.commands), num_texts=len(texts))))
"""
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["heavy"] == []
    assert "run" in result["commands"] and result["num_texts"] >= 14  # 11 commands + 2 workload actions


def test_python_m_simulator_runs_a_simulation(tmp_path):
    out = tmp_path / "run"
    proc = _python("-m", "simulator", "run", "--quiet", "--set", "workload.num_requests=5",
                   "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(out)
    assert json.loads((out / "summary.json").read_text())["requests"]["arrived"] == 5


def test_python_m_simulator_bad_input_is_one_line_exit_2():
    proc = _python("-m", "simulator", "run", "--gpu", "h1000", "--quiet", "--out", "/tmp/kvsim-cli-x")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("kvsim: error: unknown GPU 'h1000'")


def test_cli_sets_library_defaults_before_numpy_and_keeps_the_users():
    """The command line's environment defaults (main.py: pydantic plug-ins off, OpenBLAS workers
    that sleep at once) are in place before numpy is imported, and a value the user set is kept."""
    code = """
import json, os, sys
import simulator.cli.main
print(json.dumps(dict(numpy="numpy" in sys.modules, blas=os.environ["OPENBLAS_THREAD_TIMEOUT"],
                      pydantic=os.environ["PYDANTIC_DISABLE_PLUGINS"])))
"""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_THREAD_TIMEOUT", "PYDANTIC_DISABLE_PLUGINS")}
    users = {"OPENBLAS_THREAD_TIMEOUT": "12", "PYDANTIC_DISABLE_PLUGINS": "1"}
    for given, expected in (({}, {"blas": "4", "pydantic": "__all__"}),
                            (users, {"blas": "12", "pydantic": "1"})):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                              env={**env, **given}, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads(proc.stdout) == {"numpy": False, **expected}
