#!/usr/bin/env python
"""Search kernels for the memory-bound `serve` shapes (LLM decoding: a few tokens against a large weight).

    python scripts/serve_sweep.py --out DIR [--dtypes f16,bf16] [--max-m 128] [--budget-s 420]

For each `serve` shape with M <= --max-m (nn.Linear's layout: B is the weight transposed) it measures a small
pool of shape-generic Triton specs chosen per shape — the GEMV family for M <= 8 (one row block, the weight
streamed once) and the tensor-core GEMM family with a narrow tile M above — each at the split-K counts that give
the shape's grid two to four waves over the SMs. Every candidate is verified, then timed against F.linear's
cuBLAS call in the `kernel` protocol with cold operands and each row's fraction of roofline (`l2c bench
--roofline`, rates measured in this run). The first dtype is searched over the whole pool; later dtypes
measure each shape's three best specs of the first.

Triton compiles every (spec, specialization) on first launch; a pool of processes launches each pair once first
so that the measuring process finds them in Triton's cache. Rows go to DIR/serve_sweep_<dtype>.jsonl in `l2c
bench`'s format (`l2c table --ranges` and `l2c report` read them).
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

SMS = 132


GEMV_TILES = ((16, 256, 4), (32, 256, 4), (32, 128, 4), (64, 128, 4), (16, 512, 4), (64, 256, 8))


def gemv_specs(m: int, n: int, k: int, dtype: str, tiles=GEMV_TILES):
    """GEMV candidates: one row block holds every token row, the weight streamed once with evict-first loads."""
    rows = 1 << max(0, (m - 1).bit_length())
    out = []
    for bn, bk, warps in tiles:
        for split in _splits(math.ceil(n / bn), k, bk):
            out.append(f"launch family=gemv warps={warps} evict=first\n  tile m={rows} n={bn} k={bk}\n"
                       f"  split_k slices={split} mode=workspace")
    return [_spec(body, dtype, "gemv") for body in out]


GEMM_TILES = ((64, 128, 4), (128, 64, 4), (64, 64, 6), (128, 128, 3))


def gemm_specs(m: int, n: int, k: int, dtype: str, tiles=GEMM_TILES):
    """Tensor-core candidates: a narrow tile M (16 to 64) and split-K to fill the SMs."""
    tile_m = min(64, max(16, 1 << (m - 1).bit_length()))
    out = []
    for bn, bk, stages in tiles:
        tiles = math.ceil(m / tile_m) * math.ceil(n / bn)
        for split in _splits(tiles, k, bk):
            out.append(f"launch warps=4 evict=first\n  tile m={tile_m} n={bn} k={bk}\n  pipeline stages={stages}\n"
                       f"  split_k slices={split} mode=workspace")
    return [_spec(body, dtype, "gemm") for body in out]


def _splits(tiles: int, k: int, bk: int):
    """Split-K counts that put two and four waves of programs on the SMs, each slice at least two K tiles."""
    out = []
    for waves in (2, 4):
        split = 1
        while tiles * split < waves * SMS and k // (2 * split * bk) >= 2:
            split *= 2
        if split not in out and split <= 32:
            out.append(split)
    return out


def _spec(body: str, dtype: str, family: str) -> str:
    from l2c.ir import config_name
    from l2c.parser import parse_one
    text = (f"kernel k {{\n  target triton\n  problem m=any n=any k=any\n  types a={dtype} b={dtype} c={dtype} "
            f"acc=f32\n  layout a=row b=col c=row\n  {body}\n  swizzle group=1\n}}\n")
    spec = parse_one(text)
    return spec.replace(name=config_name(spec)).to_l2()


def candidates_for(shape, dtype: str):
    """The pool of one shape: GEMV up to 8 rows, tensor cores above, and two of the other family at 4 to 16 rows
    (where the two meet)."""
    m, n, k = shape.m, shape.n, shape.k
    specs = gemv_specs(m, n, k, dtype) if m <= 8 else gemm_specs(m, n, k, dtype)
    if 4 <= m <= 8:
        specs += gemm_specs(m, n, k, dtype, GEMM_TILES[:2])
    elif m == 16:
        specs += gemv_specs(m, n, k, dtype, GEMV_TILES[1:3])
    from l2c.errors import L2Error
    from l2c.parser import parse_one
    from l2c.validate import validate
    valid = []
    for text in specs:
        try:
            validate(parse_one(text), "triton", "sm_90")
            valid.append(text)
        except L2Error:
            pass
    return valid


def _warm(pairs):
    """Launch each (spec, shape) once: Triton compiles and caches what the measuring process will launch."""
    import torch
    from l2c.build import build
    from l2c.parser import parse_one
    from l2c.validate import validate
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    failed = 0
    for text, (m, n, k) in pairs:
        try:
            spec = parse_one(text)
            kernel = build(validate(spec, "triton", "sm_90"))
            dt = {"f16": torch.float16, "bf16": torch.bfloat16}[spec.types_a]
            a = torch.empty(m, k, device=dev, dtype=dt).normal_()
            w = torch.empty(n, k, device=dev, dtype=dt).normal_()
            kernel(a, w.t())
            kernel(a, w.t())
        except Exception:  # noqa: BLE001 - the measuring process records the failure
            failed += 1
    if dev == "cuda":
        torch.cuda.synchronize()
    return failed


def sweep(shapes, dtype, pools, out_path, device, budget_s, workers, log):
    import l2c.verify
    from l2c.bench import Candidate, ResultsWriter, Settings, environment, run_bench
    # every check against the float32 GPU reference: a float64 CPU one would copy each weight to the host
    l2c.verify.GPU_REFERENCE_MACS = 0
    from l2c.parser import parse_one
    from l2c.validate import validate
    specs = sorted({t for s in shapes for t in pools[s.key]})
    pairs = [(t, (s.m, s.n, s.k)) for s in shapes for t in pools[s.key]]
    t0 = time.monotonic()
    if workers > 1:
        chunks = [pairs[i::workers] for i in range(workers)]
        with mp.get_context("spawn").Pool(workers) as pool:
            failed = sum(pool.map(_warm, chunks))
    else:
        failed = _warm(pairs)
    print(f"serve_sweep {dtype}: warmed {len(pairs)} (spec, shape) pairs of {len(specs)} specs in "
          f"{time.monotonic() - t0:.0f} s ({failed} failed)", file=log, flush=True)
    cands = {}
    for text in specs:
        spec = parse_one(text)
        cands[text] = Candidate(id=f"serve_sweep:{spec.name}", source="scripts/serve_sweep.py", target="triton",
                                spec=spec, valid=validate(spec, "triton", "sm_90"))
    jobs = {s.key: [cands[t] for t in pools[s.key]] for s in shapes}
    settings = Settings(["kernel"], reps=7, warmup=2, roofline=True)
    writer = ResultsWriter(Path(out_path), resume=True)
    from l2c.measure import measure_ceilings
    ceilings = measure_ceilings(device)
    env = environment(device, ["kernel"], " ".join(sys.argv), settings.as_dict())
    env["ceilings"] = ceilings.as_row() if ceilings else None
    writer.write(env)
    written = 0
    deadline = time.monotonic() + budget_s
    for s in shapes:
        if time.monotonic() > deadline:
            print(f"serve_sweep {dtype}: budget spent; {s} and later shapes not measured", file=log)
            break
        written += run_bench(list(cands.values()), [s], jobs, device, settings, writer, ceilings=ceilings)
    writer.close()
    return written


def best_specs(path, top: int):
    """shape key -> the `top` best verified spec texts of a sweep file, by speedup."""
    from l2c.bench import read_rows
    by_shape = {}
    for r in read_rows(path):
        if r.get("type") == "result" and r.get("status") == "ok":
            by_shape.setdefault((r["m"], r["n"], r["k"], 1), []).append((r["speedup"], r["name"]))
    return {key: [name for _, name in sorted(rows, reverse=True)[:top]] for key, rows in by_shape.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--max-m", type=int, default=128)
    ap.add_argument("--budget-s", type=float, default=420.0, help="measuring time per dtype")
    ap.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 1))
    ap.add_argument("--shapes", default="serve")
    args = ap.parse_args()
    import torch
    from l2c.measure import get_device
    from l2c.shapes import load_shapes
    device = get_device("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shapes = [s for s in load_shapes(args.shapes) if s.m <= args.max_m]
    shapes.sort(key=lambda s: (s.m, s.n * s.k))
    dtypes = args.dtypes.split(",")
    device.warm_up(3.0)
    names = {}
    for i, dtype in enumerate(dtypes):
        if i == 0:
            pools = {s.key: candidates_for(s, dtype) for s in shapes}
        else:
            pools = {s.key: [t.replace(f"a={dtypes[0]} b={dtypes[0]} c={dtypes[0]}", f"a={dtype} b={dtype} c={dtype}")
                             for t in (names.get(s.key) or [])] for s in shapes}
            pools = {key: [_rename(t) for t in texts] for key, texts in pools.items()}
        path = out / f"serve_sweep_{dtype}.jsonl"
        written = sweep(shapes, dtype, pools, path, device, args.budget_s, args.workers, sys.stderr)
        print(f"serve_sweep {dtype}: {written} rows in {path}", file=sys.stderr, flush=True)
        if i == 0:
            texts = {json.loads(json.dumps(t)) for p in pools.values() for t in p}
            by_name = {t.split()[1]: t for t in texts}
            names = {key: [by_name[n] for n in top if n in by_name] for key, top in best_specs(path, 3).items()}
    return 0


def _rename(text: str) -> str:
    from l2c.ir import config_name
    from l2c.parser import parse_one
    spec = parse_one(text)
    return spec.replace(name=config_name(spec)).to_l2()


if __name__ == "__main__":
    sys.exit(main())
