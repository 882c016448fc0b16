"""Trace replay: read recorded traffic into RequestArrays, then reshape it (transforms).

Formats live in one registry (`TRACE_FORMATS`); `format: auto` picks the first whose columns
the file has (built-ins in their order, then plug-ins by name). A format is data, not code: a
plug-in module adds one with one line, `TRACE_FORMATS.register(name)(TraceFormat(...))`.
Every format maps file columns onto canonical fields (timestamp, prompt_tokens, output_tokens,
optional hash_ids / tenant / priority / session_id); `generic` takes that mapping from the
config (`columns:`, `timestamp_unit:`).

Rules (docs/workloads.md has the user-facing version):
- times become float seconds from the first request (t=0); datetimes are parsed as ISO 8601
  (a timezone offset is honoured, naive times are taken as UTC);
- unsorted timestamps are sorted (stable) with a warning naming the first out-of-order row,
  or rejected with `on_unsorted: error`;
- rows with 0 output tokens are failed requests (BurstGPT's convention): dropped and counted,
  or kept with 1 output token (`keep_failed: true`); rows with a 0-token prompt are dropped
  and counted; blank lines are skipped;
- any other bad value (missing column, missing value, non-numeric, negative or fractional
  length, unparseable timestamp) is a ConfigError naming the file, the row, its line and the
  column. Rows are data rows counted from 1; lines count the header (CSV) from 1.
"""

from __future__ import annotations

import gzip
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.config.registry import Registry
from simulator.config.workload import TIMESTAMP_UNITS, WorkloadConfig
from simulator.errors import ConfigError
from simulator.workload.generators import (
    ARRIVALS,
    MAX_LENGTH,
    TOO_LONG,
    ChunkIds,
    RequestArrays,
    missing_cell,
    num_chunks,
    read_numeric_csv,
    resolve_path,
    show_cell,
)

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True, slots=True)
class TraceFormat:
    name: str
    kind: str  # csv | jsonl
    columns: dict[str, str]  # canonical field -> file column
    timestamp_unit: str | None  # None: lengths only, arrivals come from workload.arrival
    about: str
    hash_block_tokens: int | None = None  # tokens per hash id (None: the config's)
    extra: tuple[str, ...] = field(default=())  # optional canonical fields present if found


TRACE_FORMATS: Registry[TraceFormat] = Registry("trace format")
# Auto-detection tries these in order; the first whose required columns are all present wins.
_DETECT_ORDER: list[str] = []


def _register(fmt: TraceFormat) -> None:
    TRACE_FORMATS.register(fmt.name)(fmt)
    _DETECT_ORDER.append(fmt.name)


_register(TraceFormat(
    "mooncake", "jsonl",
    {"timestamp": "timestamp", "prompt_tokens": "input_length", "output_tokens": "output_length",
     "hash_ids": "hash_ids"},
    "ms", "Mooncake (FAST'25) JSONL: timestamp ms, input_length, output_length, hash_ids",
    hash_block_tokens=512))
_register(TraceFormat(
    "azure", "csv",
    {"timestamp": "TIMESTAMP", "prompt_tokens": "ContextTokens", "output_tokens": "GeneratedTokens"},
    "datetime", "Azure LLM inference 2023/2024 CSV: TIMESTAMP, ContextTokens, GeneratedTokens"))
_register(TraceFormat(
    "burstgpt", "csv",
    {"timestamp": "Timestamp", "prompt_tokens": "Request tokens",
     "output_tokens": "Response tokens"},
    "s", "BurstGPT CSV: Timestamp s, Model, Request tokens, Response tokens, Total tokens, Log Type"))
_register(TraceFormat(
    "vidur", "csv",
    {"timestamp": "arrived_at", "prompt_tokens": "num_prefill_tokens",
     "output_tokens": "num_decode_tokens"},
    "s", "Vidur/Sarathi processed CSV: arrived_at s, num_prefill_tokens, num_decode_tokens"))
_register(TraceFormat(
    "lengths", "csv",
    {"prompt_tokens": "num_prefill_tokens", "output_tokens": "num_decode_tokens"},
    None, "lengths-only CSV (Vidur/Sarathi stats): num_prefill_tokens, num_decode_tokens; "
          "arrivals from workload.arrival"))
