"""`kvsim profile --model NAME --gpu NAME [--out DIR]`: time a model's operators on this machine.

Writes <out>/compute/<gpu>/<org>/<model>/{mlp,attention}.csv in the layout `kvsim calibrate`
reads, so that `kvsim calibrate --profiles <out> --gpu <gpu>` fits this hardware.
Needs the optional torch extra: pip install 'kvsim[profile]'.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from simulator.calibration.profile import DEFAULT_TOKENS, ProfileConfig, require_torch, run_profile
from simulator.errors import ConfigError
from simulator.hardware.models import get_model


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def register(sub) -> None:
    p = sub.add_parser("profile", help="time a model's kernels on this machine (needs torch)",
                       description=__doc__)
    p.add_argument("--model", required=True, help="model name or path to a Hugging Face config.json")
    p.add_argument("--gpu", required=True,
                   help="name of this GPU: the data folder name, normally its catalogue name (e.g. h200)")
    p.add_argument("--out", default="profiles", help="output root (default ./profiles)")
    p.add_argument("--tp", type=_ints, default=(1, 2, 4, 8), help="TP degrees to profile shards of (1,2,4,8)")
    p.add_argument("--tokens", type=_ints, default=DEFAULT_TOKENS, help="token counts, comma-separated")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--no-attention", action="store_true", help="skip the attention kernels")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", args.gpu):
        raise ConfigError(f"--gpu must be a plain folder name (letters, digits, . _ -), got {args.gpu!r}")
    torch = require_torch()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cfg = ProfileConfig(model=get_model(args.model), gpu=args.gpu, out_dir=Path(args.out), tp_sizes=args.tp,
                        num_tokens=args.tokens, repeats=args.repeats, warmup=args.warmup, device=device,
                        dtype=args.dtype, attention=not args.no_attention)
    for path in run_profile(cfg):
        print(f"wrote {path}")
    for note in cfg.notes:
        print(f"note: {note}")
    print(f"next: kvsim calibrate --profiles {args.out} --gpu {args.gpu}")
    return 0
