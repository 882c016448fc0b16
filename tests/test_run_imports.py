"""A one-replica run needs no pandas (~0.45 s of CPU of every run's start-up): its requests
table is numpy columns (metrics/table.py) written as DataFrame.to_parquet writes them, a plain
numeric CSV trace is read by pyarrow (workload/generators.read_numeric_csv) with the values
pandas.read_csv gives, and arrays cross into and out of pyarrow by their buffers
(workload/arrowio.py: pa.array and to_numpy would import pandas)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from simulator.metrics.table import Table, arrow_schema, write_parquet
from simulator.workload.arrowio import arrow_array, numpy_column
from simulator.workload.generators import read_numeric_csv

REPO = Path(__file__).resolve().parent.parent


def _run_imports(tmp_path: Path, *args: str) -> list[str]:
    code = (f"import sys; sys.argv = ['kvsim', 'run', *{list(args)!r}, '--out', {str(tmp_path / 'o')!r},"
            " '--quiet']\nfrom simulator.cli.main import main\nrc = main()\n"
            "print(rc, 'pandas' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()[-2:]  # (the run directory is printed first)


def test_default_run_imports_no_pandas(tmp_path):
    assert _run_imports(tmp_path, "--set", "workload.num_requests=20") == ["0", "False"]
    assert (tmp_path / "o" / "requests.parquet").is_file()


def test_numeric_csv_trace_run_imports_no_pandas(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\r\n0.5,100,20\r\n"
                     "1.0453891263175399,3463,317\r\n2.25,64,8\r\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"workload:\n  trace: {trace}\n  format: vidur\n")
    assert _run_imports(tmp_path, str(cfg)) == ["0", "False"]


def _pandas_bytes(cols: dict, path: Path) -> bytes:
    pd.DataFrame({k: (v.tolist() if v.dtype == object else v) for k, v in cols.items()}
                 ).to_parquet(path, index=False)
    return path.read_bytes()


def _table(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    f = rng.random(n) * 100
    f[rng.random(n) < 0.3] = np.nan  # a missing float is a null, as pandas writes it
    status = np.empty(n, object)
    status[:] = [["finished", "rejected", "", "é ✓"][i] for i in rng.integers(0, 4, n)]
    return {"req_id": np.arange(n, dtype=np.int64), "finish_s": f,
            "neg": -rng.integers(0, 1 << 40, n).astype(np.int64), "status": status}


@pytest.mark.parametrize("n", [1, 7, 5000])
def test_write_parquet_is_dataframe_to_parquet_byte_for_byte(tmp_path, n):
    cols = _table(n, n)
    write_parquet(tmp_path / "ours.parquet", cols)
    assert (tmp_path / "ours.parquet").read_bytes() == _pandas_bytes(cols, tmp_path / "pd.parquet")
    back = pd.read_parquet(tmp_path / "ours.parquet")
    assert np.array_equal(back.finish_s.to_numpy(), cols["finish_s"], equal_nan=True)
    assert back.status.tolist() == cols["status"].tolist()


def test_write_parquet_hands_other_tables_to_pandas(tmp_path):
    """No rows, None among the strings, another dtype: pandas writes them (its own dtypes)."""
    odd = np.empty(3, object)
    odd[:] = ["a", None, "b"]
    for cols in ({"x": np.zeros(0, np.int64)}, {"s": odd}, {"i": np.arange(3, dtype=np.int32)}):
        write_parquet(tmp_path / "ours.parquet", cols)
        assert (tmp_path / "ours.parquet").read_bytes() == _pandas_bytes(cols, tmp_path / "pd.parquet")


def test_table_columns_and_frame():
    cols = _table(50, 3)
    t = Table(cols)
    assert len(t) == 50 and "status" in t and "nope" not in t and t.columns == list(cols)
    df = t.to_pandas()
    assert list(df.columns) == list(cols) and str(df.status.dtype) == "str"


def test_arrow_schema_is_from_pandas_schema():
    cols = {"a": np.zeros(3), "b": np.zeros(3, np.int64)}
    assert arrow_schema(cols).equals(pa.Table.from_pandas(pd.DataFrame(cols), preserve_index=False).schema,
                                     check_metadata=True)


def test_arrow_array_and_numpy_column_round_trip():
    v = np.array([1.5, np.nan, -0.0, 3.0])
    assert arrow_array(v).equals(pa.array(v, from_pandas=True))
    ours, ref = arrow_array(v, from_pandas=False), pa.array(v)
    assert ours.null_count == ref.null_count == 0
    assert np.array_equal(ours.to_numpy().view(np.int64), ref.to_numpy().view(np.int64))
    i = np.arange(10, dtype=np.int64)
    chunked = pa.chunked_array([pa.array(i[:4]), pa.array(i[4:]).slice(1)])
    assert np.array_equal(numpy_column(chunked), chunked.to_numpy())
    assert np.array_equal(numpy_column(pa.array(i).slice(3, 4)), i[3:7])
    with_null = pa.chunked_array([pa.array([1.0, None])])  # (as a table column)
    assert np.array_equal(numpy_column(with_null), with_null.to_numpy(), equal_nan=True)


def test_read_numeric_csv_gives_read_csv_values(tmp_path):
    rng = np.random.default_rng(0)
    t = rng.exponential(1, 3000).cumsum()
    p = tmp_path / "t.csv"
    p.write_text("ts,n\n" + "".join(f"{x!r},{k}\n" for x, k in zip(t.tolist(), rng.integers(1, 9000, 3000))))
    ours = read_numeric_csv(p)
    ref = pd.read_csv(p)
    assert list(ours) == list(ref.columns)
    for c in ref.columns:
        assert ours[c].dtype == ref[c].dtype and np.array_equal(ours[c], ref[c].to_numpy())


@pytest.mark.parametrize("text", [
    "a,b\n1,2\n\n3,4\n",  # a blank line: the rows would not be lines 2, 3, ...
    "a,b\n1,x\n",  # not a number
    "a,b\n1,\n",  # a missing value
    "a,a\n1,2\n",  # pandas renames a duplicate
    "a,b\n1,inf\n",  # not finite
    "\ufeffa,b\n1,2\n",  # a byte-order mark
    "a,b\r1,2\r",  # CR line ends
    "a,b\n",  # no rows
    "a,b\n1,2,3\n",  # a ragged row
])
def test_read_numeric_csv_leaves_other_files_to_pandas(tmp_path, text):
    p = tmp_path / "t.csv"
    p.write_bytes(text.encode())
    assert read_numeric_csv(p) is None



@pytest.mark.parametrize("strings", [["finished", "", "rejected", ""], ["", ""], ["a"], ["é ✓", "x"],
                                     ["a\0b", "c"], [""]])
def test_arrow_array_of_strings_is_pa_array(strings):
    v = np.empty(len(strings), object)
    v[:] = strings
    ours = arrow_array(v)
    assert ours.validate(full=True) is None
    assert ours.equals(pa.array(strings, type=pa.large_string()))
