"""`l2c compile spec.l2`: validate each kernel and write its generated sources."""
from __future__ import annotations

from pathlib import Path

from ..lower import file_name, render
from . import validated_kernels


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="generate Triton and/or CUTLASS sources from .l2 files")
    p.add_argument("specs", nargs="+", help=".l2 files")
    p.add_argument("--target", choices=["triton", "cutlass", "all"], default="all",
                   help="which target to lower to (all: every target the spec allows)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("-o", "--output", default="l2c_out", help="output directory (default: l2c_out)")
    p.set_defaults(func=run)


def run(args) -> int:
    out_dir = Path(args.output)
    jobs = validated_kernels(args.specs, args.target, args.arch)   # all of them before any work
    out_dir.mkdir(parents=True, exist_ok=True)
    for valid in jobs:
        dest = out_dir / valid.target / file_name(valid)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(render(valid))
        print(f"wrote {dest}")
    return 0
