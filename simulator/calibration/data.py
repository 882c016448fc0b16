"""Reading measured kernel timings in Vidur's profiling layout (../shared/data/kernels, or what
`kvsim profile` writes), and deciding which catalogue GPU each data folder measured:

    <profiles>/compute/<gpu>/<org>/<model>/mlp.csv        per-layer operators, per TP shard
    <profiles>/compute/<gpu>/<org>/<model>/attention.csv  optional (kvsim profile)
    <profiles>/network/<topology>/all_reduce.csv          optional; else send_recv.csv

mlp.csv has one row per (num_tokens, num_tensor_parallel_workers) with columns
`time_stats.<op>.{min,max,mean,median,std}` in milliseconds and the architecture (n_head,
n_kv_head, n_embd, n_expanded_embd, use_gated_mlp). The median is used; weights are fp16.

Invariants: values come back in seconds; bad input raises ConfigError naming the file, column
and value; nothing here fits or writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.engine.costmodel import GEMM_OPS, LAYER_OPS, ShardDims
from simulator.errors import ConfigError, did_you_mean
from simulator.hardware.gpus import get_gpu
from simulator.hardware.models import ALIASES, CATALOGUE

ALL_OPS = (*LAYER_OPS, "emb")
ARCH_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp")
INDEX_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")
STAT = "median"


@dataclass(frozen=True)
class DataFolder:
    """Which catalogue GPU a data folder measured, which network topology goes with it, and the
    data set's name as a person would cite it (run output prints it)."""

    gpu: str
    network: str | None
    reason: str
    dataset: str


# Decision (docs/costmodel.md, "Which GPU is each data folder"): Vidur's device SKUs are
# a100 = 312 TFLOPS / 80 GB, h100 = 80 GB SXM (DGX), a40 = 45 GB. The data agree: at one
# token the big GEMMs stream weights at ~1.6 TB/s on "a100" (above 0.8 x 1,555 GB/s of the
# 40 GB part, plausible for the 80 GB part's 2,039 GB/s) and ~2.65 TB/s on "h100" (above the
# PCIe card's ~2,000 GB/s peak). TP all-reduces run inside one node, so the DGX topologies
# (NVSwitch) go with the SXM parts; the a40 machine has only send_recv measurements.
KNOWN_FOLDERS = {
    "a100": DataFolder("a100-80gb", "a100_dgx",
                       "Vidur a100 SKU is 312 TFLOPS / 80 GB; T=1 GEMMs stream weights at ~1.6 TB/s, "
                       "only the 80 GB part (2,039 GB/s) reaches that; network: DGX A100 (NVSwitch)",
                       "Vidur's A100 kernel timings"),
    "a40": DataFolder("a40", "a40_pairwise_nvlink",
                      "Vidur a40 SKU (150 TFLOPS / 45 GB); network: only send_recv was measured",
                      "Vidur's A40 kernel timings"),
    "h100": DataFolder("h100-sxm", "h100_dgx",
                       "Vidur h100 SKU is 80 GB in a DGX node; T=1 GEMMs stream weights at ~2.65 TB/s, "
                       "above H100 PCIe's ~2,000 GB/s peak; network: DGX H100 (NVSwitch)",
                       "Vidur's H100 kernel timings"),
}


# --- reading ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelTimings:
    """Measured per-operator seconds of one model directory, one entry per CSV row."""

    name: str  # "<org>/<model>" as in the directory
    path: Path
    tokens: np.ndarray
    tp: np.ndarray
    dims: ShardDims
    ops: dict[str, np.ndarray]  # op -> seconds, NaN where not measured

    def layer_ops(self) -> list[str]:
        return [op for op in LAYER_OPS if op in self.ops]

    def layer_sum(self) -> np.ndarray:
        return sum((self.ops[op] for op in self.layer_ops()), np.zeros(len(self.tokens)))


def _numeric(df: pd.DataFrame, col: str, path: Path) -> np.ndarray:
    values = pd.to_numeric(df[col], errors="coerce")
    bad = values.isna() & df[col].notna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise ConfigError(f"{path}: column {col!r} row {i + 2}: not a number: {df[col].iloc[i]!r}")
    return values.to_numpy(dtype=np.float64)