TRACE_FORMATS.register("generic")(None)  # built from the config's column mapping


# --- reading ---------------------------------------------------------------------------------
def _open_text(path: Path):
    return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)  # noqa: SIM115


def _sniff(path: Path) -> tuple[str, list[str], dict[str, np.ndarray] | None]:
    """(kind, header column names, the columns when the file is a plain CSV of numbers: read
    once, `read_trace` uses them; {} when it was read and is not one; None: not read, JSONL)
    from the first non-blank line."""
    with _open_text(path) as f:
        for line in f:
            if line.strip():
                break
        else:
            raise ConfigError(f"trace {path}: empty file")
    if line.lstrip().startswith("{"):
        try:
            first = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"trace {path}: line 1: invalid JSON ({e.msg})") from None
        return "jsonl", list(first) if isinstance(first, dict) else [], None
    numeric = read_numeric_csv(path)  # a plain CSV of numbers: its header without pandas
    if numeric is not None:
        return "csv", list(numeric), numeric
    import pandas as pd

    return "csv", list(pd.read_csv(path, nrows=0).columns), {}


def _resolve_format(cfg: WorkloadConfig, path: Path
                    ) -> tuple[TraceFormat, dict[str, np.ndarray] | None]:
    """The trace's format (named, or detected from its header), and the numeric columns the
    detection read (None: not read)."""
    name = cfg.format
    if name == "auto" and cfg.columns is not None:
        name = "generic"
    if name != "auto":
        fmt = TRACE_FORMATS.get(name)  # unknown name: ConfigError listing the valid ones
        if fmt is None:
            if cfg.columns is None:
                raise ConfigError(f"trace {path}: format generic needs workload.columns "
                                  f"(e.g. {{timestamp: ts, prompt_tokens: in, output_tokens: out}})")
            kind, _, numeric = _sniff(path)
            unit = cfg.timestamp_unit or "s"
            return TraceFormat("generic", kind, dict(cfg.columns),
                               unit if "timestamp" in cfg.columns else None, "column mapping"), numeric
        if cfg.columns is not None:
            raise ConfigError(f"workload.columns applies to format generic, not {name!r}")
        return fmt, None
    kind, header, numeric = _sniff(path)
    # built-in formats in their order, then plug-in formats by name
    plugins = [n for n in TRACE_FORMATS.names() if n not in _DETECT_ORDER and n != "generic"]
    for cand in [*_DETECT_ORDER, *plugins]:
        fmt = TRACE_FORMATS.get(cand)
        if fmt.kind == kind and set(fmt.columns.values()) <= set(header):
            return fmt, numeric
    formats = "; ".join(TRACE_FORMATS.get(n).about for n in [*_DETECT_ORDER, *plugins])
    raise ConfigError(f"trace {path}: cannot detect the format from {kind} columns {header}; "
                      f"known: {formats}. Name it with workload.format, or map the columns with "
                      f"format: generic and workload.columns")


# the canonical fields a plain numeric CSV may give without pandas (read_trace)
_NUMERIC_FIELDS = frozenset({"timestamp", "prompt_tokens", "output_tokens", "priority"})


def _read_numeric(path: Path, wanted: list[str], cols: dict[str, np.ndarray] | None = None
                  ) -> tuple[dict[str, np.ndarray], np.ndarray] | None:
    """_read_csv's columns as numpy arrays when the file is a plain CSV of numbers holding
    every wanted column (generators.read_numeric_csv: no blank lines, so the rows are lines
    2, 3, ...; `cols`: its columns, read already, {} when it read the file and found it is not
    one); None otherwise (pandas reads it, and names what is wrong)."""
    if cols is None:
        cols = read_numeric_csv(path)
    if not cols or not all(c in cols for c in wanted):
        return None
    return {c: cols[c] for c in wanted}, np.arange(len(cols[wanted[0]]), dtype=np.int64) + 2


