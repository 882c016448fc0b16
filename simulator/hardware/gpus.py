"""GPU catalogue: one YAML per GPU in gpu_profiles/, each number with its source.

`GpuSpec` holds the datasheet figures the cost model and memory math use; the optional
`calibration` mapping holds cost-model parameters fitted by `kvsim calibrate` (issue 3).
A profile may also be given as a path to a YAML file of the same schema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from simulator.config.paths import data_dir
from simulator.errors import ConfigError, did_you_mean

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    memory_gib: float
    hbm_bandwidth_gbps: float  # GB/s, 1e9 bytes
    peak_tflops: dict[str, float]  # dense, by compute dtype: bf16, fp16, fp8, fp4 (where it has one)
    host_link_gbps: float  # usable one-way GPU<->CPU bandwidth, GB/s
    host_link_latency_us: float
    gpu_link_gbps: float | None  # GPU<->GPU (NVLink...), None when absent
    price_per_hour: float
    calibration: dict[str, Any] = field(default_factory=dict)
    source_file: str = ""
    num_sms: int = 0  # streaming multiprocessors (CUs on AMD): the GEMM wave count; 0 = not given
    compute_capability: str = ""  # CUDA compute capability ("9.0"), "" when not CUDA or not given

    def __post_init__(self) -> None:
        for f in ("memory_gib", "hbm_bandwidth_gbps", "host_link_gbps"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(
                    f"GPU profile {self.name!r} ({self.source_file}): {f} must be > 0, got {v!r}")
        if not (isinstance(self.num_sms, int) and not isinstance(self.num_sms, bool) and self.num_sms >= 0):
            raise ConfigError(f"GPU profile {self.name!r} ({self.source_file}): num_sms must be a "
                              f"positive integer (the datasheet's SM count), got {self.num_sms!r}")
        if not self.peak_tflops or any(v <= 0 for v in self.peak_tflops.values()):
            raise ConfigError(
                f"GPU profile {self.name!r}: peak_tflops must map dtypes to positive numbers")
        p = self.price_per_hour
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or p < 0:
            raise ConfigError(f"GPU profile {self.name!r} ({self.source_file}): price_per_hour must "
                              f"be a number of $ per GPU-hour >= 0, got {p!r}")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_flops(self, dtype: int | str) -> float:
        """Dense peak FLOP/s for a compute dtype: a name ("bf16", "fp8", "fp4"; `compute_dtype`
        says which one runs) or the weights' bytes (1 byte -> fp8 when the GPU has it)."""
        if isinstance(dtype, str):
            dtype = self.compute_dtype(dtype)
            if dtype != "bf16":
                return self.peak_tflops[dtype] * 1e12
        elif dtype == 1 and "fp8" in self.peak_tflops:
            return self.peak_tflops["fp8"] * 1e12
        return self.peak_tflops.get("bf16", max(self.peak_tflops.values())) * 1e12

    def compute_dtype(self, compute: str) -> str:
        """The dtype a GEMM asking for `compute` runs at here: itself where the profile lists
        its peak (fp8 on Hopper / MI300X, fp4 on Blackwell), else bf16 (the weights are
        dequantized in the kernel, as vLLM's Marlin / weight-only paths do)."""
        return compute if compute in self.peak_tflops else "bf16"


def _profiles_dir():
    return data_dir("gpu_profiles")


# NOTE: the packaged profiles are read with libyaml's parser where PyYAML has it (the same
# safe constructor and resolver, so the same data; ~10x faster than the pure-Python parser)
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _packaged_data(file_name: str) -> dict[str, Any]:
    """A packaged profile's YAML data, parsed once (the index and the spec share it)."""
    return yaml.load((_profiles_dir() / file_name).read_text(), Loader=_FAST_LOADER)


@cache
def _index() -> dict[str, str]:
    """name or alias -> yaml file name."""
    out: dict[str, str] = {}
    for entry in _profiles_dir().iterdir():
        if entry.name.endswith(".yaml"):
            data = _packaged_data(entry.name)
            out[data["name"]] = entry.name
            for alias in data.get("aliases") or []:
                out[alias] = entry.name
    return out


def gpu_names() -> list[str]:
    return sorted(_index())


def _from_dict(data: dict[str, Any], source: str) -> GpuSpec:
    if not isinstance(data, dict):
        raise ConfigError(f"GPU profile {source}: expected a mapping of fields, got {type(data).__name__}")
    for key in ("host_link", "gpu_link", "peak_tflops", "calibration"):
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise ConfigError(f"GPU profile {source}: {key} must be a mapping, got {data[key]!r}")
    try:
        host = data.get("host_link") or {}
        link = data.get("gpu_link") or {}
        return GpuSpec(
            name=data["name"],
            memory_gib=data["memory_gib"],
            hbm_bandwidth_gbps=data["hbm_bandwidth_gbps"],
            peak_tflops=dict(data["peak_tflops"]),
            host_link_gbps=host.get("bandwidth_gbps", 25.0),
            host_link_latency_us=host.get("latency_us", 10.0),
            gpu_link_gbps=link.get("bandwidth_gbps"),
            price_per_hour=data.get("price_per_hour", 0.0),
            calibration=data.get("calibration") or {},
            source_file=source,
            num_sms=data.get("num_sms", 0),
            compute_capability=str(data.get("compute_capability") or ""),
        )
    except KeyError as e:
        raise ConfigError(f"GPU profile {source}: missing field {e.args[0]!r}") from None


def get_gpu(name: str) -> GpuSpec:
    """A GPU by catalogue name/alias (case-insensitive) or by path to a profile YAML."""
    key = name.lower()
    index = _index()
    if key in index:
        return _load_packaged(index[key])
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"GPU profile {path}: file not found")
        from simulator.config.schema import read_yaml

        return _from_dict(read_yaml(path, f"GPU profile {path}") or {}, str(path))
    raise ConfigError(f"unknown GPU {name!r}{did_you_mean(key, list(index))}; valid: "
                      f"{', '.join(gpu_names())}, or a path to a profile YAML")


@cache
def _load_packaged(file_name: str) -> GpuSpec:
    return _from_dict(_packaged_data(file_name), f"gpu_profiles/{file_name}")
