"""`kvsim plot` and `kvsim report` render from a CLI run directory, deterministically; tiers
get their own plot; multi-seed directories and bad paths are handled."""

from __future__ import annotations

import base64
import re

import numpy as np

from simulator.cli.main import main
from simulator.config.schema import build_config
from simulator.engine.run import run
from simulator.metrics.summary import SCHEMA_VERSION
from simulator.workload.generators import RequestArrays

SMALL = ["--set", "workload.num_requests=30", "--set", "workload.arrival.rate=10",
         "--set", "workload.output_tokens={dist: lognormal, mean: 40, cv: 1.0, min: 1, max: 256}",
         "--quiet"]
PNG = b"\x89PNG\r\n\x1a\n"
RUN_FILES = ("summary.json", "config.yaml", "requests.parquet", "iterations.parquet",
             "timeseries.parquet", "openmetrics.txt", "alerts.json")


def test_plots_and_report_render_from_a_cli_run_deterministically(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", *SMALL, "--out", str(a)]) == 0
    assert main(["plot", str(a)]) == 0
    assert main(["report", str(a)]) == 0
    assert main(["run", *SMALL, "--out", str(b)]) == 0
    assert main(["report", str(b)]) == 0  # plots as well
    plots = sorted(p.name for p in (a / "plots").iterdir())
    assert plots == ["batch.png", "gauges.png", "latency_cdf.png"]  # one priority: no tiers.png
    for name in plots:
        data = (a / "plots" / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 10_000
    page = (a / "report.html").read_text()
    images = re.findall(r'<img alt="([a-z_]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert [alt for alt, _ in images] == ["gauges", "batch", "latency_cdf"]
    assert all(base64.b64decode(data).startswith(PNG) for _, data in images)
    assert "src=\"http" not in page and "<link" not in page  # self-contained
    for text in ("No alert fired.", "kv_usage_high", "pending &gt; 10 for 5 s", "TTFT", "goodput",
                 "token-state share", "Configuration (resolved)",
                 f"schema_version {SCHEMA_VERSION}"):
        assert text in page, text
    # same config + seed: every file byte-identical, plots and report included
    for name in (*RUN_FILES, "report.html", *(f"plots/{p}" for p in plots)):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_tier_plot_when_priorities_differ(tmp_path, capsys):
    n = 12
    wl = RequestArrays(np.arange(n) * 0.05, np.full(n, 200, np.int64), np.full(n, 30, np.int64),
                       np.arange(n, dtype=np.int64) % 2)
    run(build_config(None, []), wl).write(tmp_path / "tiers")
    assert main(["plot", str(tmp_path / "tiers")]) == 0
    assert (tmp_path / "tiers" / "plots" / "tiers.png").read_bytes().startswith(PNG)


def test_report_of_a_multi_seed_directory(tmp_path, capsys):
    d = tmp_path / "seeds"
    assert main(["run", *SMALL, "--seeds", "2", "--out", str(d)]) == 0
    assert main(["report", str(d)]) == 0
    page = (d / "report.html").read_text()
    assert "over 2 seeds" in page and "ci95" in page and "pi95" in page
    assert page.count("data:image/png;base64,") == 3
    assert (d / "seed_0" / "plots" / "gauges.png").is_file()


def test_bad_run_directory(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "is not a run directory (missing requests.parquet" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert f"run directory {tmp_path / 'nope'} not found" in capsys.readouterr().err
