#!/usr/bin/env python
"""Wide-column gemv kernels (B row-major, 64-256 columns per block) against cuBLAS at M <= 8 in `a @ b`, through
l2c.matmul (`l2c bench serving:`), in two phases per dtype (f16's first) within one time budget:

    python scripts/widegemv_sweep.py --out DIR [--dtypes f16,bf16] [--budget-s 420]
    python scripts/widegemv_sweep.py --out DIR --fit benchmarks/widegemv_fit.txt --dtypes f16   # every ring depth
    python scripts/widegemv_sweep.py --out DIR --from-fit FIT.jsonl --dtypes f16   # the fit's best at the points

1. sample: every configuration of its tile m class (tile m = M rounded up to a power of two) at the 64 `points`
   shapes of benchmarks/widegemv_sample.txt, `kernel` and `call` (DIR/widegemv_sample_DTYPE.jsonl);
2. points: per class, the configurations that qualified at most sample shapes (no slower than torch in either
   protocol, 1.03x in one: what `l2c table --protocol kernel,call --min-speedup 1.03` admits), at the other `points`
   shapes of that class (DIR/widegemv_points_DTYPE.jsonl): evidence for neighbourhood cells
   (`l2c table ... --near`) where the points online choice measured found no kernel.

With --fit SHAPES the two phases are replaced by one: every CUDA-core configuration at every ring depth that fits
(not only the deepest), each at the SHAPES whose tile m class is its own, `kernel` protocol
(DIR/widegemv_fit_DTYPE.jsonl). A deeper ring takes more shared memory, so fewer blocks share an SM and fewer
clusters of K slices fit on the GPU at once; whether a grid's clusters fit one wave decided the ring's wide-N speed
on an H100 (benchmarks/NOTES.md, "The gemv families").

With --from-fit FIT (a --fit results file) the sample is skipped: per tile m class the KEEP configurations (any ring
depth) with the highest geomean `kernel` speedup over FIT's shapes go to the points phase, which covers only the
classes FIT measured.

Session 24 swept this family only with 8-16 columns per block (16-32 bytes of each B row per load), which lost (0.3-0.6x
in `kernel`); session 35's 64-256 columns with the loads straight into registers lost too (0.17-0.29 on CUDA cores:
ptxas issues each of a step's loads just before its first use, so a thread waits on several memory round trips per
step). The CUDA-core configurations here stream a thread's loads through its shared-memory ring (`pipeline stages`), the
most stages of 4, 3 and 2 that fit. Every kernel is built first, in parallel (`l2c build`); a bench cut by the budget
keeps the rows it finished (a later run with the same DIR continues them). The generated spec files are written to DIR.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from l2c.shapes import load_shapes, read_shape_file  # noqa: E402

SAMPLE = ROOT / "benchmarks" / "widegemv_sample.txt"
CUDA_TILES = ((256, 64), (256, 32), (128, 64))   # (tile n, tile k): 256 or 128 threads, 8 columns x 8 K rows each
RING_STAGES = (4, 3, 2)                          # the ring's depth: the first that fits the block's shared memory
TENSOR_TILES = ((128, 32), (256, 32))            # tile m 8 on tensor cores (64-column warp tiles)
SLICES = (1, 4)
CUDA_SLICES = (1, 2, 4, 8)
KEEP = 2   # configurations per tile m class timed at the points


def spec_text(dtype: str, m: int, n: int, k: int, slices: int, cores: str, stages: str = "auto") -> str:
    ring = "" if stages == "auto" else f"_p{stages}"
    name = f"widegemv_{cores}_{m}x{n}x{k}_s{slices}{ring}"
    return (f"kernel {name} {{\n  target   cutlass\n  problem  m=any n=any k=any batch=1\n"
            f"  types    a={dtype} b={dtype} c={dtype} acc=f32\n  layout   a=row b=row c=row\n"
            f"  tile     m={m} n={n} k={k}\n  pipeline stages={stages}\n"
            f"  launch   family=gemv evict=first cores={cores}\n"
            f"  split_k  slices={slices} mode=workspace\n}}\n")


def ring_texts(dtype: str, m: int, n: int, k: int, slices: int) -> List[str]:
    """The CUDA-core configuration at each ring depth of RING_STAGES that validates, deepest first."""
    from l2c.errors import L2ValidationError
    from l2c.parser import parse_one
    from l2c.validate import validate
    out = []
    for stages in RING_STAGES:
        text = spec_text(dtype, m, n, k, slices, "cuda", str(stages))
        try:
            validate(parse_one(text), "cutlass")
            out.append(text)
        except L2ValidationError:
            continue
    return out


def configurations(dtype: str, every_depth: bool = False) -> Dict[int, Dict[str, str]]:
    """tile m -> {kernel name: spec text}: each CUDA-core tile and slice count with its deepest ring (every depth
    that fits with `every_depth`), plus the tensor-core tiles at tile m 8."""
    out: Dict[int, Dict[str, str]] = {}
    for m in (1, 2, 4, 8):
        texts = [t for n, k in CUDA_TILES for s in CUDA_SLICES
                 for t in ring_texts(dtype, m, n, k, s)[:None if every_depth else 1]]
        if m == 8:
            texts += [spec_text(dtype, m, n, k, s, "tensor") for n, k in TENSOR_TILES for s in SLICES]
        out[m] = {t.split()[1]: t for t in texts}
    return out


def tile_m_class(m: int) -> int:
    return 1 << max(0, (m - 1).bit_length())


def qualified(path: Path) -> Dict[str, int]:
    """Kernel name -> shapes of the results file where it was no slower than torch in either protocol and 1.03x
    faster in one."""
    worst: Dict[Tuple[str, Tuple[int, int, int]], Dict[str, float]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("type") != "result" or r.get("status") != "ok" or r.get("speedup") is None:
                continue
            slot = worst.setdefault((r.get("served_by", "torch"), (r["m"], r["n"], r["k"])), {})
            slot[r["protocol"]] = min(slot.get(r["protocol"], math.inf), r["speedup"])
    wins: Dict[str, int] = {}
    for (name, _), s in worst.items():
        won = len(s) == 2 and min(s.values()) >= 1.0 and max(s.values()) >= 1.03
        wins[name] = wins.get(name, 0) + int(won)
    return wins


def ranked_by_fit(path: Path, keep: int = KEEP) -> Dict[int, List[str]]:
    """tile m class -> the `keep` kernel names with the highest geomean `kernel` speedup over the shapes of a --fit
    results file (.jsonl or .jsonl.xz) where they ran (a configuration missing at some shape of its class is left
    out)."""
    logs: Dict[str, List[float]] = {}
    shapes: Dict[int, set] = {}
    classes: Dict[str, int] = {}
    from l2c.results_file import read_rows
    for r in read_rows(path):
        if r.get("type") != "result" or r.get("status") != "ok" or r.get("speedup") is None:
            continue
        name, m = r["served_by"], tile_m_class(r["m"])
        logs.setdefault(name, []).append(math.log(r["speedup"]))
        shapes.setdefault(m, set()).add((r["m"], r["n"], r["k"]))
        classes[name] = m
    out: Dict[int, List[str]] = {}
    for m in sorted(shapes):
        full = [n for n, c in classes.items() if c == m and len(logs[n]) == len(shapes[m])]
        out[m] = sorted(full, key=lambda n: -sum(logs[n]) / len(logs[n]))[:keep]
    return out


def bench(specs: Dict[str, str], shapes, out: Path, work: Path, label: str, deadline: float,
          protocol: str = "kernel,call") -> None:
    """`l2c bench serving:` of `specs` at `shapes`, appended to `out` (--resume), stopped at the deadline."""
    left = deadline - time.monotonic()
    if not shapes or not specs or left < 10:
        return
    spec_file, shape_file = work / f"{label}.l2", work / f"{label}.txt"
    spec_file.write_text("\n".join(specs.values()))
    shape_file.write_text("".join(f"{s.m} {s.n} {s.k}\n" for s in shapes))
    command = [sys.executable, "-m", "l2c", "bench", f"serving:{spec_file}", "--shapes", str(shape_file),
               "--dtype", label.split("_")[1], "--protocol", protocol, "--reps", "3", "--iters", "10",
               "--warmup-seconds", "1", "-o", str(out), "--resume"]
    print(" ".join(command), flush=True)
    try:
        subprocess.run(command, timeout=left, check=False)
    except subprocess.TimeoutExpired:
        print(f"widegemv_sweep: {label} stopped at the budget", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--dtypes", default="f16,bf16")
    p.add_argument("--budget-s", type=float, default=420.0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 8)
    p.add_argument("--fit", default=None, help="a shape file ('M N K' per line): time every ring depth there instead "
                                               "of the sample and points phases")
    p.add_argument("--from-fit", default=None, help="a --fit results file: its best configurations per tile m "
                                                    "class (any ring depth) go straight to the points phase")
    a = p.parse_args()
    from l2c.targets.cutlass.toolchain import missing_headers
    missing = missing_headers()
    if missing:   # every configuration is a CUTLASS-target kernel built here
        sys.exit(f"widegemv_sweep: {missing}")
    start = time.monotonic()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="widegemv_"))   # per-class spec and shape files
    dtypes = [d for d in a.dtypes.split(",") if d]
    from_fit = ranked_by_fit(Path(a.from_fit)) if a.from_fit else None
    configs = {dtype: configurations(dtype, every_depth=a.fit is not None or from_fit is not None)
               for dtype in dtypes}
    if from_fit is not None:   # the fit's names are f16's; the same configuration in another dtype keeps its name
        configs = {dtype: {m: {n: t for n, t in by_m.items() if n in from_fit.get(m, [])} for m, by_m in
                           configs[dtype].items() if from_fit.get(m)} for dtype in dtypes}
    fit_shapes = read_shape_file(a.fit) if a.fit is not None else []
    if fit_shapes:   # only the tile m classes the shapes need are built
        classes = {tile_m_class(s.m) for s in fit_shapes}
        configs = {dtype: {m: c for m, c in by_m.items() if m in classes} for dtype, by_m in configs.items()}
    spec_files = []
    for dtype in dtypes:
        path = out / f"widegemv_specs_{dtype}.l2"
        path.write_text("\n".join(t for by_m in configs[dtype].values() for t in by_m.values()))
        spec_files.append(str(path))
    subprocess.run([sys.executable, "-m", "l2c", "build", *spec_files, "--target", "cutlass", "-j", str(a.jobs)],
                   check=False)
    if a.fit is not None:
        for i, dtype in enumerate(dtypes):
            deadline = start + a.budget_s * (i + 1) / len(dtypes)
            for m, specs in configs[dtype].items():
                bench(specs, [s for s in fit_shapes if tile_m_class(s.m) == m], out / f"widegemv_fit_{dtype}.jsonl",
                      work, f"fit_{dtype}_m{m}", deadline, protocol="kernel")
        return
    sample = [] if from_fit is not None else read_shape_file(SAMPLE)   # the fit has ranked the configurations
    sampled = {s.key for s in sample}
    points = [s for s in load_shapes("points") if s.m <= 8 and s.key not in sampled]
    for i, dtype in enumerate(dtypes):   # each dtype its share of the budget, the sample then the points
        deadline = start + a.budget_s * (i + 1) / len(dtypes)
        for m, specs in configs[dtype].items():
            bench(specs, [s for s in sample if tile_m_class(s.m) == m], out / f"widegemv_sample_{dtype}.jsonl", work,
                  f"sample_{dtype}_m{m}", deadline)
        wins = qualified(out / f"widegemv_sample_{dtype}.jsonl")
        for m, specs in configs[dtype].items():
            if from_fit is not None:
                ranked = list(specs)   # configs holds only the fit's choice for this class
            else:
                ranked = sorted((n for n in specs if wins.get(n, 0) > 0), key=lambda n: -wins[n])[:KEEP]
            print(f"widegemv_sweep: {dtype} tile m {m}: {[(n, wins.get(n, 0)) for n in ranked]} to the points",
                  flush=True)
            bench({n: specs[n] for n in ranked}, [s for s in points if tile_m_class(s.m) == m],
                  out / f"widegemv_points_{dtype}.jsonl", work, f"points_{dtype}_m{m}", deadline)


if __name__ == "__main__":
    main()
