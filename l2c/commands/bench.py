"""`l2c bench KERNELS --shapes SET --protocol P`: measure kernels against torch.matmul, rows to JSON lines."""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from ..cli import seed

DEFAULT_OUTPUT = "l2c_bench.jsonl"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="measure kernels against torch.matmul (cuBLAS) on a shape set",
        description="Measure .l2 spec files, tuned tables (.json) or `torch` (torch.matmul against itself: "
                    "the protocol's noise floor) against torch.matmul. One JSON row per shape x kernel x "
                    "protocol, flushed as it completes; --resume continues an interrupted run.")
    p.add_argument("kernels", nargs="*", help=".l2 spec files, tuned-table .json files, `torch`, "
                                              "`dispatch[:TABLE]` (l2c.matmul with that table; the one shipped for "
                                              "this GPU by default; `none`: no table serves, online choice times the "
                                              "arch's table's kernels) or `linear[:TABLE]` (l2c.nn.Linear's path)")
    p.add_argument("--shapes", help="grid | llm | square | offgrid | between | heldout | points | points2 | serve | "
                                    "decode | decode_between | decode_batched | served (the shapes the "
                                    "dispatch:/linear: table serves in --dtype and --layout: each entry's M, each "
                                    "token range's ends and middle) | FILE (one 'M N K' per line); required for "
                                    "shape-generic specs, a filter for fixed-shape specs and tables")
    p.add_argument("--dtype", choices=["f16", "bf16"], default="f16",
                   help="element type for torch, dispatch and linear (default: f16)")
    p.add_argument("--layout", default=None,
                   help="layouts of A,B,C for torch, dispatch and linear, e.g. row,col,row (default: row,row,row; "
                        "row,col,row for linear: nn.Linear's weight is B transposed)")
    p.add_argument("--roofline", action="store_true",
                   help="kernel protocol: operands rotated so every call reads them from HBM, the GPU's read "
                        "bandwidth and dense rate measured in this run, each row's fraction of roofline")
    p.add_argument("--protocol", default="kernel", help="comma-separated subset of kernel,kernel_apart,call,"
                                                        "server (default: kernel)")
    p.add_argument("-o", "--output", default=DEFAULT_OUTPUT, help=f"results file (default: {DEFAULT_OUTPUT})")
    p.add_argument("--resume", action="store_true", help="continue an existing results file, skipping its rows")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                   help="cuda (default when a GPU is visible) or cpu: the Triton interpreter, for testing "
                        "the machinery only")
    p.add_argument("--target", choices=["triton", "cutlass", "all"], default="all",
                   help="targets to build .l2 specs for (default: every target the spec allows)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--reps", type=int, default=10, help="kernel protocol: timed repetitions per side")
    p.add_argument("--iters", type=int, default=20, help="call/server protocols: timed calls per side")
    p.add_argument("--warmup", type=int, default=3, help="untimed warm-up calls per side and shape")
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help="run large matmuls this long first so GPU clocks settle (default: 3 on cuda, 0 on cpu)")
    p.add_argument("--rate", type=float, default=100.0, help="server protocol: mean calls per second")
    p.add_argument("--seed", type=seed, default=0)
    p.add_argument("--no-graphs", action="store_true", help="kernel protocol: eager launches, no CUDA graphs")
    p.add_argument("--no-rotate", action="store_true",
                   help="kernel protocol: do not rotate buffers for shapes that fit in L2")
    p.add_argument("--limit", type=int, default=None, help="measure only the first N shapes of the plan")
    p.add_argument("--only-served", action="store_true",
                   help="keep only the --shapes the one dispatch:/linear: table serves in --dtype and --layout "
                        "(what a change to served kernels can move; torch's own calls measure the noise floor)")
    p.set_defaults(func=run)


def _device(kind: str):
    from ..cli import UsageError
    import torch
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "none"
    if kind == "none" or (kind == "cuda" and not torch.cuda.is_available()):
        raise UsageError(
            "no CUDA GPU is visible (torch.cuda.is_available() is False); l2c bench measures against cuBLAS "
            "on a GPU. Pass --device cpu to exercise the benchmark machinery with the Triton interpreter "
            "(its figures say nothing about performance).")
    if kind == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"   # before any kernel module is built
    elif os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "yes", "on"):
        raise UsageError("TRITON_INTERPRET is set: Triton kernels would run in the CPU interpreter and be "
                         "timed as such; unset it to measure on the GPU")
    from ..devices import get_device
    return get_device(kind)


