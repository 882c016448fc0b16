"""Workloads: columnar request arrays built from a trace file or seeded synthetic generators.

A `RequestArrays` holds one numpy column per field, so a million-request workload is a few
arrays, not a million objects; `Request` objects are made lazily at arrival time
(replica.feed_arrivals indexes the columns). `generate(cfg, seed_seq)` is the one entry point:
it replays `cfg.trace` (simulator/workload/traces.py) or runs the generators below, then applies the
transforms (window, sample, rate scaling, clipping).

Invariants of every RequestArrays:
- arrival_s: float64 seconds, non-decreasing, the first request at 0.0;
- prompt_tokens, output_tokens: int64 >= 1; priority: int64, lower = more urgent (vLLM);
- optional columns (None when absent): tenant, tier (str), session_id, turn (int64, -1 = none),
  slo_ttft_s, slo_tpot_s (float64, NaN = none).

Prefix identity (the contract with prefix caching):
- `prefix` is None (all prompt content unique) or a sequence with one int64 array per request
  (a `ChunkIds`, or a plain list) of content-chunk ids; chunk j covers tokens
  [j*B, (j+1)*B) of the request's token stream (prompt, then output) with B =
  `prefix_block_tokens` (512 by default, the block of Mooncake's hash_ids). A request has
  ceil(prompt_tokens / B) ids, or ceil((prompt_tokens + output_tokens) / B) when the ids also
  describe its answer (generated sessions do: the next turn resends it).
- Two requests with the same id at position j hold identical tokens wherever both cover that
  chunk; ids are chained (an id implies its whole prefix), so the shared prefix of two prompts
  is the longest run of equal leading ids. A last, partial chunk may carry the id of a full one
  (a session's turn k ends mid-chunk; turn k+1 fills it): only its first tokens are shared.

    turn 1 prompt+answer:  [ s0 | s1 | u0 | u1 | u2' ]             s* system prompt (shared)
    turn 2 prompt+answer:  [ s0 | s1 | u0 | u1 | u2 | u3 | u4' ]   u* this session's stream

- Generators build ids from streams: each session (or lone request) owns a stream of ids;
  the full chunks of a shared system prompt come first and repeat across its users (Zipf
  popularity); the chunk straddling system prompt and user text belongs to the stream.
  Requests outside sessions get ids for their prompt only.

Determinism: every stochastic piece draws from its own child of one SeedSequence(seed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.config.paths import data_dir
from simulator.config.registry import Registry
from simulator.config.workload import WorkloadConfig
from simulator.errors import ConfigError
from simulator.workload.arrowio import numpy_column

# Optional per-request columns and their fill value when a part of a concatenation lacks them.
OPTIONAL_COLUMNS = {"tenant": "", "tier": "", "session_id": -1, "turn": -1,
                    "slo_ttft_s": np.nan, "slo_tpot_s": np.nan}


class ChunkIds(Sequence):
    """Per-request content-chunk ids packed as one flat int64 array plus row offsets (CSR).

    `ids[i]` is a read-only view, so indexing a million requests allocates nothing up front.
    """

    __slots__ = ("flat", "offsets")

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        self.flat = np.asarray(flat, dtype=np.int64)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.flat.flags.writeable = False
        if len(self.offsets) == 0 or self.offsets[0] != 0 or self.offsets[-1] != len(self.flat):
            raise ValueError("ChunkIds: offsets must start at 0 and end at len(flat)")

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]]) -> ChunkIds:
        counts = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        flat = np.fromiter((x for r in rows for x in r), dtype=np.int64, count=int(counts.sum()))
        return cls(flat, np.concatenate([[0], np.cumsum(counts)]))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        return self.flat[self.offsets[i]:self.offsets[i + 1]]

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def take(self, idx: np.ndarray) -> ChunkIds:
        counts = self.counts[idx]
        offsets = np.concatenate([[0], np.cumsum(counts)])
        pos = np.repeat(self.offsets[:-1][idx] - offsets[:-1], counts) + np.arange(offsets[-1])
        return ChunkIds(self.flat[pos], offsets)

    def truncate(self, max_counts: np.ndarray) -> ChunkIds:
        """Keep at most max_counts[i] leading ids of row i."""
        counts = np.minimum(self.counts, max_counts)
        if np.array_equal(counts, self.counts):
            return self
        offsets = np.concatenate([[0], np.cumsum(counts)])
        pos = np.repeat(self.offsets[:-1] - offsets[:-1], counts) + np.arange(offsets[-1])
        return ChunkIds(self.flat[pos], offsets)

    @staticmethod
    def concat(parts: list[ChunkIds]) -> ChunkIds:
        """Concatenate rows; each part's ids are shifted so the parts never share an id."""
        flats, offsets, shift, base = [], [np.zeros(1, np.int64)], 0, 0
        for p in parts:
            flats.append(p.flat - (p.flat.min() if len(p.flat) else 0) + shift)
            offsets.append(p.offsets[1:] + base)
            shift += int(np.ptp(p.flat)) + 1 if len(p.flat) else 0
            base += len(p.flat)
        return ChunkIds(np.concatenate(flats) if flats else np.zeros(0, np.int64),
                        np.concatenate(offsets))


