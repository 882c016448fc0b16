"""`kvsim profile --model NAME --gpu NAME [--out DIR]`: time a model's operators on this machine.

Writes <out>/compute/<gpu>/<org>/<model>/{mlp,attention}.csv in the layout `kvsim calibrate`
reads, so that `kvsim calibrate --profiles <out> --gpu <gpu>` fits this hardware.
Needs the optional torch extra: pip install 'kvsim[profile]'.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from simulator.cli.common import check_out_dir
from simulator.errors import ConfigError

DESCRIPTION = """Measure a model's kernel timings on this machine's GPU (or CPU) with torch: the MLP
and attention operators of one layer, per tensor-parallel shard and token count. Writes
OUT/compute/<gpu>/<org>/<model>/{mlp,attention}.csv in the layout `kvsim calibrate` reads,
so that `kvsim calibrate --profiles OUT --gpu <gpu>` fits this hardware.
Needs the optional torch extra: pip install 'kvsim[profile]'."""

EPILOG = """example:
  kvsim profile --model llama-3.1-8b --gpu h200 --out profiles
  kvsim calibrate --profiles profiles --gpu h200"""


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def register(sub, help: str) -> None:
    p = sub.add_parser("profile", help=help, description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("--model", required=True, help="model name or path to a Hugging Face config.json")
    p.add_argument("--gpu", required=True,
                   help="name of this GPU: the data folder name, normally its catalogue name (e.g. h200)")
    p.add_argument("--out", default="profiles", metavar="DIR", help="output root (default ./profiles)")
    p.add_argument("--tp", type=_ints, default=(1, 2, 4, 8), metavar="N,N,...",
                   help="TP degrees to profile shards of (default 1,2,4,8)")
    p.add_argument("--tokens", type=_ints, default=None, metavar="N,N,...",
                   help="token counts, comma-separated (default 1,2,4,...,4096)")
    p.add_argument("--repeats", type=int, default=20, help="timed repeats per point (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up runs per point (default 3)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--no-attention", action="store_true", help="skip the attention kernels")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from simulator.calibration.profile import DEFAULT_TOKENS, ProfileConfig, require_torch, run_profile
    from simulator.hardware.models import get_model

    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.gpu):
        raise ConfigError(f"--gpu must be a plain folder name (letters, digits, . _ -), got {args.gpu!r}")
    for name, n, lo in (("--repeats", args.repeats, 1), ("--warmup", args.warmup, 0)):
        if n < lo:
            raise ConfigError(f"{name} must be >= {lo}, got {n}")
    model = get_model(args.model)
    check_out_dir(args.out, "--out")
    torch = require_torch()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"--device {device!r}: {str(e).splitlines()[0]}") from None
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no CUDA device here; use --device cpu")
    cfg = ProfileConfig(model=model, gpu=args.gpu, out_dir=Path(args.out), tp_sizes=args.tp,
                        num_tokens=args.tokens or DEFAULT_TOKENS, repeats=args.repeats,
                        warmup=args.warmup, device=device, dtype=args.dtype,
                        attention=not args.no_attention)
    for path in run_profile(cfg):
        print(f"wrote {path}")
    for note in cfg.notes:
        print(f"note: {note}")
    print(f"next: kvsim calibrate --profiles {args.out} --gpu {args.gpu}")
    return 0
