"""kvsim sweep: grid checking, fault isolation, resume, Ctrl-C consistency, parallel == serial,
Ray == local, and the table / plot files."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simulator.analysis import sweep as sw
from simulator.cli.main import main
from simulator.errors import ConfigError

BASE = {"workload": {"num_requests": 40, "arrival": {"process": "poisson", "rate": 40.0},
                     "output_tokens": {"dist": "lognormal", "mean": 64, "cv": 1.0, "max": 512}},
        "engine": {"num_gpu_blocks_override": 400, "max_model_len": 2048}}  # block_size matters


def tasks(grid, seeds=(0,)):
    return sw.make_tasks(BASE, sw.check_grid(grid), list(seeds))


def files(out):
    return {p.name: p.read_text() for p in sorted((out / "points").glob("*.json"))}


def test_unknown_grid_key_names_a_suggestion():
    with pytest.raises(ConfigError, match=r"'engine.blok_size'.*did you mean 'engine.block_size'"):
        sw.check_grid({"engine.blok_size": [8]})
    with pytest.raises(ConfigError, match=r"unknown key 'max_num_seq'.*did you mean"):
        sw.check_grid({"max_num_seq": [8]})
    assert sw.check_grid({"block_size": [8]}) == {"engine.block_size": [8]}  # bare names work


def test_empty_grid_and_empty_values_are_clear_errors():
    with pytest.raises(ConfigError, match="empty grid"):
        sw.check_grid({})
    with pytest.raises(ConfigError, match="no values"):
        sw.parse_grid(["engine.block_size="])


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["sweep", "--grid", "engine.blok_size=8,16", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "did you mean 'engine.block_size'" in err
    assert main(["sweep", "--out", str(tmp_path)]) == 2
    assert "empty grid" in capsys.readouterr().err
    assert main(["sweep", "--grid", "block_size=8", "--backend", "ray", "--address", "127.0.0.1:1",
                 "--out", str(tmp_path)]) == 2
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in capsys.readouterr().err


def test_task_ids_are_stable_and_distinct():
    a = tasks({"engine.block_size": [8, 16]}, seeds=(0, 1))
    b = tasks({"engine.block_size": [8, 16]}, seeds=(0, 1))
    assert [t.id for t in a] == [t.id for t in b]
    assert len({t.id for t in a}) == 4


def test_broken_point_is_recorded_and_the_rest_runs_then_rerun_skips(tmp_path):
    ts = tasks({"engine.block_size": [64, 0, 32], "engine.max_num_seqs": [16, 64]})
    out = sw.execute(ts, tmp_path, workers=1, progress=False)
    assert (out.done, out.failed, out.skipped) == (6, 2, 0)
    df = sw.build_table(ts, out.records)
    assert list(df.status) == ["ok", "ok", "error", "error", "ok", "ok"]
    assert df.error[2].startswith("ConfigError: engine.block_size must be a positive integer, got 0")
    assert df["throughput.requests_per_s"].notna().sum() == 4
    # block size changes the pool (400 blocks x block_size slots): the sweep really varied it
    assert df.loc[0, "kv_cache.total_slots"] != df.loc[4, "kv_cache.total_slots"]
    before = files(tmp_path)
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "points").glob("*.json")}
    again = sw.execute(ts, tmp_path, workers=1, progress=False)
    assert (again.done, again.skipped) == (0, 6)
    assert files(tmp_path) == before
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "points").glob("*.json")} == mtimes
    retry = sw.execute(ts, tmp_path, workers=1, progress=False, retry_failed=True)
    assert (retry.done, retry.failed, retry.stale) == (2, 2, 0)
    # a record made by other code is reused but counted as stale
    path = tmp_path / "points" / f"{ts[0].id}.json"
    rec = json.loads(path.read_text())
    path.write_text(json.dumps({**rec, "code": "0" * 16}))
    assert sw.execute(ts, tmp_path, workers=1, progress=False).stale == 1


def test_ctrl_c_leaves_a_consistent_set_and_the_rerun_completes(tmp_path, monkeypatch):
    ts = tasks({"engine.max_num_seqs": [8, 16, 32, 64]})
    real = sw.run_task
    calls = []

    def flaky(task, fn=None):
        calls.append(task.id)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(task, fn)

    monkeypatch.setattr(sw, "run_task", flaky)
    out = sw.execute(ts, tmp_path, workers=1, progress=False)
    assert out.interrupted and out.done == 2
    left = list((tmp_path / "points").iterdir())
    assert len(left) == 2 and all(json.loads(p.read_text())["status"] == "ok" for p in left)
    monkeypatch.setattr(sw, "run_task", real)
    rest = sw.execute(ts, tmp_path, workers=1, progress=False)
    assert (rest.done, rest.skipped) == (2, 2) and not rest.interrupted


def test_two_workers_give_the_same_files_as_one(tmp_path):
    ts = tasks({"engine.block_size": [32, 16], "engine.max_num_seqs": [16, 64]})
    sw.execute(ts, tmp_path / "serial", workers=1, progress=False)
    sw.execute(ts, tmp_path / "pool", workers=2, progress=False)
    assert files(tmp_path / "serial") == files(tmp_path / "pool")
    assert len(files(tmp_path / "pool")) == 4


def test_seeds_give_intervals_and_the_cli_writes_table_and_heatmap(tmp_path):
    cfg = tmp_path / "base.yaml"
    cfg.write_text("workload: {num_requests: 30, arrival: {process: poisson, rate: 40.0},\n"
                   "  output_tokens: {dist: lognormal, mean: 64, cv: 1.0, max: 512}}\n"
                   "engine: {num_gpu_blocks_override: 300, max_model_len: 2048}\n"
                   "sweep: {grid: {engine.block_size: [32, 16]}}\n")
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--grid", "max_num_seqs=16,64", "--seeds", "2", "--workers", "2",
                 "--out", str(out), "--quiet", "--metric", "throughput.requests_per_s"]) == 0
    df = pd.read_parquet(out / "sweep.parquet")
    assert pd.read_csv(out / "sweep.csv").shape == df.shape
    assert list(df.columns[:2]) == ["engine.block_size", "engine.max_num_seqs"]
    assert len(df) == 4 and (df.seeds == 2).all()
    assert (df["latency_s.ttft.p99.ci95"] > 0).all()
    png = out / "sweep_throughput.requests_per_s.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow  # starting a local Ray instance takes 15-45 s on 2 busy cores
def test_ray_backend_matches_local(tmp_path):
    pytest.importorskip("ray", reason="ray is not installed (pip install 'kvsim[ray]')")
    ts = tasks({"engine.block_size": [32, 16]})
    sw.execute(ts, tmp_path / "local", workers=1, progress=False)
    sw.execute(ts, tmp_path / "ray", workers=2, backend="ray", progress=False)
    assert files(tmp_path / "local") == files(tmp_path / "ray")


def test_line_plot_with_intervals_and_bad_metric(tmp_path):
    df = pd.DataFrame({"workload.arrival.rate": [1.0, 2.0, 4.0] * 2, "engine.block_size": [16] * 3 + [32] * 3,
                       "status": ["ok"] * 5 + ["error"],
                       "latency_s.ttft.p99": [0.1, 0.2, 0.5, 0.1, 0.3, None],
                       "latency_s.ttft.p99.ci95": [0.01, 0.02, 0.05, 0.01, 0.03, None]})
    png = sw.plot_sweep(df, "latency_s.ttft.p99", "workload.arrival.rate", "engine.block_size",
                        tmp_path / "line.png", kind="line")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert sw.metric_label("latency_s.ttft.p99") == (1e3, "latency_s.ttft.p99 (ms)")
    assert sw.key_label("workload.arrival.rate") == "workload.arrival.rate (req/s)"
    with pytest.raises(ConfigError, match="did you mean 'latency_s.ttft.p99'"):
        sw.plot_sweep(df, "latency_s.ttft.p98", "workload.arrival.rate", None, tmp_path / "x.png")


def test_a_grid_key_that_is_also_a_metric_keeps_its_values(tmp_path):
    ts = tasks({"cluster.replicas": [1, 2]})
    out = sw.execute(ts, tmp_path, workers=1, progress=False)
    df = sw.build_table(ts, out.records)
    assert df["cluster.replicas"].tolist() == [1, 2] and df["cluster.replicas"].dtype.kind == "i"


def test_a_sweep_with_a_failed_point_exits_1(tmp_path, capsys):
    """One point's config is refused (block_size 8): the others are written, the command fails."""
    code = main(["sweep", "--grid", "engine.block_size=8,16", "--set", "workload.num_requests=5",
                 "--out", str(tmp_path), "--quiet"])
    assert code == 1
    table = pd.read_csv(tmp_path / "sweep.csv")
    assert sorted(table.status) == ["error", "ok"]