@dataclass(slots=True)
class RequestArrays:
    arrival_s: np.ndarray  # float64, non-decreasing, first request at 0
    prompt_tokens: np.ndarray  # int64 >= 1
    output_tokens: np.ndarray  # int64 >= 1
    priority: np.ndarray  # int64, lower = more urgent (vLLM)
    tenant: np.ndarray | None = None  # str, optional
    prefix: Sequence | None = None  # per-request content-chunk ids (module docstring), optional
    prefix_block_tokens: int = 512  # tokens per prefix chunk id
    tier: np.ndarray | None = None  # str, optional (e.g. "premium", "batch")
    session_id: np.ndarray | None = None  # int64, -1 = not in a session
    turn: np.ndarray | None = None  # int64, 0-based turn within the session, -1 = none
    slo_ttft_s: np.ndarray | None = None  # float64, NaN = no target
    slo_tpot_s: np.ndarray | None = None  # float64, NaN = no target
    info: dict[str, Any] = field(default_factory=dict)  # counts from loading (dropped, clipped, ...)

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("prompt_tokens", "output_tokens", "priority", "prefix", *OPTIONAL_COLUMNS):
            col = getattr(self, name)
            if col is not None and len(col) != n:
                raise ConfigError(f"workload: column {name} has {len(col)} rows, arrival_s has {n}")
        if n and np.any(np.diff(self.arrival_s) < 0):
            raise ConfigError("workload: arrival times must be non-decreasing")
        if n and (self.prompt_tokens.min() < 1 or self.output_tokens.min() < 1):
            raise ConfigError("workload: prompt and output lengths must be >= 1 token")

    def __len__(self) -> int:
        return len(self.arrival_s)

    def take(self, idx: np.ndarray, **updates: Any) -> RequestArrays:
        """Rows `idx` (in that order) of every column; `updates` replace columns afterwards."""
        cols = {name: (None if getattr(self, name) is None else getattr(self, name)[idx])
                for name in ("arrival_s", "prompt_tokens", "output_tokens", "priority",
                             *OPTIONAL_COLUMNS)}
        prefix = self.prefix
        if prefix is not None:
            prefix = prefix.take(idx) if isinstance(prefix, ChunkIds) else [prefix[i] for i in idx]
        cols.update(updates)
        return RequestArrays(**cols, prefix=prefix, prefix_block_tokens=self.prefix_block_tokens,
                             info=dict(self.info))

    @staticmethod
    def concat_sorted(parts: list[RequestArrays]) -> RequestArrays:
        """Merge parts into one workload ordered by arrival (stable: ties keep part order)."""
        cols: dict[str, Any] = {}
        for name in ("arrival_s", "prompt_tokens", "output_tokens", "priority"):
            cols[name] = np.concatenate([getattr(p, name) for p in parts])
        for name, fill in OPTIONAL_COLUMNS.items():
            if any(getattr(p, name) is not None for p in parts):
                cols[name] = np.concatenate([
                    getattr(p, name) if getattr(p, name) is not None else np.full(len(p), fill)
                    for p in parts])
        prefix = None
        if any(p.prefix is not None for p in parts):
            if len({p.prefix_block_tokens for p in parts}) > 1:
                raise ConfigError("workload: parts with different prefix_block_tokens cannot merge")
            prefix = ChunkIds.concat([p.prefix if isinstance(p.prefix, ChunkIds)
                                      else _unique_ids(p.prompt_tokens, p.prefix_block_tokens)
                                      if p.prefix is None else ChunkIds.from_lists(p.prefix)
                                      for p in parts])
        order = np.argsort(cols["arrival_s"], kind="stable")
        merged = RequestArrays(**{k: v[order] for k, v in cols.items()},
                               prefix=None if prefix is None else prefix.take(order),
                               prefix_block_tokens=parts[0].prefix_block_tokens)
        for p in parts:
            for k, v in p.info.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    merged.info[k] = merged.info.get(k, 0) + v
        return merged