def _read_csv(path: Path, wanted: list[str]) -> tuple[dict[str, pd.Series], np.ndarray]:
    import pandas as pd

    header = list(pd.read_csv(path, nrows=0).columns) if path.stat().st_size else []
    if not header:
        raise ConfigError(f"trace {path}: empty file")
    missing = [c for c in wanted if c not in header]
    if missing:
        raise ConfigError(f"trace {path}: missing column {missing[0]!r}; columns: {header}")
    # Blank lines are kept as all-NaN rows so that line numbers stay exact, then dropped.
    df = pd.read_csv(path, usecols=wanted, skip_blank_lines=False, low_memory=False)
    lines = np.arange(len(df), dtype=np.int64) + 2
    blank = df.isna().all(axis=1).to_numpy()
    if blank.any():
        df, lines = df[~blank].reset_index(drop=True), lines[~blank]
    return {c: df[c] for c in wanted}, lines


def _read_jsonl(path: Path, wanted: list[str]) -> tuple[dict[str, pd.Series], np.ndarray]:
    cols: dict[str, list] = {c: [] for c in wanted}
    lines: list[int] = []
    with _open_text(path) as f:
        for lineno, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise ConfigError(f"trace {path}: line {lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"trace {path}: line {lineno}: expected a JSON object")
            for c in wanted:
                if c not in obj:
                    raise ConfigError(f"trace {path}: row {len(lines) + 1} (line {lineno}): missing "
                                      f"column {c!r}; keys: {list(obj)}")
                cols[c].append(obj[c])
            lines.append(lineno)
    import pandas as pd

    return {c: pd.Series(v, dtype=object) for c, v in cols.items()}, np.asarray(lines, np.int64)


def _where(path: Path, lines: np.ndarray, i: int, col: str) -> str:
    return f"trace {path}: row {i + 1} (line {int(lines[i])}), column {col!r}"


Raw = "pd.Series | np.ndarray"  # a column as read: pandas' cells, or _read_numeric's numbers


def _cell(raw: Raw, i: int) -> Any:
    return raw[i] if isinstance(raw, np.ndarray) else raw.iloc[i]


def _numbers(raw: Raw, col: str, path: Path, lines: np.ndarray) -> np.ndarray:
    if isinstance(raw, np.ndarray):  # _read_numeric's: int64 or finite float64
        return raw.astype(np.float64)
    import pandas as pd

    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        i = int(bad[0])
        v = raw.iloc[i]
        what = "missing value (NaN)" if missing_cell(v) else f"{show_cell(v)} is not a number"
        raise ConfigError(f"{_where(path, lines, i, col)}: {what}")
    return values


def _lengths(raw: Raw, col: str, path: Path, lines: np.ndarray, tokens: bool = True) -> np.ndarray:
    """A column of whole numbers >= 0 and <= MAX_LENGTH: token counts, or (tokens False) a
    priority."""
    values = _numbers(raw, col, path, lines)
    bad = np.flatnonzero((values < 0) | (values != np.floor(values)) | (values > MAX_LENGTH))
    if len(bad):
        i = int(bad[0])
        v = values[i]
        unit = " of tokens" if tokens else ""
        why = ("is negative" if v < 0 else (TOO_LONG if tokens else f"is above {MAX_LENGTH:,}")
               if v > MAX_LENGTH else f"is not a whole number{unit}")
        raise ConfigError(f"{_where(path, lines, i, col)}: {show_cell(_cell(raw, i))} {why}")
    return values.astype(np.int64)


def _timestamps(raw: Raw, col: str, unit: str, path: Path, lines: np.ndarray) -> np.ndarray:
    """Seconds relative to the earliest timestamp."""
    if unit == "datetime":
        import pandas as pd

        t = pd.to_datetime(raw, format="ISO8601", errors="coerce", utc=True)
        bad = np.flatnonzero(t.isna().to_numpy())
        if len(bad):
            i = int(bad[0])
            raise ConfigError(f"{_where(path, lines, i, col)}: unparseable timestamp "
                              f"{show_cell(raw.iloc[i])} (expected ISO 8601, e.g. "
                              f"2023-11-16 18:15:46.680590)")
        ns = t.to_numpy(dtype="datetime64[ns]").astype(np.int64)
        return (ns - ns.min()).astype(np.float64) / 1e9
    values = _numbers(raw, col, path, lines)
    return (values - values.min()) / TIMESTAMP_UNITS[unit]


def _hash_ids(raw: pd.Series, col: str, path: Path, lines: np.ndarray) -> list[list[int]]:
    rows = []
    for i, v in enumerate(raw):
        if isinstance(v, str):  # CSV cell: "[1, 2, 3]" or "1 2 3"
            text = v.strip()
            try:
                v = json.loads(text) if text.startswith("[") else [int(x) for x in
                                                                    text.replace(";", " ").split()]
            except ValueError:
                v = None
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                              for x in v):
            raise ConfigError(f"{_where(path, lines, i, col)}: expected a list of integer ids, "
                              f"got {show_cell(raw.iloc[i])}")
        rows.append(v)
    return rows