def _read_csv(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        raise ConfigError(f"{path}: empty file (no header, no rows)") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not a readable CSV ({str(e).splitlines()[0]})") from None
    if df.empty:
        raise ConfigError(f"{path}: empty file (a header but no rows)")
    return df


def _catalogue_arch(name: str) -> dict[str, float] | None:
    """Architecture columns for a model directory name from the model catalogue, if known."""
    lowered = {k.lower(): v for k, v in CATALOGUE.items()}
    spec = lowered.get(name.lower()) or CATALOGUE.get(ALIASES.get(name.split("/")[-1].lower(), ""))
    if spec is None:
        return None
    return {"n_head": spec.num_heads, "n_kv_head": spec.num_kv_heads, "n_embd": spec.hidden_size,
            "n_expanded_embd": spec.intermediate_size, "use_gated_mlp": float(spec.gated_mlp),
            "head_dim": spec.head_dim}


def read_mlp_csv(path: str | Path, name: str | None = None) -> ModelTimings:
    """Read one mlp.csv. Steps:
    1. parse; an empty file is an error;
    2. the index columns and the four GEMM ops' median columns are required;
    3. architecture from the file's columns, else from the catalogue by directory name;
    4. every value numeric, times > 0 (an element-wise op may be absent: NaN, e.g. phi-2 has no
       post_attention_layernorm), ms -> s."""
    path = Path(path)
    name = name or f"{path.parent.parent.name}/{path.parent.name}"
    df = _read_csv(path)
    required = [*INDEX_COLUMNS, *(f"time_stats.{op}.{STAT}" for op in GEMM_OPS)]
    for col in required:
        if col not in df.columns:
            hint = did_you_mean(col, list(df.columns))
            raise ConfigError(f"{path}: missing column {col!r}{hint} (Vidur profiling layout, see "
                              f"docs/costmodel.md)")
    tokens = _numeric(df, "num_tokens", path)
    tp = _numeric(df, "num_tensor_parallel_workers", path)
    for col, v in (("num_tokens", tokens), ("num_tensor_parallel_workers", tp)):
        bad = ~(v >= 1) | (v != np.round(v))
        if bad.any():
            raise ConfigError(f"{path}: column {col!r} must hold integers >= 1, got {float(v[bad][0]):g}")
    missing_arch = [c for c in ARCH_COLUMNS if c not in df.columns]
    if missing_arch:
        arch = _catalogue_arch(name)
        if arch is None:
            raise ConfigError(
                f"{path}: no matching architecture for model directory {name!r}: the file lacks "
                f"columns {missing_arch} and {name!r} is not a catalogue model "
                f"(e.g. {', '.join(sorted(CATALOGUE)[:3])}, ...); add the architecture columns")
        cols = {k: np.full(len(df), float(v)) for k, v in arch.items()}
    else:
        cols = {c: _numeric(df, c, path) if c != "use_gated_mlp" else
                df[c].astype(str).str.lower().isin(["true", "1", "1.0"]).to_numpy(dtype=np.float64)
                for c in ARCH_COLUMNS}
        for c in ARCH_COLUMNS[:4]:
            bad = ~(cols[c] >= 1)
            if bad.any():
                raise ConfigError(f"{path}: column {c!r} must be >= 1, got {float(cols[c][bad][0]):g}")
        cols["head_dim"] = cols["n_embd"] / cols["n_head"]
        if (cols["head_dim"] != np.round(cols["head_dim"])).any():
            raise ConfigError(f"{path}: n_embd {cols['n_embd'][0]:g} is not a multiple of "
                              f"n_head {cols['n_head'][0]:g}")
    hd = cols["head_dim"]
    dims = ShardDims(hidden=cols["n_embd"], q=cols["n_head"] * hd / tp,
                     kv=np.maximum(1.0, np.ceil(cols["n_kv_head"] / tp)) * hd,
                     ffn=cols["n_expanded_embd"] / tp, gated=cols["use_gated_mlp"], dtype_bytes=2.0)
    ops: dict[str, np.ndarray] = {}
    for op in ALL_OPS:
        col = f"time_stats.{op}.{STAT}"
        if col not in df.columns:
            continue
        ms = _numeric(df, col, path)
        bad = ~(ms > 0) & ~np.isnan(ms)
        if bad.any() or (op in GEMM_OPS and np.isnan(ms).any()):
            value = f"{float(ms[bad][0]):g}" if bad.any() else "an empty cell"
            raise ConfigError(f"{path}: column {col!r} must hold times > 0 ms, got {value}")
        if not np.isnan(ms).all():
            ops[op] = ms * 1e-3
    return ModelTimings(name, path, tokens, tp, dims, ops)


def model_dirs(gpu_dir: Path) -> list[tuple[str, Path]]:
    """(name, mlp.csv path) for every model directory under compute/<gpu>/; a leaf directory
    without mlp.csv is an error (a typo'd or half-copied profile)."""
    if not gpu_dir.is_dir():
        raise ConfigError(f"{gpu_dir}: not a directory")
    out = []
    for d in sorted(p for p in gpu_dir.rglob("*") if p.is_dir()):
        has_subdirs = any(c.is_dir() for c in d.iterdir())
        if (d / "mlp.csv").is_file():
            out.append(("/".join(d.relative_to(gpu_dir).parts), d / "mlp.csv"))
        elif not has_subdirs:
            raise ConfigError(f"{d}: model directory has no mlp.csv")
    if not out:
        raise ConfigError(f"{gpu_dir}: no <org>/<model>/mlp.csv found")
    return out


def gpu_folders(profiles: Path) -> list[str]:
    compute = profiles / "compute"
    if not compute.is_dir():
        raise ConfigError(f"{profiles}: no compute/ folder (expected the Vidur profiling layout "
                          f"compute/<gpu>/<org>/<model>/mlp.csv)")
    folders = sorted(p.name for p in compute.iterdir() if p.is_dir())
    if not folders:
        raise ConfigError(f"{compute}: no GPU folders")
    return folders


def resolve_folder(profiles: Path, name: str) -> tuple[str, DataFolder]:
    """A --gpu argument (data folder or catalogue name) -> (folder, DataFolder). For a folder
    outside KNOWN_FOLDERS the catalogue GPU is the folder's own name ('' when it is not one)."""
    folders = gpu_folders(profiles)
    if name in folders:
        folder = name
    else:
        by_gpu = {v.gpu: k for k, v in KNOWN_FOLDERS.items() if k in folders}
        try:
            canonical = get_gpu(name).name
        except ConfigError:
            canonical = None
        folder = by_gpu.get(canonical or "") or (canonical if canonical in folders else None)
        if folder is None:
            raise ConfigError(f"no measurements for GPU {name!r} under {profiles / 'compute'}"
                              f"{did_you_mean(name, folders)}; folders: {', '.join(folders)}")
    known = KNOWN_FOLDERS.get(folder)
    if known is None:
        net = folder if (profiles / "network" / folder).is_dir() else None
        try:
            gpu = get_gpu(folder).name
        except ConfigError:
            gpu = ""
        known = DataFolder(gpu, net, f"folder named after the GPU ({folder!r})",
                           f"kernel timings measured on {folder}")
    return folder, known



ATTN_COLUMNS = ("num_tensor_parallel_workers", "n_head", "n_kv_head", "n_embd", "batch_size",
                "num_tokens", "kv_cache_size", f"time_stats.attention.{STAT}")


def read_attention_csv(path: Path) -> pd.DataFrame:
    """attention.csv as `kvsim profile` writes it: per row, batch_size sequences each with
    num_tokens new tokens and kv_cache_size tokens of context (including the new ones)."""
    df = _read_csv(path)
    for col in ATTN_COLUMNS:
        if col not in df.columns:
            raise ConfigError(f"{path}: missing column {col!r}{did_you_mean(col, list(df.columns))}")
    out = pd.DataFrame({c: _numeric(df, c, path) for c in ATTN_COLUMNS})
    if not (out[f"time_stats.attention.{STAT}"] > 0).all():
        raise ConfigError(f"{path}: column 'time_stats.attention.{STAT}' must hold times > 0 ms")
    return out



def network_frame(path: Path, collective: str) -> pd.DataFrame:
    df = _read_csv(path)
    col = f"time_stats.{collective}.{STAT}"
    for c in ("size", "num_workers", col):
        if c not in df.columns:
            raise ConfigError(f"{path}: missing column {c!r}{did_you_mean(c, list(df.columns))}")
    out = pd.DataFrame({"size": _numeric(df, "size", path), "workers": _numeric(df, "num_workers", path),
                        "t": _numeric(df, col, path) * 1e-3})
    if "devices_per_node" in df.columns:  # tensor parallelism runs inside one node
        out = out[_numeric(df, "devices_per_node", path) == out["workers"].to_numpy()]
    out = out[(out["t"] > 0) & (out["size"] > 0)]
    if out.empty:
        raise ConfigError(f"{path}: no intra-node rows with size > 0 and time > 0")
    return out.reset_index(drop=True)