def num_chunks(prompt_tokens: np.ndarray, block_tokens: int) -> np.ndarray:
    return -(-np.asarray(prompt_tokens, dtype=np.int64) // block_tokens)


def _unique_ids(prompt_tokens: np.ndarray, block_tokens: int) -> ChunkIds:
    counts = num_chunks(prompt_tokens, block_tokens)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return ChunkIds(np.arange(offsets[-1], dtype=np.int64), offsets)


# --- arrival processes -----------------------------------------------------------------------
# f(rng, spec, n, duration_s) -> sorted event times from t=0: exactly n of them when n is set,
# else every event in [0, duration_s). Specs arrive validated, defaults filled
# (workload_config.ARRIVAL_PARAMS).
ArrivalFn = Callable[[np.random.Generator, dict[str, Any], int | None, float | None], np.ndarray]
LengthFn = Callable[[np.random.Generator, dict[str, Any], int], np.ndarray]

ARRIVALS: Registry[ArrivalFn] = Registry("arrival process")
LENGTHS: Registry[LengthFn] = Registry("length distribution")


def _renewal(draw: Callable[[int], np.ndarray], mean_gap: float, n: int | None,
             duration_s: float | None) -> np.ndarray:
    """Renewal process with the first event at t=0: cumulative sums of gaps from `draw`."""
    if n is not None:
        gaps = draw(n)
        gaps[0] = 0.0
        return np.cumsum(gaps)
    expected = duration_s / mean_gap
    gaps = draw(int(expected * 1.2 + 10 * math.sqrt(expected) + 10))
    gaps[0] = 0.0
    times = np.cumsum(gaps)
    while times[-1] < duration_s:  # rare: heavy-tailed gaps ran short of the horizon
        more = np.cumsum(draw(int(expected * 0.2 + 10 * math.sqrt(expected) + 10))) + times[-1]
        times = np.concatenate([times, more])
    return times[times < duration_s]


@ARRIVALS.register("poisson")
def poisson_arrivals(rng, spec, n, duration_s):
    """Exponential inter-arrivals at `rate` req/s."""
    rate = spec["rate"]
    return _renewal(lambda k: rng.exponential(1.0 / rate, size=k), 1.0 / rate, n, duration_s)


@ARRIVALS.register("gamma")
def gamma_arrivals(rng, spec, n, duration_s):
    """Gamma inter-arrivals with mean 1/rate and coefficient of variation `cv` (shape 1/cv^2).

    cv > 1 is burstier than Poisson (BurstGPT fits a Gamma), cv < 1 more regular.
    """
    rate, cv = float(spec["rate"]), float(spec["cv"])
    shape = 1.0 / (cv * cv)
    return _renewal(lambda k: rng.gamma(shape, 1.0 / (rate * shape), size=k), 1.0 / rate,
                    n, duration_s)


def _nhpp(rng: np.random.Generator, cumulative: Callable[[float], tuple[np.ndarray, np.ndarray]],
          mean_rate: float, n: int | None, duration_s: float | None,
          exact: tuple[Callable, Callable] | None = None) -> np.ndarray:
    """Non-homogeneous Poisson process by time rescaling.

    1. Unit-rate Poisson event "masses" E_1 < E_2 < ... (cumulated exponentials).
    2. `cumulative(T)` gives a grid t_0..t_m covering [0, T] and Lambda(t_k), the integral of
       the rate; linear interpolation is exact for piecewise-linear Lambda.
    3. t_i = Lambda^-1(E_i) by interpolation (the horizon doubles until Lambda covers the
       masses); with `exact` = (Lambda, rate) functions, three Newton steps inside the grid
       cell refine smooth Lambdas to machine precision.
    """
    if n is not None:
        masses = np.cumsum(rng.exponential(1.0, size=n))
        horizon = masses[-1] / mean_rate * 1.1 + 1.0
        t, lam = cumulative(horizon)
        for _ in range(64):
            if lam[-1] >= masses[-1]:
                break
            horizon *= 2
            t, lam = cumulative(horizon)
        else:
            raise ConfigError(f"arrival process: the rate integrates to only {lam[-1]:.0f} requests "
                              f"over any horizon, fewer than num_requests={n}; bound it by duration_s")
    else:
        t, lam = cumulative(duration_s)
        total = float(np.interp(duration_s, t, lam))
        masses = np.cumsum(rng.exponential(1.0, size=int(total * 1.2 + 10 * math.sqrt(total) + 10)))
        while masses[-1] < total:  # rare: extend until the masses cover Lambda(duration)
            masses = np.concatenate([masses, masses[-1] + np.cumsum(rng.exponential(1.0, size=1000))])
        masses = masses[masses < total]
    times = np.interp(masses, lam, t)
    if exact is not None and len(times):
        lam_fn, rate_fn = exact
        k = np.searchsorted(lam, masses).clip(1, len(t) - 1)
        lo, hi = t[k - 1], t[k]
        for _ in range(3):
            step = (lam_fn(times) - masses) / np.maximum(rate_fn(times), 1e-12)
            times = np.clip(times - step, lo, hi)
    return np.maximum.accumulate(times)


@ARRIVALS.register("onoff")
def onoff_arrivals(rng, spec, n, duration_s):
    """Bursts: Poisson at `rate_on` for on_s seconds, then `rate_off` (default 0) for off_s.

    periods: fixed (strict alternation, starting "on" at t=0) or exponential (period lengths
    drawn with those means: a two-state Markov-modulated Poisson process).
    """
    on_s, off_s, r_on, r_off = spec["on_s"], spec["off_s"], spec["rate_on"], spec["rate_off"]
    mean_rate = (r_on * on_s + r_off * off_s) / (on_s + off_s)
    period_rng = np.random.default_rng(rng.integers(2**63))
    periods = np.zeros(0)  # alternating on/off lengths, grown on demand (same draws each call)

    def cumulative(horizon: float):
        nonlocal periods
        while periods.sum() < horizon:
            k = int((horizon - periods.sum()) / (on_s + off_s)) + 2
            if spec["periods"] == "fixed":
                more = np.tile([on_s, off_s], k)
            else:
                more = np.column_stack([period_rng.exponential(on_s, k),
                                        period_rng.exponential(off_s, k)]).ravel()
            periods = np.concatenate([periods, more])
        rates = np.tile([r_on, r_off], len(periods) // 2)
        return (np.concatenate([[0.0], np.cumsum(periods)]),
                np.concatenate([[0.0], np.cumsum(periods * rates)]))

    return _nhpp(rng, cumulative, mean_rate, n, duration_s)


@ARRIVALS.register("diurnal")
def diurnal_arrivals(rng, spec, n, duration_s):
    """Sinusoidal rate: mean_rate * (1 + amplitude * sin(2 pi (t - phase_s) / period_s))."""
    m, a, p, phi = spec["mean_rate"], spec["amplitude"], spec["period_s"], spec["phase_s"]
    w = 2 * np.pi / p

    def lam_fn(t):
        return m * t + m * a / w * (np.cos(-w * phi) - np.cos(w * (t - phi)))

    def rate_fn(t):
        return m * (1 + a * np.sin(w * (t - phi)))

    def cumulative(horizon: float):
        t = np.linspace(0.0, horizon, int(min(horizon / p * 64, 1e6)) + 65)
        return t, np.maximum.accumulate(lam_fn(t))

    return _nhpp(rng, cumulative, m, n, duration_s, exact=(lam_fn, rate_fn))


@ARRIVALS.register("ramp")
def ramp_arrivals(rng, spec, n, duration_s):
    """Rate moving linearly from start_rate to end_rate over ramp_s seconds, then flat."""
    r0, r1, ramp_s = spec["start_rate"], spec["end_rate"], spec["ramp_s"]

    def lam_fn(t):
        u = np.minimum(t, ramp_s)
        return r0 * u + (r1 - r0) * u * u / (2 * ramp_s) + r1 * np.maximum(t - ramp_s, 0.0)

    def rate_fn(t):
        return np.where(t < ramp_s, r0 + (r1 - r0) * np.minimum(t, ramp_s) / ramp_s, r1)

    def cumulative(horizon: float):
        t = np.linspace(0.0, ramp_s, 257)
        if horizon > ramp_s:  # flat part: Lambda is linear there, one more point is exact
            t = np.append(t, horizon)
        return t, lam_fn(t)

    return _nhpp(rng, cumulative, max(r1, (r0 + r1) / 2), n, duration_s, exact=(lam_fn, rate_fn))


# --- length distributions --------------------------------------------------------------------
@LENGTHS.register("constant")
def constant_lengths(rng, spec, n):
    return np.full(n, float(spec["value"]), dtype=np.float64)


@LENGTHS.register("uniform")
def uniform_lengths(rng, spec, n):
    """Integers uniform on [low, high]."""
    return rng.integers(int(spec["low"]), int(spec["high"]) + 1, size=n).astype(np.float64)


@LENGTHS.register("lognormal")
def lognormal_lengths(rng, spec, n):
    """Lognormal with the given mean and coefficient of variation (std / mean)."""
    mean, cv = float(spec["mean"]), float(spec["cv"])  # (a huge int's square is no float)
    sigma2 = np.log1p(cv * cv)
    mu = np.log(mean) - sigma2 / 2
    return rng.lognormal(mu, np.sqrt(sigma2), size=n)


@LENGTHS.register("zipf")
def zipf_lengths(rng, spec, n):
    """Bounded Zipf on the integers [low, high]: P(k) proportional to k^-s (inverse CDF)."""
    k = np.arange(spec["low"], spec["high"] + 1, dtype=np.float64)
    cdf = np.cumsum(k ** -float(spec["s"]))
    return k[np.searchsorted(cdf / cdf[-1], rng.random(n), side="right").clip(max=len(k) - 1)]


@LENGTHS.register("empirical")
def empirical_lengths(rng, spec, n):
    """Values drawn with replacement from one column of a CSV/JSONL file."""
    values = load_column(spec["file"], spec["column"])
    return values[rng.integers(0, len(values), size=n)]


def sample_values(rng: np.random.Generator, spec: dict[str, Any], n: int, where: str, *,
                  integer: bool = True, default_min: float = 1) -> np.ndarray:
    """Draw n values from a validated distribution spec, clipped to [min, max]."""
    values = LENGTHS.get(spec["dist"])(rng, spec, n)
    lo = spec.get("min", default_min)
    hi = spec.get("max")
    if integer and lo < 1:
        raise ConfigError(f"{where}.min must be >= 1 token, got {lo}")
    out = np.maximum(np.rint(values) if integer else values, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return out.astype(np.int64) if integer else out


def sample_lengths(rng: np.random.Generator, spec: dict[str, Any], n: int, where: str) -> np.ndarray:
    return sample_values(rng, spec, n, where)


def packaged_workloads_dir() -> Path:
    """workloads/ of a source checkout, else the installed simulator.workloads package."""
    return data_dir("workloads")


def resolve_path(path: str | Path, what: str) -> Path:
    """A user path: as given (absolute or relative to the CWD), else in the packaged workloads/
    (so `trace: sample_trace.csv` or `workloads/sample_trace.csv` work from anywhere)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if not p.is_absolute():
        base = packaged_workloads_dir()
        for q in (base / p, base / p.name if p.parent == Path("workloads") else None):
            if q is not None and q.is_file():
                return q
    if p.is_dir():
        raise ConfigError(f"{what} {path}: is a folder; give the file")
    raise ConfigError(f"{what} {path}: not found (looked in the current directory and in "
                      f"{packaged_workloads_dir()})")


def read_numeric_csv(path: Path) -> dict[str, np.ndarray] | None:
    """The columns of a plain CSV file of numbers as pandas.read_csv reads them (int64, or
    float64: both parsers round a decimal to the nearest double), read by pyarrow: a run
    that reads a trace needs no pandas (~0.45 s of CPU to import). None when the file is not
    one this vouches for, so that pandas reads it (and reports what is wrong as before):
    gzip, a byte-order mark, a CR not ending a line, a blank line or a quoted newline (the rows would
    not be the lines after the header), a duplicate or empty header name, no data rows, a
    column that is not all integers or all finite floats, a missing value."""
    if path.suffix == ".gz":
        return None
    data = path.read_bytes()
    if not data or data.startswith(b"\xef\xbb\xbf") or data.count(b"\r") != data.count(b"\r\n"):
        return None
    import pyarrow as pa
    import pyarrow.csv as pcsv

    try:
        table = pcsv.read_csv(pa.BufferReader(data))
    except (pa.ArrowException, ValueError):
        return None
    names = table.column_names
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
    if not table.num_rows or table.num_rows != lines - 1 or len(set(names)) != len(names) \
            or not all(names):
        return None
    cols = {}
    for name, col in zip(names, table.columns):
        if col.null_count or not (pa.types.is_int64(col.type) or pa.types.is_float64(col.type)):
            return None
        values = numpy_column(col)  # NOTE: not col.to_numpy(), which imports pandas
        if values.dtype.kind == "f" and not np.isfinite(values).all():
            return None
        cols[name] = values
    return cols


def _read_table(path: Path, what: str) -> dict[str, np.ndarray]:
    """The file's columns as numpy arrays, by name: a plain numeric CSV as read_numeric_csv reads
    it, anything else as pandas reads it (each column's `Series.to_numpy()`: numbers, or objects
    to coerce); an empty file, one pandas cannot read and one with no rows are one-line errors."""
    if path.stat().st_size == 0:
        raise ConfigError(f"{what} {path}: empty file")
    is_json = _is_jsonl(path)
    if not is_json:
        cols = read_numeric_csv(path)
        if cols is not None:
            return cols
    import pandas as pd

    try:
        df = pd.read_json(path, lines=True) if is_json else pd.read_csv(path)
    except (pd.errors.EmptyDataError, pd.errors.ParserError, ValueError, OSError, EOFError) as e:
        raise ConfigError(f"{what} {path}: cannot read ({e})") from None
    if df.empty:
        raise ConfigError(f"{what} {path}: no rows")
    return {name: df[name].to_numpy() for name in df.columns}


MAX_LENGTH = 2**31 - 1  # the longest prompt or output kvsim reads (int64 casts of more wrap around)


def missing_cell(value: Any) -> bool:
    """Whether a raw cell is empty (None, or pandas' NaN for it)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


TOO_LONG = f"is above {MAX_LENGTH:,} tokens (the longest length kvsim reads)"


def _is_jsonl(path: Path) -> bool:
    return path.suffix in (".jsonl", ".ndjson") or path.name.endswith((".jsonl.gz", ".ndjson.gz"))


def show_cell(value: Any) -> str:
    """A raw cell as the user wrote it, for an error message: numpy scalars as plain numbers
    (-5, not np.int64(-5)), text quoted."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _length_column(cols: dict[str, np.ndarray], col: str, path: Path, what: str,
                   whole: bool = False) -> np.ndarray:
    """Column `col` as float64 lengths, each >= 1 (and `whole`: a whole number of tokens):
    numbers as they are, anything else through pandas.to_numeric (a cell that is not a number
    is NaN, so an error naming it)."""
    if col not in cols:
        raise ConfigError(f"{what} {path}: missing column {col!r}; columns: {list(cols)}")
    raw = cols[col]
    if raw.dtype.kind in "iuf":  # read_numeric_csv's int64 / float64, or a numeric pandas column
        values = raw.astype(np.float64)
    else:
        import pandas as pd

        values = np.asarray(pd.to_numeric(raw, errors="coerce"), dtype=np.float64)
    wrong = ~np.isfinite(values) | (values < 1) | (values > MAX_LENGTH)
    if whole:
        wrong |= values != np.floor(values)
    bad = np.flatnonzero(wrong)
    if len(bad):
        row = int(bad[0])
        cell = raw[row]
        v = values[row]
        if missing_cell(cell):
            problem = "missing value (NaN)"
        elif v > MAX_LENGTH and np.isfinite(v):
            problem = f"{show_cell(cell)} {TOO_LONG}"
        else:
            why = "is not a whole number of tokens" if whole and v >= 1 else "is not a length >= 1"
            problem = f"{show_cell(cell)} {why}"
        line = row + (1 if _is_jsonl(path) else 2)  # (a CSV's first line is its header)
        raise ConfigError(f"{what} {path}: row {row + 1} (line {line}), column {col!r}: {problem}")
    return values


def load_column(path: str | Path, column: str) -> np.ndarray:
    p = resolve_path(path, "lengths file")
    return _length_column(_read_table(p, "lengths file"), column, p, "lengths file")


def load_lengths_file(path: str | Path, prompt_col: str, output_col: str) -> tuple[np.ndarray, np.ndarray]:
    p = resolve_path(path, "lengths file")
    cols = _read_table(p, "lengths file")
    return (_length_column(cols, prompt_col, p, "lengths file", whole=True).astype(np.int64),
            _length_column(cols, output_col, p, "lengths file", whole=True).astype(np.int64))


# --- synthetic traffic -----------------------------------------------------------------------
def _zipf_choice(rng: np.random.Generator, count: int, s: float, n: int) -> np.ndarray:
    """n draws of ranks 0..count-1 with P(rank r) proportional to (r+1)^-s (s=0: uniform)."""
    cdf = np.cumsum(np.arange(1, count + 1, dtype=np.float64) ** -s)
    return np.searchsorted(cdf / cdf[-1], rng.random(n), side="right").clip(max=count - 1)


def _stream_ids(stream: np.ndarray, covered: np.ndarray, sys_idx: np.ndarray,
                sys_tokens: np.ndarray, block: int) -> ChunkIds:
    """Chunk ids from streams (module docstring): system-prompt chunks, then stream chunks.
    `covered[r]` is how many tokens of its stream request r describes (prompt, + output).

    1. system prompt p owns floor(tokens_p / block) ids, numbered first;
    2. stream s owns max over its requests of ceil(covered / block) ids, numbered next;
    3. chunk j of request r is the system prompt's j-th id while j is inside its full chunks,
       else its stream's j-th id.
    """
    sys_full = sys_tokens // block
    sys_base = np.concatenate([[0], np.cumsum(sys_full)])
    counts = num_chunks(covered, block)
    num_streams = int(stream.max()) + 1 if len(stream) else 0
    stream_len = np.zeros(num_streams, dtype=np.int64)
    np.maximum.at(stream_len, stream, counts)
    stream_base = sys_base[-1] + np.concatenate([[0], np.cumsum(stream_len)])[:-1]
    offsets = np.concatenate([[0], np.cumsum(counts)])
    j = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
    has_sys = sys_idx >= 0
    req_sys_full = np.where(has_sys, sys_full[np.maximum(sys_idx, 0)] if len(sys_full) else 0, 0)
    req_sys_base = np.where(has_sys, sys_base[np.maximum(sys_idx, 0)], 0)
    in_sys = j < np.repeat(req_sys_full, counts)
    ids = np.where(in_sys, np.repeat(req_sys_base, counts) + j,
                   np.repeat(stream_base[stream], counts) + j)
    return ChunkIds(ids, offsets)


def _synthetic_stream(spec: dict[str, Any], cfg: WorkloadConfig, n: int | None,
                      duration_s: float | None, seed_seq: np.random.SeedSequence,
                      with_prefix: bool, lengths_file: str | None = None) -> RequestArrays:
    """One tenant's (or the single) traffic. Steps:
    1. arrivals: request arrivals, or session starts when `sessions` is set;
    2. sessions: turns per session, turn gaps = think times, prompt of turn k = system prompt +
       earlier turns' new tokens and outputs + this turn's new tokens (`prompt_tokens`);
    3. system prompts: each session (or lone request) picks one by Zipf popularity and its
       length is added in front of the prompt;
    4. prefix chunk ids from the streams (only when some part of the workload shares content).
    """
    # The first three children keep the first version's streams (same default workload).
    arr_seed, prompt_seed, output_seed = seed_seq.spawn(3)
    turns_seed, think_seed, sys_seed = seed_seq.spawn(3)
    arr_rng = np.random.default_rng(arr_seed)
    process = ARRIVALS.get(spec["arrival"]["process"])
    sessions = spec.get("sessions")
    if sessions is None:
        starts = process(arr_rng, spec["arrival"], n, None if n is not None else duration_s)
        turns = np.ones(len(starts), dtype=np.int64)
    else:
        turns_rng = np.random.default_rng(turns_seed)
        if n is not None:  # enough sessions for n requests
            turns = np.zeros(0, dtype=np.int64)
            while turns.sum() < n:
                turns = np.concatenate([turns, sample_values(turns_rng, sessions["turns"],
                                                             max(n // 4, 16), "sessions.turns")])
            turns = turns[: int(np.searchsorted(np.cumsum(turns), n)) + 1]
            starts = process(arr_rng, spec["arrival"], len(turns), None)
        else:
            starts = process(arr_rng, spec["arrival"], None, duration_s)
            turns = sample_values(turns_rng, sessions["turns"], len(starts), "sessions.turns")
    num_sessions, total = len(starts), int(turns.sum())
    session = np.repeat(np.arange(num_sessions), turns)
    first = np.concatenate([[0], np.cumsum(turns)[:-1]])  # index of each session's first turn
    turn = np.arange(total) - np.repeat(first, turns)
    if lengths_file:
        prompts, outputs = load_lengths_file(lengths_file, cfg.prompt_column, cfg.output_column)
        rows = np.random.default_rng(prompt_seed).integers(0, len(prompts), size=total)
        new, output = prompts[rows], outputs[rows]
    else:
        new = sample_lengths(np.random.default_rng(prompt_seed), spec["prompt_tokens"], total,
                             "prompt_tokens")
        output = sample_lengths(np.random.default_rng(output_seed), spec["output_tokens"], total,
                                "output_tokens")
    arrival = starts[session].astype(np.float64)
    prompt = new.copy()
    if sessions is not None:
        gaps = sample_values(np.random.default_rng(think_seed), sessions["think_time_s"], total,
                             "sessions.think_time_s", integer=False, default_min=0.0)
        gaps[first] = 0.0
        arrival = arrival + _group_cumsum(gaps, first, turns)
        history = _group_cumsum(new + output, first, turns) - (new + output)
        prompt = new + history
    sys_idx = np.full(num_sessions, -1, dtype=np.int64)
    sys_tokens = np.zeros(0, dtype=np.int64)
    if spec.get("system_prompts") is not None:
        sp = spec["system_prompts"]
        sys_rng = np.random.default_rng(sys_seed)
        sys_tokens = sample_lengths(sys_rng, sp["tokens"], sp["count"], "system_prompts.tokens")
        sys_idx = _zipf_choice(sys_rng, sp["count"], sp["zipf_s"], num_sessions)
        prompt = prompt + sys_tokens[sys_idx][session]
    order = np.argsort(arrival, kind="stable")
    if n is not None:
        order = order[:n]
    else:
        order = order[arrival[order] < duration_s]
    prefix = None
    if with_prefix:
        # A session's next turn resends this turn's answer: its ids describe the output too.
        covered = prompt + output if sessions is not None else prompt
        prefix = _stream_ids(session, covered, sys_idx[session], sys_tokens,
                             cfg.prefix_block_tokens).take(order)
    out = RequestArrays(arrival[order], prompt[order], output[order],
                        np.full(len(order), spec.get("priority", 0), dtype=np.int64),
                        prefix=prefix, prefix_block_tokens=cfg.prefix_block_tokens)
    if sessions is not None:
        out.session_id, out.turn = session[order], turn[order]
    return out


def _group_cumsum(values: np.ndarray, first: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Inclusive cumulative sum restarted at each group (groups are contiguous runs)."""
    c = np.cumsum(values)
    before = np.concatenate([[0], c])[first]
    return c - np.repeat(before, sizes)


def _synthetic(cfg: WorkloadConfig, seed_seq: np.random.SeedSequence) -> RequestArrays:
    n, duration = cfg.num_requests, (None if cfg.num_requests is not None else cfg.duration_s)
    base = {"arrival": cfg.arrival, "prompt_tokens": cfg.prompt_tokens,
            "output_tokens": cfg.output_tokens, "sessions": cfg.sessions,
            "system_prompts": cfg.system_prompts}
    if cfg.tenants is None:
        with_prefix = cfg.sessions is not None or cfg.system_prompts is not None
        return _synthetic_stream(base, cfg, n, duration, seed_seq, with_prefix, cfg.lengths_file)
    with_prefix = any(t.get("sessions") or t.get("system_prompts") for t in cfg.tenants)
    parts = []
    for t, child in zip(cfg.tenants, seed_seq.spawn(len(cfg.tenants))):
        # Each tenant makes up to n requests; the merge keeps the first n overall.
        part = _synthetic_stream(t, cfg, n, duration, child, with_prefix)
        k = len(part)
        part.tenant = np.full(k, t["name"])
        part.tier = np.full(k, t.get("tier", ""))
        part.slo_ttft_s = np.full(k, t.get("slo_ttft_s", np.nan), dtype=np.float64)
        part.slo_tpot_s = np.full(k, t.get("slo_tpot_s", np.nan), dtype=np.float64)
        if part.session_id is not None:
            part.session_id = np.where(part.session_id >= 0,
                                       part.session_id + 1_000_000_000 * len(parts), -1)
        parts.append(part)
    merged = RequestArrays.concat_sorted(parts)
    return merged if n is None else merged.take(np.arange(min(n, len(merged))))
