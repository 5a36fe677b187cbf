#!/usr/bin/env python
"""Two-fold cross-validation of neighbourhood cells (`l2c table --near`) on measured points alone.

    python scripts/near_cv.py benchmarks/results/s29/points_f16.jsonl.xz \
        benchmarks/results/s30/points_f16_timed.jsonl.xz
    python scripts/near_cv.py ... --plain            # the same without online tuning's timings as evidence

The shapes of the points files are split in two by a hash of M x N x K. The cells made from one half (every row of
its shapes, as `l2c table --near` reads them) are checked at the other half's shapes under --max-gflop: a held-out
shape a cell holds is served; its serving kernel's `kernel`-protocol speed there is known where a row was served by
it or online tuning timed it there (`online_timings`), and a loss where that speed is below 1. Nothing here is
measured: it reads committed results.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from l2c.commands.table import as_candidates, near_boxes, spec_text  # noqa: E402
from l2c.results_file import read_rows  # noqa: E402


def half(at) -> int:
    return zlib.crc32("x".join(map(str, at)).encode()) % 2


def known_speeds(rows, cache):
    """(group, shape) -> {spec text: the lowest `kernel` speedup measured for it there (rows and timings)}."""
    out = {}
    for r in rows:
        if r.get("type") != "result" or r.get("protocol") != "kernel" or r.get("status") != "ok":
            continue
        speeds = out.setdefault(((r.get("batch", 1), r["dtype"], r["layout"]), (r["m"], r["n"], r["k"])), {})
        served = spec_text(r, cache) if r.get("served_by", "") != "torch" else ""
        measured = list((r.get("online_timings") or {}).items()) + ([(served, r["speedup"])] if served else [])
        for text, speedup in measured:
            speeds[text] = min(speeds.get(text, math.inf), speedup)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("points", nargs="+", help="results files of measured points (l2c bench through the dispatcher)")
    p.add_argument("--protocol", default="kernel,call")
    p.add_argument("--min-speedup", type=float, default=1.03)
    p.add_argument("--max-gflop", type=float, default=1.0)
    p.add_argument("--plain", action="store_true", help="ignore online tuning's timings as evidence")
    args = p.parse_args()
    cache = {}
    rows = as_candidates([r for path in args.points for r in read_rows(path)], cache)
    speeds = known_speeds(rows, cache)   # what is known at the held-out shapes, the timings included either way
    if args.plain:
        rows = [{k: v for k, v in r.items() if k != "online_timings"} for r in rows]
    protocols = args.protocol.split(",")
    served = known = lost = below = 0
    figures = []
    for fold in (0, 1):
        train = [r for r in rows if r.get("type") != "result" or half((r["m"], r["n"], r["k"])) == fold]
        boxes = near_boxes(train, protocols, args.min_speedup, cache)
        for (group, at), measured in speeds.items():
            if half(at) == fold or 2 * at[0] * at[1] * at[2] >= args.max_gflop * 1e9:
                continue
            holding = [b for b in boxes if (b[0].get("batch", 1), b[0]["dtype"], b[0]["layout"]) == group
                       and all(lo <= x <= hi for x, (lo, hi) in zip(at, b[1:]))]
            if not holding:
                continue
            served += 1
            speed = measured.get(holding[0][0]["spec"])
            if speed is not None:
                known, lost, below = known + 1, lost + (speed < 1.0), below + (speed < 0.97)
                figures.append(speed)
    summary = {"points": args.points, "plain": args.plain, "served": served, "speed_known": known,
               "slower_than_torch": lost, "below_0.97": below,
               "geomean": round(math.exp(sum(map(math.log, figures)) / len(figures)), 4) if figures else None,
               "min": round(min(figures), 4) if figures else None}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
