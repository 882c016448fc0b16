"""What `kvsim` prints: the setup lines before the simulation (and flushed when piped), the
rejections as a (reason, count) table, piped lines not wrapped at 80 columns, and paths as the
user knows them (not site-packages)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import simpy

from simulator.cli import common
from simulator.cli.common import group_reasons
from simulator.cli.main import main

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--set", "workload.num_requests=20", "--set", "workload.arrival.rate=10"]
SETUP_MARKS = ("model meta-llama/Llama-3.1-8B on h100-sxm", "# GPU blocks:", "cost model:")


def test_setup_lines_are_printed_before_the_simulation_starts(tmp_path, capsys, monkeypatch):
    seen_at_start = []
    real_run = simpy.Environment.run

    def spy(self, *args, **kwargs):  # the moment the simulation starts
        seen_at_start.append(capsys.readouterr().out)
        return real_run(self, *args, **kwargs)
    monkeypatch.setattr(simpy.Environment, "run", spy)
    assert main(["run", *SMALL, "--out", str(tmp_path / "r")]) == 0
    after = capsys.readouterr().out
    assert len(seen_at_start) == 1
    before = seen_at_start[0]
    for mark in SETUP_MARKS:
        assert mark in before
        assert mark not in after  # printed once
    assert "requests:" not in before and "requests: 20 arrived" in after
    assert after.index("requests:") < after.index("wrote ")


def test_setup_lines_shown_once_before_the_first_of_several_seeds(tmp_path, capsys):
    assert main(["run", *SMALL, "--seeds", "2", "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert out.count("# GPU blocks:") == 1
    assert out.index("# GPU blocks:") < out.index("2 seeds: mean")


def test_setup_lines_reach_a_pipe_before_the_simulation(tmp_path):
    """The simulation is made to kill the process (os._exit: no buffer is flushed at exit) the
    moment it starts: what the pipe got was flushed before it."""
    script = textwrap.dedent(f"""
        import os, simpy
        simpy.Environment.run = lambda self, *a, **k: os._exit(3)
        from simulator.cli.main import main
        main(["run", "--set", "workload.num_requests=5", "--out", {str(tmp_path / 'p')!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 3, proc.stderr[-2000:]
    for mark in SETUP_MARKS:
        assert mark in proc.stdout


def test_quiet_prints_only_the_output_directory(tmp_path, capsys):
    out = tmp_path / "q"
    assert main(["run", *SMALL, "--quiet", "--out", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}\n"


def test_group_reasons_takes_the_numbers_out():
    by_reason = {"prompt+output 5020 > max_model_len 4096": 2,
                 "prompt+output 4100 > max_model_len 4096": 1,
                 "prompt+output 9830 > max_model_len 4096": 3,
                 "needs 70000 KV slots > pool of 65536": 1}
    assert group_reasons(by_reason) == [
        ("prompt+output 4,100..9,830 > max_model_len 4,096", 6),
        ("needs 70,000 KV slots > pool of 65,536", 1)]
    assert group_reasons({}) == []


def test_rejections_print_as_a_table_and_summary_json_keeps_every_reason(tmp_path, capsys):
    out = tmp_path / "rej"
    assert main(["run", "--set", "workload.num_requests=300", "--max-model-len", "1024",
                 "--set", "engine.kv_allocator=contiguous", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    by_reason = json.loads((out / "summary.json").read_text())["requests"]["rejected_by_reason"]
    assert len(by_reason) > 2  # one key per length, as summary.json has always had them
    rejected = sum(by_reason.values())
    assert "{'prompt" not in text and "rejected_by_reason" not in text
    lines = text.splitlines()
    start = lines.index("rejected requests")
    table = "\n".join(lines[start:start + 6])
    assert "reason" in table and "count" in table
    row = next(line for line in lines[start:] if "prompt+output" in line)
    assert "> max_model_len 1,024" in row and ".." in row and row.rstrip(" │").endswith(str(rejected))


def test_piped_output_is_not_wrapped_at_80_columns(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["run", *SMALL, "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cost = [line for line in lines if line.startswith("cost model:")]
    wrote = [line for line in lines if line.startswith("wrote ")]
    assert len(cost) == 1 and len(cost[0]) > 80
    assert len(wrote) == 1 and wrote[0].endswith("for a report")


def test_console_is_wide_when_not_a_terminal():
    con = common.make_console()
    assert not con.is_terminal and con.width == common.PIPE_WIDTH


def test_workload_inspect_shows_the_packaged_files_by_name(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sample = REPO / "workloads" / "sample.yaml"
    assert main(["workload", "inspect", str(sample), "--no-png"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "workload  workloads/sample.yaml: trace workloads/sample_trace.csv (azure)"
    assert str(REPO) not in out
    assert main(["workload", "inspect", str(sample), "--no-png", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["info"]["source"] == "workloads/sample_trace.csv (azure)"


def test_workload_inspect_synthetic_yaml_title(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["workload", "inspect", str(REPO / "workloads" / "chat.yaml"), "--no-png"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("workload  workloads/chat.yaml (synthetic, seed ")


def test_display_path_of_an_installed_package(tmp_path, monkeypatch):
    """Installed (not a checkout), the packaged workloads live in site-packages: shown by name."""
    site = tmp_path / "lib" / "site-packages" / "simulator" / "workloads"
    site.mkdir(parents=True)
    (site / "sample.yaml").write_text("workload: {}\n")
    import simulator.config.paths as paths
    monkeypatch.setattr(paths, "data_dir", lambda name: site if name == "workloads" else tmp_path / "none")
    assert common.display_path(site / "sample.yaml") == "workloads/sample.yaml"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("")
    assert common.display_path(tmp_path / "mine.yaml") == "mine.yaml"
    assert common.display_path("../elsewhere/x.csv") == "../elsewhere/x.csv"
