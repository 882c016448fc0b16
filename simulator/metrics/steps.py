"""StepColumns: the per-step columns the summary, the time series and the alerts read.

A run's iterations table has one row per engine step (recorder.ITER_COLUMNS and the optional
columns); the metrics derived from it only need the step ends and a few columns, so the
recorder keeps those as compact numpy arrays (counts in the narrowest integer dtype that holds
them) and streams the full table to iterations.parquet. `as_steps` gives the same view of a
DataFrame read back from a run directory, so every derived figure is computed by the same code
over the same float64 values, whichever it starts from (an integer column read as int16 or as
int64 gives the same float64 values).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# what the summary, time series, OpenMetrics and alerts read (decode_tokens only without
# num_sampled; the optional ones when present)
DERIVED_COLUMNS = ("duration_s", "num_seqs", "num_tokens", "decode_tokens", "num_preempted",
                   "num_running", "num_waiting", "kv_used_slots", "kv_usage", "kv_tokens_stored",
                   "num_sampled", "prefix_cache_queries", "prefix_cache_hits",
                   "kv_external_frag_slots")
EMPTY_COLUMNS = ("duration_s", "num_seqs", "num_tokens", "decode_tokens", "num_preempted",
                 "num_running", "num_waiting", "kv_used_slots", "kv_usage", "kv_tokens_stored")


class StepColumns:
    """Step ends (float64, start_s + duration_s per step) and the DERIVED_COLUMNS present, as
    numpy arrays; `len` is the number of steps, `in` and [] look a column up by name. A float
    column with few distinct values (kv_usage: one per free-block count) may be kept as codes
    into its sorted table of values (`coded`, 2 bytes a step): [] decodes it (a new array)."""

    __slots__ = ("ends", "columns", "coded")

    def __init__(self, ends: np.ndarray, columns: dict[str, np.ndarray],
                 coded: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.ends = ends
        self.columns = columns
        self.coded = coded or {}  # name -> (codes, sorted distinct values)

    def __len__(self) -> int:
        return len(self.ends)

    def __contains__(self, name: str) -> bool:
        return name in self.columns or name in self.coded

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.coded:
            codes, table = self.coded[name]
            return table[codes]
        return self.columns[name]

    def f64(self, name: str) -> np.ndarray:
        """A column as float64 (a view when it already is)."""
        return self[name].astype(np.float64, copy=False)

    def sort_key(self, name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(codes, table) of a coded column: codes order as the values do (ties alike)."""
        return self.coded.get(name)


def empty_steps() -> StepColumns:
    """A run without steps: the columns of an empty iterations table (no optional ones)."""
    return StepColumns(np.zeros(0), {c: np.zeros(0) for c in DERIVED_COLUMNS if c in EMPTY_COLUMNS})


def as_steps(iterations: pd.DataFrame | StepColumns) -> StepColumns:
    """The StepColumns of an iterations table (itself when it already is one)."""
    if isinstance(iterations, StepColumns):
        return iterations
    if not len(iterations):
        ends = np.zeros(0)
    else:
        ends = (iterations.start_s + iterations.duration_s).to_numpy(np.float64)
    return StepColumns(ends, {c: iterations[c].to_numpy() for c in iterations.columns})
