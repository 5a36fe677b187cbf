"""Which kernels cuBLAS runs for torch.matmul, per shape (GPU only).

Knowing cuBLAS's pick (tile, stages, cluster, split-K and its reduction kernel, grid and shared memory, from the
kernel names and launch records of the CUDA profiler) says which l2c configurations to screen on the shapes where
l2c loses, instead of guessing. One profiler session per batch of shapes; each shape's kernels are those launched
inside its own annotated range, which ends with a synchronize.

    python3 scripts/cublas_kernels.py --shapes grid --dtype f16 --out $OUT/cublas_kernels_grid.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from l2c.shapes import load_shapes  # noqa: E402

CALLS = 3  # calls profiled per shape; kernels per call = kernels seen / CALLS


def operands(torch, m, n, k, dtype, b_col):
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype).t() if b_col else torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


def profile_batch(torch, shapes, dtype, b_col):
    """Profile each shape's torch.matmul calls; return {shape index: [kernel records]}."""
    from torch.profiler import ProfilerActivity, profile, record_function

    tensors = [operands(torch, s.m, s.n, s.k, dtype, b_col) for s in shapes]
    for a, b in tensors:  # warm: cuBLAS's heuristic and its workspace are set up outside the profile
        torch.matmul(a, b)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i, (a, b) in enumerate(tensors):
            with record_function(f"l2c_shape_{i}"):
                for _ in range(CALLS):
                    torch.matmul(a, b)
                torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))["traceEvents"]
    ranges = {}
    for e in events:
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("l2c_shape_"):
            ranges[int(e["name"].rsplit("_", 1)[1])] = (e["ts"], e["ts"] + e["dur"])
    # A kernel belongs to the range its host-side launch (same correlation id) happened in: GPU and CPU clocks
    # are aligned by the profiler, but the launch's CPU time is what the range brackets.
    launched_at = {e["args"]["correlation"]: e["ts"] for e in events
                   if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    found = {i: [] for i in range(len(shapes))}
    for e in events:
        if e.get("cat") != "kernel":
            continue
        ts = launched_at.get(e.get("args", {}).get("correlation"), e["ts"])
        for i, (lo, hi) in ranges.items():
            if lo <= ts <= hi:
                args = e.get("args", {})
                found[i].append({"name": e["name"], "us": e["dur"], "grid": args.get("grid"), "block": args.get("block"),
                                 "smem": args.get("shared memory"), "regs": args.get("registers per thread")})
                break
    return found


def summarize(records):
    """One entry per distinct kernel: launches per call and median duration."""
    by_name = {}
    for r in records:
        by_name.setdefault(r["name"], []).append(r)
    out = []
    for name, rs in by_name.items():
        out.append({"name": name, "per_call": len(rs) / CALLS, "median_us": statistics.median(r["us"] for r in rs),
                    "grid": rs[0]["grid"], "block": rs[0]["block"], "smem": rs[0]["smem"], "regs": rs[0]["regs"]})
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="grid", help="a shape set name (grid, llm, square) or a file of M N K lines")
    p.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    p.add_argument("--b-col", action="store_true", help="B column-major (nn.Linear's weight)")
    p.add_argument("--batch", type=int, default=25, help="shapes per profiler session")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch

    dtype = {"f16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    shapes = load_shapes(args.shapes)
    rows = []
    for start in range(0, len(shapes), args.batch):
        batch = shapes[start:start + args.batch]
        found = profile_batch(torch, batch, dtype, args.b_col)
        for i, s in enumerate(batch):
            rows.append({"m": s.m, "n": s.n, "k": s.k, "kernels": summarize(found[i])})
        torch.cuda.empty_cache()
        print(f"{start + len(batch)}/{len(shapes)}", flush=True)
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cublas": torch.backends.cuda.preferred_blas_library().name
              if hasattr(torch.backends.cuda, "preferred_blas_library") else None, "dtype": args.dtype,
              "b_col": args.b_col, "shapes": args.shapes, "command": " ".join(sys.argv), "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1))
    missing = sum(1 for r in rows if not r["kernels"])
    print(f"wrote {args.out}: {len(rows)} shapes, {missing} with no kernel recorded")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
