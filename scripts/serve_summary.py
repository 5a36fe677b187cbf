#!/usr/bin/env python
"""The decoding set's summary (issue #20's figures) from `l2c bench linear:TABLE --shapes serve --roofline` rows:
per dtype the shapes, median fraction of roofline (ours and torch's), geomean and minimum speedup over F.linear,
the same for the shapes a tuned kernel serves and for those torch serves, and the geomean per token count.

    python scripts/serve_summary.py serve_kernel_f16.jsonl serve_kernel_bf16.jsonl -o serve_summary_h200.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys

from l2c.results_file import read_rows, row_key

NAMES = {"f16": "fp16", "bf16": "bf16"}


def figures(rows):
    if not rows:
        return {"shapes": 0}
    return {"shapes": len(rows),
            "median_roofline_fraction": round(statistics.median(r["roofline_fraction"] for r in rows), 4),
            "torch_median_roofline_fraction": round(statistics.median(r["baseline_roofline_fraction"] for r in rows), 4),
            "geomean_speedup": round(math.exp(statistics.fmean(math.log(r["speedup"]) for r in rows)), 4),
            "min_speedup": round(min(r["speedup"] for r in rows), 4)}


def summary(paths):
    """Per dtype, over the `kernel` rows of l2c's candidates (not torch's A/A rows): a shape measured twice counts its
    later row, and a shape whose latest row failed or has no fraction is counted apart (`failed`), never dropped
    silently."""
    latest = {}
    for p in paths:
        for r in read_rows(p):
            if r.get("type") == "result" and r.get("kernel") != "torch" and r.get("protocol") == "kernel":
                latest[row_key(r)] = r
    rows = [r for r in latest.values() if r.get("status") == "ok" and r.get("roofline_fraction") is not None
            and r.get("baseline_roofline_fraction") is not None]
    failed = [r for r in latest.values() if r not in rows]
    out = {"gpu": next((r.get("gpu") for p in paths for r in read_rows(p) if r.get("type") == "env"), None),
           "protocol": "kernel (CUDA-graph replay, cold weights: each call reads its weight from HBM), through "
                       "l2c.nn.Linear's path against F.linear's cuBLAS call",
           "roofline": "max(bytes / read rate, FLOPs / dense rate), both rates measured in the same run (env rows: "
                       "ceilings)",
           "sources": list(paths)}
    for dtype in sorted({r["dtype"] for r in rows}):
        mine = [r for r in rows if r["dtype"] == dtype]
        served = [r for r in mine if r.get("served_by") not in (None, "torch")]
        by_m = {}
        for r in mine:
            by_m.setdefault(r["m"], []).append(math.log(r["speedup"]))
        out[NAMES.get(dtype, dtype)] = dict(
            figures(mine), served_by_a_tuned_kernel=figures(served),
            served_by_torch=figures([r for r in mine if r.get("served_by") in (None, "torch")]),
            below_0_97=sum(r["speedup"] < 0.97 for r in mine),
            failed=sum(r.get("dtype") == dtype for r in failed),
            geomean_speedup_by_m={str(m): round(math.exp(statistics.fmean(v)), 4) for m, v in sorted(by_m.items())})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    data = summary(args.results)
    with open(args.output, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    for name in ("fp16", "bf16"):
        if name in data:
            d = data[name]
            print(f"{name}: {d['shapes']} shapes, geomean {d['geomean_speedup']}, min {d['min_speedup']}, median "
                  f"roofline {d['median_roofline_fraction']} (torch {d['torch_median_roofline_fraction']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
