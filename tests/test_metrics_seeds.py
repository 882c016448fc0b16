"""`kvsim run --seeds N`: per-seed runs equal single-seed runs; over seeds, a 95 % interval of
the mean (ci95, shrinks like 1/sqrt(N)) and a 95 % prediction interval (pi95, contains
single-seed values, shrinks with N towards the seed-to-seed spread); the t quantiles."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from simulator.cli.main import main
from simulator.metrics.summary import aggregate_seeds, flatten, t975

# ~40 short requests on the default H100 / Llama-3.1-8B: a fraction of a second per seed
SMALL = ["--set", "workload.num_requests=40", "--set", "workload.arrival.rate=10",
         "--set", "workload.output_tokens={dist: lognormal, mean: 60, cv: 1.0, min: 1, max: 512}",
         "--quiet"]
CHECKED = ("throughput.requests_per_s", "throughput.output_tokens_per_s", "latency_s.e2e.p90",
           "kv_cache.usage_mean", "batch.num_seqs.mean")


def _t_cdf(t: float, df: int, n: int = 4000) -> float:
    pdf = lambda x: math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(  # noqa: E731
        df * math.pi) * (1 + x * x / df) ** (-(df + 1) / 2)
    h = t / n
    simpson = pdf(0) + pdf(t) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n))
    return 0.5 + simpson * h / 3


@pytest.mark.parametrize("df", [1, 2, 4, 9, 30, 31, 60, 200])
def test_t975_is_the_0975_quantile(df):
    assert _t_cdf(t975(df), df) == pytest.approx(0.975, abs=1e-7)


def test_aggregate_by_hand():
    agg = aggregate_seeds([0, 1, 2], [{"a": {"x": 1.0, "ok": True}}, {"a": {"x": 2.0, "ok": False}},
                                      {"a": {"x": 6.0, "ok": True}}])
    x = agg["metrics"]["a.x"]
    sd = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + (6 - 3) ** 2) / 2)  # 7 ** .5
    assert x["mean"] == 3.0 and x["std"] == pytest.approx(sd)
    assert x["ci95_half_width"] == pytest.approx(4.302652730 * sd / math.sqrt(3))
    assert agg["metrics"]["a.ok"]["mean"] == pytest.approx(2 / 3)  # share of seeds
    one = aggregate_seeds([5], [{"a": 1.0}])["metrics"]["a"]
    assert one["mean"] == 1.0 and one["ci95_low"] is None
    assert flatten({"config": {"seed": 1}, "b": {"histogram": {"counts": [1]}, "c": None}}) == {"b.c": None}


def test_seeds_cli_intervals_contain_single_seed_values_and_shrink(tmp_path, capsys):
    assert main(["run", *SMALL, "--seed", "0", "--out", str(tmp_path / "single")]) == 0
    assert main(["run", *SMALL, "--seeds", "5", "--out", str(tmp_path / "five")]) == 0
    assert main(["run", *SMALL, "--seed", "5", "--seeds", "5", "--out", str(tmp_path / "more")]) == 0
    single = flatten(json.loads((tmp_path / "single" / "summary.json").read_text()))
    five = json.loads((tmp_path / "five" / "seeds_summary.json").read_text())
    assert five["seeds"] == [0, 1, 2, 3, 4] and five["kind"] == "multi_seed"
    # seed i of --seeds is the run --seed i: the seed-0 directory is byte-identical
    for name in ("summary.json", "openmetrics.txt", "alerts.json"):
        assert ((tmp_path / "five" / "seed_0" / name).read_bytes()
                == (tmp_path / "single" / name).read_bytes())
    runs = [json.loads((tmp_path / d / f"seed_{s}" / "summary.json").read_text())
            for d, seeds in (("five", range(5)), ("more", range(5, 10))) for s in seeds]
    by_n = {n: aggregate_seeds(list(range(n)), runs[:n])["metrics"] for n in (2, 5, 10)}
    assert by_n[5] == five["metrics"]  # the CLI's aggregate is the API's, through JSON
    fresh = [flatten(r) for r in runs[5:]]  # seeds 5..9: single-seed runs the N=5 run never saw
    varying = [p for p, m in five["metrics"].items() if m["std"]]
    inside = [five["metrics"][p]["pi95_low"] <= f[p] <= five["metrics"][p]["pi95_high"]
              for p in varying for f in fresh if f[p] is not None]
    assert np.mean(inside) >= 0.9  # a 95 % prediction interval: 0.99 of 270 here
    for path in CHECKED:
        m = [by_n[n][path] for n in (2, 5, 10)]
        assert m[1]["values"][0] == single[path]
        assert m[1]["pi95_low"] <= single[path] <= m[1]["pi95_high"], path
        assert all(m[1]["pi95_low"] <= f[path] <= m[1]["pi95_high"] for f in fresh), path
        ci = [x["ci95_half_width"] for x in m]
        pi = [x["pi95_high"] - x["pi95_low"] for x in m]
        assert ci[0] > ci[1] > ci[2] > 0 and pi[0] > pi[1] > pi[2], (path, ci, pi)
    # over every varying metric the typical interval shrinks (with 2 seeds the standard
    # deviation itself is so noisy that single metrics can go either way)
    for a, b in ((2, 5), (5, 10)):
        ratio = [by_n[b][p]["ci95_half_width"] / by_n[a][p]["ci95_half_width"]
                 for p in varying if by_n[a][p]["ci95_half_width"]]
        assert np.median(ratio) < 0.8, (a, b)


def test_seeds_must_be_positive(capsys):
    assert main(["run", "--seeds", "0", "--quiet"]) == 2
    assert "--seeds must be an integer >= 1, got 0" in capsys.readouterr().err
