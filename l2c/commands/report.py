"""`l2c report RESULTS.jsonl [MORE.jsonl ...] [-o DIR]`: print the summary of bench runs and write PNG plots.

Several files are read as one set of measurements (e.g. the pools screened on one shape set over several
runs); `--only-best-of` keeps just the per-shape best candidate across all of them."""
from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="summarize an l2c bench results file and plot it",
                       description="Geometric mean speedup (headline), arithmetic mean, share of shapes won, "
                                   "worst shape and FLOP-bucket breakdown per kernel and protocol; PNG plots "
                                   "if matplotlib is installed (pip install 'l2c[plots]').")
    p.add_argument("results", nargs="+", help="JSON-lines file(s) written by l2c bench; with several, a "
                   "kernel re-measured on a shape in a later file replaces its earlier row")
    p.add_argument("-o", "--output", default=None,
                   help="directory for the plots (default: the first RESULTS without suffix + '_report')")
    p.add_argument("--no-plots", action="store_true", help="print the summary only")
    best = p.add_mutually_exclusive_group()
    best.add_argument("--no-best-of", action="store_true",
                      help="leave out the per-shape best-candidate combination")
    best.add_argument("--only-best-of", action="store_true",
                      help="only the per-shape best-candidate combination (no block or plot per kernel)")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..errors import BenchError
    from ..cli import UsageError
    from ..report import load_results, print_summary, write_plots

    paths = [Path(p) for p in args.results]
    for path in paths:
        if not path.is_file():
            raise UsageError(f"{path}: no such results file")
    try:
        results = load_results(*paths)
    except BenchError as err:
        raise UsageError(str(err)) from None
    if not results.rows:
        raise UsageError(f"{', '.join(map(str, paths))}: no result rows")
    with_best_of = not args.no_best_of
    print_summary(results, sys.stdout, with_best_of=with_best_of, only_best_of=args.only_best_of)
    if args.no_plots:
        return 0
    out_dir = Path(args.output) if args.output else paths[0].with_name(paths[0].stem + "_report")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("\nplots skipped: matplotlib is not installed (pip install 'l2c[plots]')")
        return 0
    written = write_plots(results, out_dir, with_best_of=with_best_of, only_best_of=args.only_best_of)
    print()
    for p in written:
        print(f"wrote {p}")
    return 0