def _prefix(rows: list[list[int]], prompt: np.ndarray, block: int, col: str, path: Path,
            lines: np.ndarray, info: dict[str, Any]) -> ChunkIds:
    """ChunkIds from per-row hash id lists; rows covering only part of the prompt get fresh
    ids for the rest (counted), rows with more ids than chunks are an error."""
    ids = ChunkIds.from_lists(rows)
    need = num_chunks(prompt, block)
    over = np.flatnonzero(ids.counts > need)
    if len(over):
        i = int(over[0])
        raise ConfigError(f"{_where(path, lines, i, col)}: {ids.counts[i]} ids for a "
                          f"{prompt[i]}-token prompt, which has only {need[i]} chunks of {block}")
    short = np.flatnonzero(ids.counts < need)
    if len(short):
        info["hash_ids_padded"] = len(short)
        nxt = int(ids.flat.max()) + 1 if len(ids.flat) else 0
        padded = []
        for i in range(len(rows)):
            extra = int(need[i] - ids.counts[i])
            padded.append(list(rows[i]) + list(range(nxt, nxt + extra)))
            nxt += extra
        ids = ChunkIds.from_lists(padded)
    return ids


def _filter_mask(table: dict[str, pd.Series], spec: dict[str, Any]) -> np.ndarray:
    mask = np.ones(len(next(iter(table.values()))), dtype=bool)
    for col, value in spec.items():
        values = value if isinstance(value, list) else [value]
        s = table[col]
        mask &= (s.isin(values) | s.astype(str).isin([str(v) for v in values])).to_numpy()
    return mask


