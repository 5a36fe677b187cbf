#!/usr/bin/env python
"""One call each of a few row-major gemv ring configurations and of torch.matmul at wide-N `a @ b` shapes, between
cudaProfilerStart and cudaProfilerStop, named by NVTX ranges: what Nsight Compute profiles to see how a ring grid
sits on the GPU (clusters that fit at once, waves, SM busy time, DRAM rate) beside cuBLAS's kernel (GPU). Run under
Nsight Compute by `python scripts/gpu.py widegemv_fit` (its second command holds the ncu flags).

Nsight Compute flushes the caches before each profiled kernel (cold weights) and locks the clocks, so its durations
are not the bench's; compare kernels within one profile. benchmarks/results/s42/ncu_ring_h100.txt.xz is its profile
on an H100.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# (tile m, tile n, tile k, slices): the two 8-slice configurations the H100's points phase kept at M = 1-2, a 4-slice
# one with one block per SM, and one without a cluster.
CONFIGS = [(1, 128, 64, 8), (2, 128, 64, 8), (2, 256, 64, 4), (2, 256, 64, 1)]
SHAPES = [(1, 8192, 4096), (2, 8192, 4096), (2, 14336, 4096)]


def main() -> None:
    import torch
    from l2c.errors import BuildError
    from l2c.parser import parse_one
    from l2c.targets.cutlass.build import build_many
    from l2c.validate import validate
    from widegemv_sweep import ring_texts
    valids = [validate(parse_one(ring_texts("f16", *config)[0]), "cutlass") for config in CONFIGS]
    kernels = build_many(valids, workers=len(valids))
    work = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.half)
        b = torch.randn(k, n, device="cuda", dtype=torch.half)
        for valid, kernel in zip(valids, kernels):
            if isinstance(kernel, BuildError):
                print(f"{valid.name}: build failed: {kernel}", file=sys.stderr)
            elif valid.spec.tile_m >= m:
                work.append((f"{valid.name} {m}x{n}x{k}", lambda kernel=kernel, a=a, b=b: kernel(a, b)))
        work.append((f"torch {m}x{n}x{k}", lambda a=a, b=b: a @ b))
    for _, call in work:   # first-use costs (module loads, the ring's shared-memory opt-in) outside the profile
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for name, call in work:
        torch.cuda.nvtx.range_push(name)
        call()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print("\n".join(name for name, _ in work))


if __name__ == "__main__":
    main()
