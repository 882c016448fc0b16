"""The end-to-end check against published vLLM measurements (simulator/calibration/e2e.py): the
rows have sources and configs, and the table in docs/costmodel.md is what the committed configs
and profiles produce now (so the docs cannot drift from the code)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.calibration.e2e import CONFIG_DIR, compare, markdown_table, published_rows

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def comparisons():
    return compare()


def test_rows_name_a_source_and_a_committed_config():
    rows = published_rows()
    assert len({r.key for r in rows}) >= 5
    for r in rows:
        assert r.source.startswith("https://"), r
        assert (CONFIG_DIR / f"{r.key}.yaml").is_file(), r.key
        assert r.value > 0 and r.vllm and r.hardware and r.workload


def test_docs_table_matches_the_committed_configs(comparisons):
    """Recomputes kvsim's columns; a refit or a config change must update docs/costmodel.md
    (paste `kvsim calibrate --e2e`)."""
    docs = (REPO / "docs" / "costmodel.md").read_text()
    table = markdown_table(comparisons)
    missing = [line for line in table.splitlines() if line not in docs]
    assert not missing, "docs/costmodel.md end-to-end table is stale; rows not found:\n" + "\n".join(missing)


def test_async_scheduling_hides_host_time(comparisons):
    """Async scheduling can only shorten steps: throughput up, TPOT down, on every row."""
    for c in comparisons:
        if c.row.metric == "output_tokens_per_s":
            assert c.async_ >= c.sync, c
        else:
            assert c.async_ <= c.sync, c


def test_e2e_cli_prints_the_table(capsys, comparisons):
    from simulator.cli.main import main as cli_main

    assert cli_main(["calibrate", "--e2e"]) == 0
    assert capsys.readouterr().out.strip() == markdown_table(comparisons)