def read_trace(cfg: WorkloadConfig) -> tuple[RequestArrays, bool]:
    """Steps: 1. resolve the path and format; 2. read the needed columns; 3. filter rows;
    4. validate and convert (lengths, timestamps, ids); 5. drop failed / empty-prompt rows;
    6. sort by time (or reject). Returns (requests, has_timestamps); without timestamps the
    arrival column is all zeros and the caller draws arrivals."""
    path = resolve_path(cfg.trace, "trace")
    if path.stat().st_size == 0:
        raise ConfigError(f"trace {path}: empty file")
    fmt, numeric = _resolve_format(cfg, path)
    cols = dict(fmt.columns)
    filter_cols = list(cfg.filter or {})
    wanted = list(dict.fromkeys([*cols.values(), *filter_cols]))
    read = None
    if fmt.kind == "csv" and not cfg.filter and set(cols) <= _NUMERIC_FIELDS \
            and (cfg.timestamp_unit or fmt.timestamp_unit) != "datetime":
        read = _read_numeric(path, wanted, numeric)  # NOTE: no pandas for a plain CSV of numbers
    table, lines = read if read is not None else (_read_jsonl if fmt.kind == "jsonl"
                                                  else _read_csv)(path, wanted)
    info: dict[str, Any] = {"source": f"{path} ({fmt.name})", "rows_read": len(lines)}
    if len(lines) == 0:
        raise ConfigError(f"trace {path}: no data rows")
    if cfg.filter:
        mask = _filter_mask(table, cfg.filter)
        info["filtered_out"] = int((~mask).sum())
        if not mask.any():
            raise ConfigError(f"trace {path}: no rows match workload.filter {cfg.filter}")
        table = {c: s[mask].reset_index(drop=True) for c, s in table.items()}
        lines = lines[mask]
    prompt = _lengths(table[cols["prompt_tokens"]], cols["prompt_tokens"], path, lines)
    output = _lengths(table[cols["output_tokens"]], cols["output_tokens"], path, lines)
    has_time = fmt.timestamp_unit is not None and "timestamp" in cols
    if has_time:
        unit = cfg.timestamp_unit or fmt.timestamp_unit
        arrival = _timestamps(table[cols["timestamp"]], cols["timestamp"], unit, path, lines)
    else:
        arrival = np.zeros(len(prompt))
    n = len(prompt)
    cols_out: dict[str, Any] = {"priority": np.zeros(n, dtype=np.int64)}
    if "priority" in cols:
        cols_out["priority"] = _lengths(table[cols["priority"]], cols["priority"], path, lines, tokens=False)
    if "tenant" in cols:
        cols_out["tenant"] = table[cols["tenant"]].astype(str).to_numpy(dtype=str)
    if "session_id" in cols:
        import pandas as pd

        cols_out["session_id"] = pd.factorize(table[cols["session_id"]])[0].astype(np.int64)
    prefix, block = None, cfg.prefix_block_tokens
    if "hash_ids" in cols:
        block = fmt.hash_block_tokens or cfg.prefix_block_tokens
        prefix = _prefix(_hash_ids(table[cols["hash_ids"]], cols["hash_ids"], path, lines),
                         np.maximum(prompt, 1), block, cols["hash_ids"], path, lines, info)
    failed, empty = output == 0, prompt == 0
    if cfg.keep_failed:
        info["failed_kept"] = int((failed & ~empty).sum())
    else:
        info["dropped_failed"] = int(failed.sum())
    if empty.any():
        info["dropped_zero_prompt"] = int(empty.sum())
        i = int(np.flatnonzero(empty)[0])
        warnings.warn(f"{_where(path, lines, i, cols['prompt_tokens'])}: 0-token prompt; dropped "
                      f"{int(empty.sum())} such row(s)", stacklevel=3)
    idx = np.flatnonzero(~empty & ~(failed & (not cfg.keep_failed)))
    if not len(idx):
        raise ConfigError(f"trace {path}: no usable rows (all failed or with empty prompts)")
    if has_time:
        order = _check_sorted(arrival[idx], cfg, path, lines[idx], cols["timestamp"], info)
        if order is not None:
            idx = idx[order]
        arrival = arrival - arrival[idx[0]]
    work = RequestArrays(arrival[idx], np.maximum(prompt[idx], 1), np.maximum(output[idx], 1),
                         cols_out.pop("priority")[idx],
                         prefix=None if prefix is None else prefix.take(idx),
                         prefix_block_tokens=block, info=info,
                         **{k: v[idx] for k, v in cols_out.items()})
    return work, has_time


def _check_sorted(t: np.ndarray, cfg: WorkloadConfig, path: Path, lines: np.ndarray, col: str,
                  info: dict[str, Any]) -> np.ndarray | None:
    back = np.flatnonzero(np.diff(t) < 0)
    if not len(back):
        return None
    i = int(back[0]) + 1
    msg = (f"{_where(path, lines, i, col)}: timestamps are not sorted (this row is {t[i]:.6f} s "
           f"after the earliest timestamp, line {int(lines[i - 1])} {t[i - 1]:.6f} s; "
           f"{len(back)} backward step(s))")
    if cfg.on_unsorted == "error":
        raise ConfigError(msg + "; set workload.on_unsorted: sort to sort them")
    warnings.warn(msg + "; sorted by time (stable)", stacklevel=4)
    info["sorted_backward_steps"] = len(back)
    return np.argsort(t, kind="stable")


def load_workload(cfg: WorkloadConfig, seed_seq: np.random.SeedSequence) -> RequestArrays:
    """A trace as the workload. Steps: 1. read (read_trace); 2. lengths-only traces: first
    num_requests rows (file order), arrivals drawn from workload.arrival; 3. transforms."""
    arr_seed, transform_seed = seed_seq.spawn(2)
    try:
        work, has_time = read_trace(cfg)
    except (OSError, EOFError, UnicodeDecodeError) as e:  # not gzip, cut short, not UTF-8 text
        raise ConfigError(f"trace {cfg.trace}: cannot read ({e})") from None
    if not has_time:
        n = len(work) if cfg.num_requests is None else min(cfg.num_requests, len(work))
        spec = cfg.arrival
        rng = np.random.default_rng(arr_seed)
        if cfg.num_requests is None and cfg.duration_s is not None:
            arrival = ARRIVALS.get(spec["process"])(rng, spec, None, cfg.duration_s)[:n]
        else:
            arrival = ARRIVALS.get(spec["process"])(rng, spec, n, None)
        info = work.info
        work = work.take(np.arange(len(arrival)), arrival_s=arrival - arrival[0])
        work.info = info
    return apply_transforms(work, cfg, transform_seed)


