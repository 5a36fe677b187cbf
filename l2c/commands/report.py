"""`l2c report RESULTS.jsonl [-o DIR]`: print the summary of a bench run and write its PNG plots."""
from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="summarize an l2c bench results file and plot it",
                       description="Geometric mean speedup (headline), arithmetic mean, share of shapes won, "
                                   "worst shape and FLOP-bucket breakdown per kernel and protocol; PNG plots "
                                   "if matplotlib is installed (pip install 'l2c[plots]').")
    p.add_argument("results", help="JSON-lines file written by l2c bench")
    p.add_argument("-o", "--output", default=None,
                   help="directory for the plots (default: RESULTS without suffix + '_report')")
    p.add_argument("--no-plots", action="store_true", help="print the summary only")
    p.add_argument("--no-best-of", action="store_true",
                   help="leave out the per-shape best-candidate combination")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bench import BenchError
    from ..cli import UsageError
    from ..report import load_results, print_summary, write_plots

    path = Path(args.results)
    if not path.is_file():
        raise UsageError(f"{path}: no such results file")
    try:
        results = load_results(path)
    except BenchError as err:
        raise UsageError(str(err)) from None
    if not results.rows:
        raise UsageError(f"{path}: no result rows")
    with_best_of = not args.no_best_of
    print_summary(results, sys.stdout, with_best_of=with_best_of)
    if args.no_plots:
        return 0
    out_dir = Path(args.output) if args.output else path.with_name(path.stem + "_report")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("\nplots skipped: matplotlib is not installed (pip install 'l2c[plots]')")
        return 0
    written = write_plots(results, out_dir, with_best_of=with_best_of)
    print()
    for p in written:
        print(f"wrote {p}")
    return 0