def run(args) -> int:
    from ..bench import SAME_METHOD, Progress, Settings, remaining_shapes, run_bench
    from ..candidates import load_candidates, plan
    from ..errors import BenchError
    from ..results_file import CPU_NOTE, ResultsWriter, command_line, environment, parse_protocols
    from ..cli import UsageError
    from ..shapes import ShapeFileError, load_shapes

    try:
        protocols = parse_protocols(args.protocol)
    except ValueError as err:
        raise UsageError(str(err)) from None
    for name in ("reps", "iters"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1")
    if args.warmup < 0 or (args.limit is not None and args.limit < 1):
        raise UsageError("--warmup must be 0 or more, and --limit 1 or more")
    if not (math.isfinite(args.rate) and args.rate > 0) or (
            args.warmup_seconds is not None and not (math.isfinite(args.warmup_seconds) and args.warmup_seconds >= 0)):
        raise UsageError("--rate must be a positive number of calls per second, --warmup-seconds 0 or more")
    if args.roofline and args.no_rotate:
        raise UsageError("--roofline measures each call against HBM: it needs the rotated operands that keep them "
                         "out of L2 (drop --no-rotate)")
    device = _device(args.device)
    try:
        layout = args.layout or ("row,col,row" if any(k.split(":")[0] == "linear" for k in args.kernels)
                                 else "row,row,row")
        if len(layout.split(",")) != 3 or any(w not in ("row", "col") for w in layout.split(",")):
            raise UsageError(f"--layout must be three of row/col joined by commas, got {layout!r}")
        candidates = load_candidates(args.kernels, target=args.target, arch=args.arch, dtype=args.dtype,
                                     layout=layout)
        if args.shapes == "served":
            shape_set = _served_shapes(candidates, args.dtype, layout)
        else:
            shape_set = load_shapes(args.shapes) if args.shapes else None
        if args.only_served:
            if shape_set is None:
                raise UsageError("--only-served filters --shapes: name a shape set")
            path, table = _one_table(candidates)
            shape_set = [s for s in shape_set if table.lookup(args.dtype, layout, s.m, s.n, s.k, s.batch) is not None]
            if not shape_set:
                raise UsageError(f"{path} serves none of --shapes {args.shapes} in {args.dtype}, layout {layout}")
        shapes, jobs, skipped, declined = plan(candidates, shape_set)
        if not shapes:
            raise UsageError("nothing to measure: no kernel takes any shape of --shapes "
                             f"{args.shapes} (a fixed-shape kernel's shape must be in the set; batched shapes need a "
                             "spec with problem batch=any)")
        if args.limit is not None:
            shapes = shapes[: args.limit]
        warmup_s = args.warmup_seconds if args.warmup_seconds is not None else (3.0 if device.kind == "cuda" else 0.0)
        settings = Settings(protocols, reps=args.reps, iters=args.iters, warmup=args.warmup, rate=args.rate,
                            seed=args.seed, graphs=not args.no_graphs, rotate=not args.no_rotate, warmup_s=warmup_s,
                            roofline=args.roofline)
        writer = ResultsWriter(Path(args.output), resume=args.resume,
                               measured_as={"device": device.kind, "gpu": device.name,
                                            **{name: getattr(settings, name) for name in SAME_METHOD}})
    except (ShapeFileError, BenchError) as err:
        raise UsageError(str(err)) from None

    if device.kind == "cpu":
        print(f"l2c bench: {CPU_NOTE}", file=sys.stderr)
    if skipped:
        print(f"l2c bench: {skipped} fixed-shape kernel(s)/table entries skipped: their shape is not in "
              f"--shapes {args.shapes}", file=sys.stderr)
    if declined:
        print(f"l2c bench: {declined} (kernel, shape) pair(s) left out: a shape-generic kernel does not take the "
              f"shape's batch", file=sys.stderr)
    n_rows = sum(len(jobs[s.key]) for s in shapes) * len(protocols)
    print(f"l2c bench: {len(candidates)} kernel(s), {len(shapes)} shape(s), protocol(s) {','.join(protocols)}: "
          f"{n_rows} rows ({len(writer.done)} already in {args.output}) on {device.name}", file=sys.stderr)
    try:
        device.warm_up(warmup_s)
        env = environment(device, protocols, command_line(), settings.as_dict())
        ceilings = None
        if args.roofline:
            from ..roofline import measure_ceilings
            ceilings = measure_ceilings(device)
            env["ceilings"] = ceilings.as_row() if ceilings is not None else None
            if ceilings is None:
                print("l2c bench: --roofline: no GPU, so no ceilings to measure; rows carry no fraction",
                      file=sys.stderr)
        writer.write(env)
        progress = Progress(remaining_shapes(shapes, jobs, protocols, writer.done))
        written = run_bench(candidates, shapes, jobs, device, settings, writer, progress, ceilings=ceilings)
    except KeyboardInterrupt:
        print(f"l2c bench: interrupted; finished rows are in {args.output}: rerun with --resume to continue",
              file=sys.stderr)
        return 130
    finally:
        writer.close()
    print(f"l2c bench: wrote {written} row(s) to {args.output}", file=sys.stderr)
    from ..report import load_results, print_summary
    print_summary(load_results(args.output), sys.stdout)
    if device.kind == "cpu":
        print(f"note: {CPU_NOTE}")
    return 0


def _one_table(candidates):
    """(path, table) of the one dispatch:/linear: candidate: what `--shapes served` and `--only-served` read."""
    from ..cli import UsageError
    tables = {c._kernel.table_path: c._kernel.dispatcher.table for c in candidates if c.target == "dispatch"}
    if len(tables) != 1 or None in tables.values():
        raise UsageError("--shapes served and --only-served need exactly one dispatch:TABLE or linear:TABLE "
                         "candidate with a table")
    return next(iter(tables.items()))


def _served_shapes(candidates, dtype: str, layout: str):
    """`--shapes served`: the plain calls the one table of the dispatch:/linear: candidates serves in this dtype and
    layout (tuned_table.served_problem_shapes)."""
    from ..cli import UsageError
    from ..shapes import Shape
    from ..tuned_table import served_problem_shapes
    path, table = _one_table(candidates)
    shapes = [Shape(m, n, k, batch, label="served") for m, n, k, batch in served_problem_shapes(table, dtype, layout)]
    if not shapes:
        raise UsageError(f"{path} serves no {dtype} call in layout {layout}")
    return shapes