# --- transforms ------------------------------------------------------------------------------
def mean_rate(arrival_s: np.ndarray) -> float:
    """Requests per second as 1 / mean inter-arrival gap = (n - 1) / (last - first)."""
    span = float(arrival_s[-1] - arrival_s[0]) if len(arrival_s) else 0.0
    return (len(arrival_s) - 1) / span if span > 0 else float("nan")


def apply_transforms(work: RequestArrays, cfg: WorkloadConfig,
                     seed_seq: np.random.SeedSequence) -> RequestArrays:
    """Reshape a workload. Steps, in order:
    1. window: keep arrivals in [window_start_s, window_start_s + duration_s) (duration_s
       bounds traces; for synthetic traffic it is a generation bound unless num_requests is set);
    2. num_requests: keep the first N;
    3. sample_n: keep N requests drawn uniformly without replacement, in time order;
    4. speedup k: inter-arrivals / k; target_rate r: k = r / mean rate; bursts keep their shape
       because every gap is scaled alike (the inter-arrival CV is unchanged);
    5. max_model_len L: prompt cut to at most L - 1 tokens, then output to L - prompt (counted;
       a clipped request's chunk ids are cut to its new prompt);
    and the first request is moved to t=0 after each step that drops requests.
    """
    info = dict(work.info)
    where = f"workload {cfg.trace or '(synthetic)'}"
    duration = cfg.duration_s if (cfg.trace is not None or cfg.num_requests is None) else None
    if cfg.window_start_s > 0 or duration is not None:
        t = work.arrival_s
        end = np.inf if duration is None else cfg.window_start_s + duration
        idx = np.flatnonzero((t >= cfg.window_start_s) & (t < end))
        if not len(idx):
            raise ConfigError(f"{where}: no requests in the window [{cfg.window_start_s}, {end}) s; "
                              f"the workload spans {t[-1]:.3f} s")
        if len(idx) < len(work):
            work = _rezero(work.take(idx))
            info["window"] = f"[{cfg.window_start_s}, {end}) s"
    if cfg.trace is not None and cfg.num_requests is not None and cfg.num_requests < len(work):
        work = work.take(np.arange(cfg.num_requests))
    if cfg.sample_n is not None and cfg.sample_n < len(work):
        rng = np.random.default_rng(seed_seq)
        idx = np.sort(rng.choice(len(work), size=cfg.sample_n, replace=False))
        info["sampled_from"] = len(work)
        work = _rezero(work.take(idx))
    if cfg.speedup is not None or cfg.target_rate is not None:
        rate = mean_rate(work.arrival_s)
        if not np.isfinite(rate):
            raise ConfigError(f"{where}: rate scaling needs >= 2 requests spread over time, "
                              f"got {len(work)}")
        k = cfg.speedup if cfg.speedup is not None else cfg.target_rate / rate
        work.arrival_s = work.arrival_s / k
        info["time_scale"] = 1.0 / k
    if cfg.max_model_len is not None:
        cap = cfg.max_model_len
        prompt = np.minimum(work.prompt_tokens, cap - 1)
        output = np.minimum(work.output_tokens, cap - prompt)
        clipped = (prompt != work.prompt_tokens) | (output != work.output_tokens)
        info["clipped_to_max_model_len"] = int(clipped.sum())
        if work.prefix is not None and clipped.any():
            # A clipped request keeps the ids of its (cut) prompt only: its answer no longer
            # follows the original text.
            block = work.prefix_block_tokens
            keep = np.where(clipped, num_chunks(prompt, block), num_chunks(prompt + output, block))
            if isinstance(work.prefix, ChunkIds):
                work.prefix = work.prefix.truncate(keep)
            else:
                work.prefix = [p[:k] for p, k in zip(work.prefix, keep)]
        work.prompt_tokens, work.output_tokens = prompt, output
    if len(work):
        work = _rezero(work)
    work.info = info
    return work


def _rezero(work: RequestArrays) -> RequestArrays:
    if len(work) and work.arrival_s[0] != 0:
        work.arrival_s = work.arrival_s - work.arrival_s[0]
    return work
