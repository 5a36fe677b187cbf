#!/usr/bin/env python
"""Run the whole 1,000-shape grid on the GPU for cuBLAS and the given kernels, then report it.

    python scripts/bench_grid.py [KERNEL.l2 | TABLE.json ...] [-o results/grid.jsonl] [--quick]

What it runs (everything is an ordinary `l2c bench` / `l2c report`, so a run can be reproduced or
resumed by hand):

    l2c bench torch KERNELS... --shapes grid --protocol kernel,call -o OUT --resume
    l2c report OUT -o OUT_report

`torch` is torch.matmul measured against itself: its rows give cuBLAS's TFLOPS on every shape and the
protocol's noise floor (a gain smaller than the A/A spread is noise). `--resume` makes a re-run after an
interruption continue where it stopped. `--quick` halves the repetitions (kernel: 5 reps, call: 10 calls
per side) for a first look; the defaults are l2c bench's (10 reps, 20 calls).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from l2c.cli import main as l2c


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernels", nargs="*", help=".l2 spec files or tuned-table .json files (default: cuBLAS only)")
    p.add_argument("-o", "--output", default="results/grid.jsonl")
    p.add_argument("--protocol", default="kernel,call")
    p.add_argument("--quick", action="store_true", help="fewer repetitions (5 reps / 10 calls per side)")
    p.add_argument("--no-aa", action="store_true", help="leave out the torch-vs-torch (A/A) rows")
    p.add_argument("--limit", type=int, default=None, help="only the first N grid shapes (a smoke run)")
    args = p.parse_args(argv)

    out = Path(args.output)
    bench = ["bench", *([] if args.no_aa else ["torch"]), *args.kernels, "--shapes", "grid",
             "--protocol", args.protocol, "-o", str(out), "--resume"]
    if args.quick:
        bench += ["--reps", "5", "--iters", "10"]
    if args.limit is not None:
        bench += ["--limit", str(args.limit)]
    if not args.kernels and args.no_aa:
        p.error("nothing to measure: give kernels or drop --no-aa")
    rc = l2c(bench)
    if rc != 0:
        return rc
    return l2c(["report", str(out), "-o", str(out.with_name(out.stem + "_report"))])


if __name__ == "__main__":
    sys.exit(main())
